"""What one load may decode and has decoded (:class:`LoadState`), and how a decoder finds the state of the load
that calls it: set by our loaders (``_load``), one per plain ``torch.load`` call (found on the stack, see
``_compat.torch``: its file named in errors, its size the base of the bound), or one per record where neither is
known."""

from __future__ import annotations

import contextvars
import io
import math
import os
import stat
import weakref

import torch

from lightning_nvcomp._compat import torch as _torch_compat
from lightning_nvcomp.errors import DecodeLimitError

#: Default bound on what one load decodes: this multiple of the file's size plus :data:`DECODE_ALLOWANCE` bytes.
#: Real checkpoints compress 1.2-1.6x; only constant data (zeros) compresses more, and the allowance covers some.
DECODE_MULTIPLE = 16


DECODE_ALLOWANCE = 256 << 20


#: Environment variable that sets the bound in bytes for every load of the process (``unlimited``: none).
DECODE_LIMIT_ENV = "LIGHTNING_NVCOMP_MAX_DECODED_BYTES"


def _env_limit() -> float | None:
    """The bound set by :data:`DECODE_LIMIT_ENV`: bytes, ``math.inf`` for unlimited, None when it is not set."""
    value = os.environ.get(DECODE_LIMIT_ENV, "").strip()
    if not value:
        return None
    if value.lower() in ("unlimited", "none", "inf"):
        return math.inf
    try:
        return int(float(value))
    except ValueError:
        raise ValueError(f"{DECODE_LIMIT_ENV}={value!r} is not a number of bytes or 'unlimited'") from None


class LoadState:
    """What one load has decoded: the bound on decoded bytes, decoded records (copies of one record decode once)
    and the storages handed out (every other storage in the result came from the file as it is).

    Args:
        name: how errors name the file.
        limit: the most bytes this load may decode: a number of bytes, ``math.inf`` for no bound, or None (the
            default) for :data:`DECODE_LIMIT_ENV` if set, else :data:`DECODE_MULTIPLE` x the file's size +
            :data:`DECODE_ALLOWANCE`. With ``file_nbytes`` unknown, the bytes of the distinct storages that blobs
            were read from so far stand in for the file's size.

    Raises:
        ValueError: a ``limit`` that is not a number of bytes, 0 or more.
        file_nbytes: the size of the file being loaded, when known.
    """

    def __init__(self, name: str = "", limit: float | None = None, file_nbytes: int | None = None) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 0):
            raise ValueError(
                f"max_decoded_nbytes must be a number of bytes (0 or more), math.inf for no bound, or None for the "
                f"default bound; not {limit!r}"
            )
        self.name, self.file_nbytes = name, file_nbytes
        self.limit = limit if limit is not None else _env_limit()
        self.decoded = self.compressed = 0
        self.cache: dict[tuple, list[torch.Tensor]] = {}
        self.records: dict[int, tuple[dict, list, dict]] = {}  # id -> (the dict, its blobs' keys, validated copy)
        self.produced: set[int] = set()
        self._seen: set[tuple] = set()

    def where(self, tensor: str) -> str:
        """How an error names a tensor of this load: ``step-1.ckpt: tensor 'layer.weight'``."""
        return f"{self.name}: tensor {tensor!r}" if self.name else f"tensor {tensor!r}"

    def bound(self) -> float:
        if self.limit is not None:
            return self.limit
        base = self.file_nbytes if self.file_nbytes is not None else self.compressed
        return DECODE_MULTIPLE * base + DECODE_ALLOWANCE

    def charge(self, blobs: list[torch.Tensor], nbytes: int, name: str) -> None:
        """Count a record about to be decoded; raise DecodeLimitError if the load would exceed its bound."""
        if self.file_nbytes is None:
            # Count the storages blobs lie in, each once: views of one storage (several tensors' blobs, or views
            # crafted to overlap) add nothing.
            for b in blobs:
                storage = b.untyped_storage()
                seen = (storage.device, storage.data_ptr(), storage.nbytes())
                if seen not in self._seen:
                    self._seen.add(seen)
                    self.compressed += storage.nbytes()
        bound = self.bound()
        if self.decoded + nbytes > bound:
            base = (
                f"the file's {self.file_nbytes} bytes"
                if self.file_nbytes is not None
                else f"the {self.compressed} stored bytes read so far"
            )
            rule = (
                f"{self.limit} bytes"
                if self.limit is not None
                else f"{DECODE_MULTIPLE} x {base} + {DECODE_ALLOWANCE >> 20} MiB"
            )
            raise DecodeLimitError(
                f"{self.where(name)}: decoding it would bring this load to "
                f"{self.decoded + nbytes} bytes, over its limit of {bound} ({rule}), which guards against "
                "decompression bombs. If you trust the file, raise the limit: lightning_nvcomp.load(..., "
                f"max_decoded_nbytes=N, or math.inf for no bound) or the environment variable {DECODE_LIMIT_ENV}=N "
                "(bytes, or 'unlimited')"
            )
        self.decoded += nbytes


#: The state of the load running in this context (our loaders set it; see :func:`_load_state`).
_load: contextvars.ContextVar[LoadState | None] = contextvars.ContextVar("load", default=None)


#: States of plain torch.load calls, by their unpickler (freed with it, when the load ends).
_torch_loads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: Without a known load (torch changed), records are cached by their first blob, and bounded one by one: by the
#: blob's id, dropped when the blob is (tensors compare elementwise, so they cannot be weak dictionary keys).
_orphans: dict[int, LoadState] = {}


def _load_state(blobs: object) -> LoadState:
    """The state of the load that calls the decoder (``blobs``: its first argument, as given)."""
    state = _load.get()
    if state is not None:
        return state
    found = _torch_compat.current_torch_load()
    if found is not None:
        try:
            state = _torch_loads.get(found.unpickler)
            if state is None:
                state = _torch_loads[found.unpickler] = LoadState(_source_name(found), file_nbytes=_source_size(found))
            return state
        except TypeError:  # not weak-referenceable: treat as unknown
            pass
    if not isinstance(blobs, list) or not blobs or not isinstance(blobs[0], torch.Tensor):
        return LoadState()
    key = id(blobs[0])
    if key not in _orphans:
        _orphans[key] = LoadState()
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
