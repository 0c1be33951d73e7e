"""What the decoders know of the load that calls them (:class:`LoadContext`), beyond the arguments pickled in the file:
``torch.load`` calls :func:`~lightning_nvcomp.format.decode.decode_tensor` with those alone.

One object per load. Our loaders make it and set it for the ``torch.load`` (or unpickling) they run, in one place
(:func:`loading`); :func:`decode_progress` sets the settings of a block of loads the same way. A plain
``torch.load`` gets a fresh one (:func:`context_of`): its load is found on the stack (``_compat.torch``: no argument
can say which ``torch.load`` a pickled call belongs to), so its file is named in errors and its size is the base of
its bound; where even that is not known, each record is a load of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import io
import os
import stat
import weakref
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from lightning_nvcomp._compat import torch as _torch_compat
from lightning_nvcomp.format.load_state import LoadState


class TensorInfo(NamedTuple):
    """What :func:`~lightning_nvcomp.format.reader.describe` returns in place of each compressed tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    record: dict
    stored_nbytes: int

    # A tensor with Python attributes is pickled as torch's ``_rebuild_from_type_v2(decode_tensor, type, args,
    # attributes)``, which calls these on what decode_tensor returned: its description stands for it as it is.
    def as_subclass(self, cls: type) -> TensorInfo:
        return self

    def __setstate__(self, state: object) -> None:
        pass


@dataclasses.dataclass
class Describing:
    """What :func:`~lightning_nvcomp.format.reader.describe` asks of the decoders while it loads a file: decode
    nothing (a :class:`TensorInfo` stands for each compressed tensor, an empty meta storage for each other storage), or
    (``decode``) decode as a load does and note each compressed tensor's TensorInfo in ``infos``."""

    decode: bool = False
    infos: list[TensorInfo] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class LoadContext:
    """What the decoders of one load know beyond their arguments.

    Attributes:
        state: the load's bound and what it has decoded; None for the settings of a block of loads
            (:func:`decode_progress`), each of which makes its own.
        keep_on_gpu: records saved from a GPU decode onto the current GPU (when there is one), whatever the blobs'
            device.
        progress: called with the raw size of every record decoded (progress bars).
        describing: the decoders describe instead of decoding, or while they decode (:class:`Describing`).
        device: where the compressed tensors go, when the reader kept their blobs in host memory (a load onto one
            GPU: the compressed bytes are copied there a segment at a time, not all at once); None: the blobs' device.
    """

    state: LoadState | None = None
    keep_on_gpu: bool = False
    progress: Callable[[int], None] | None = None
    describing: Describing | None = None
    device: torch.device | None = None

    def decoded(self, nbytes: int) -> None:
        """A record of ``nbytes`` raw bytes was decoded."""
        if self.progress is not None:
            self.progress(nbytes)


#: The context set for this thread or task, by :func:`loading` alone.
_set: contextvars.ContextVar[LoadContext | None] = contextvars.ContextVar("lightning_nvcomp_load", default=None)


def active() -> LoadContext | None:
    """The context :func:`loading` set for the code running now (None outside every loading block)."""
    return _set.get()


def new_load(
    state: LoadState | None = None,
    *,
    keep_on_gpu: bool = False,
    progress: Callable[[int], None] | None = None,
    describing: Describing | None = None,
) -> LoadContext:
    """The context of a load that begins now (see :class:`LoadContext`), reporting its progress to ``progress``, else
    to the callback of the :func:`decode_progress` block it runs in."""
    block = active()
    return LoadContext(state, keep_on_gpu, progress or (block.progress if block else None), describing)


@contextlib.contextmanager
def loading(context: LoadContext) -> Iterator[LoadContext]:
    """Within the block, the decoders run in ``context`` (the only place it is set)."""
    token = _set.set(context)
    try:
        yield context
    finally:
        _set.reset(token)


def decode_progress(callback: Callable[[int], None]) -> contextlib.AbstractContextManager[LoadContext]:
    """Within this block, every record decoded calls ``callback(raw_nbytes)`` (progress bars): in the loads of
    :func:`~lightning_nvcomp.format.reader.load` and of plain ``torch.load`` alike."""
    return loading(new_load(progress=callback))


#: Contexts of plain torch.load calls, by their unpickler (freed with it, when the load ends).
_torch_loads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: Without a known load (torch changed), records are cached by their first blob, and bounded one by one: by the
#: blob's id, dropped when the blob is (tensors compare elementwise, so they cannot be weak dictionary keys).
_orphans: dict[int, LoadContext] = {}


def context_of(blobs: object) -> LoadContext:
    """The context of the load that calls a decoder (``blobs``: its first argument, as given): the one our loader
    set; for a plain ``torch.load``, one of its own, made at its first decoder call."""
    current = active()
    if current is not None and current.state is not None:
        return current
    fresh = new_load()
    found = _torch_compat.current_torch_load()
    if found is not None:
        try:
            context = _torch_loads.get(found.unpickler)
            if context is None:
                state = LoadState(_source_name(found), file_nbytes=_source_size(found))
                context = _torch_loads[found.unpickler] = dataclasses.replace(fresh, state=state)
            return context
        except TypeError:  # not weak-referenceable: treat as unknown
            pass
    if not isinstance(blobs, list) or not blobs or not isinstance(blobs[0], torch.Tensor):
        return dataclasses.replace(fresh, state=LoadState())
    key = id(blobs[0])
    if key not in _orphans:
        _orphans[key] = dataclasses.replace(fresh, state=LoadState())
        weakref.finalize(blobs[0], _orphans.pop, key, None)
    return _orphans[key]


def _source_name(load: _torch_compat.TorchLoad) -> str:
    """How errors name the file a plain ``torch.load`` reads: its absolute path, its URL (an fsspec file), or what
    kind of file object it is."""
    for source in (load.source, load.opened):
        if isinstance(source, (str, os.PathLike)):
            return os.path.abspath(os.fspath(source))
        for attribute in ("full_name", "name", "path"):  # fsspec files have full_name (a URL), files a name
            value = getattr(source, attribute, None)
            if isinstance(value, str) and value:
                return value if "://" in value else os.path.abspath(value)
    if load.source is None:
        return "the file torch.load is reading"
    return f"the {type(load.source).__name__} torch.load is reading"


def _source_size(load: _torch_compat.TorchLoad) -> int | None:
    """The size of the file a plain ``torch.load`` reads (None if unknown): the base of its decode bound."""
    f = load.opened
    if f is None:
        return None
    try:
        status = os.fstat(f.fileno())  # type: ignore[attr-defined]
        if stat.S_ISREG(status.st_mode):
            return status.st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:  # torch's reader seeks before every read of a file object: moving its position changes nothing
        position = f.tell()  # type: ignore[attr-defined]
        size = f.seek(0, os.SEEK_END)  # type: ignore[attr-defined]
        f.seek(position)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return size if isinstance(size, int) else None
