"""Reading a checkpoint file: opened once, its zip structure and small entries checked (:mod:`.zip_checks`),
``torch.load`` in the load's context (its decode bound, :mod:`.load_context`), the storages of a plain ``torch.save``
file checked by their zip CRC-32s (:func:`load`); and :func:`describe`, which loads a file's structure alone."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
import warnings
from typing import Any, BinaryIO, NoReturn

import torch

from lightning_nvcomp._process import collector_paused
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, RefusedObjectsError
from lightning_nvcomp.format.contents import find_contents
from lightning_nvcomp.format.load_context import Describing, LoadContext, TensorInfo, loading, new_load
from lightning_nvcomp.format.load_state import LoadState
from lightning_nvcomp.format.zip_checks import OUR_DECODERS, check_data_crcs, check_structure
from lightning_nvcomp.storage import StorageBackend, storage_for


def load(
    path: str | os.PathLike,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool | None = None,
    keep_on_gpu: bool = False,
    max_decoded_nbytes: float | None = None,
    storage: StorageBackend | None = None,
) -> Any:
    """Load a checkpoint written by :func:`save` (or any ``torch.save`` file), bit-exactly and verified.

    The file is opened once: a local load reads the file that was at ``path`` when it began, whatever replaces it
    meanwhile. At a URL, its byte ranges are read in parallel, ahead of the decoder; an object replaced while it is
    read fails the load (its checksums, or its size), never with wrong tensors. Every tensor is checked before it is returned (our records by their CRC-32s and checks, the storages
    of a plain ``torch.save`` file by the zip's CRC-32s), and so is the pickle. Returned tensors are in memory of
    their own, never pages of the file, unless ``mmap=True``: then tensors stored by plain ``torch.save`` share the
    file's pages, copy-on-write, as with ``torch.load(mmap=True)``. Compressed bytes go from the page cache to the
    decoder either way.

    Args:
        path: the checkpoint: a local path or a URL (``s3://bucket/run/last.ckpt``).
        map_location: as ``torch.load``'s; ``"cuda"`` decodes on the GPU directly. Default: the CPU.
        weights_only: as ``torch.load``'s.
        mmap: True maps plain tensors from the file (see above); None or False: they are copied.
        keep_on_gpu: with no ``map_location``, compressed tensors saved from a GPU come back on the current GPU
            when there is one, decoded there (what a resume wants: the optimizer adopts them as they are).
        max_decoded_nbytes: the most bytes the load may decode, a guard against decompression bombs
            (:class:`DecodeLimitError`): a number of bytes, or ``math.inf`` for no bound. None (the default): the
            environment variable ``LIGHTNING_NVCOMP_MAX_DECODED_BYTES`` (bytes, or ``unlimited``) if set, else 16 x
            the file's size + 256 MiB.
        storage: where ``path`` is read from (default: :func:`~lightning_nvcomp.storage.backend.storage_for` the path).

    Raises:
        CorruptCheckpointError: the file is damaged (the message names it and the tensor at fault).
        CodecUnavailableError: a codec it needs cannot run here (gANS without a GPU).
        CheckpointError: anything else about the file (not a checkpoint, refused by ``weights_only``, too large
            to decode). Errors of the machine (memory, devices, threads) pass through, the file named.

    On the main thread, Python's garbage collector is paused while the file is read (see
    :func:`~lightning_nvcomp._process.collector_paused`).
    """
    if max_decoded_nbytes is False:  # the default's old spelling (None meant no bound then)
        warnings.warn(
            "load(max_decoded_nbytes=False) is deprecated: leave it out (None) for the default bound",
            DeprecationWarning,
            stacklevel=2,
        )
        max_decoded_nbytes = None
    return _load(
        path,
        storage,
        new_load(keep_on_gpu=keep_on_gpu and map_location is None),
        map_location,
        weights_only,
        mmap,
        max_decoded_nbytes,
    )


def _load(
    path: str | os.PathLike,
    storage: StorageBackend | None,
    context: LoadContext,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool | None = None,
    max_decoded_nbytes: float | None = None,
) -> Any:
    """:func:`load` in ``context`` (see :func:`read`)."""
    storage = storage or storage_for(path)
    path = os.fspath(path)
    if storage.isdir(path):
        raise IsADirectoryError(f"checkpoint {path} is a directory, not a checkpoint file")
    if not storage.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    with collector_paused(), storage.open_read(path) as f:
        return read(f, path, map_location, weights_only, mmap, max_decoded_nbytes, context)


_TORCH_ZIP_ERRORS = ("PytorchStreamReader", "inline_container")


def _fd_path(f: BinaryIO) -> str | None:
    """A path that opens the very file ``f`` has open (Linux), for torch.load(mmap=True), which wants a path."""
    try:
        fd_path = f"/proc/self/fd/{f.fileno()}"
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    return fd_path if os.path.exists(fd_path) else None


def read(
    source: BinaryIO,
    name: str,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool | None = None,
    max_decoded_nbytes: float | None = None,
    context: LoadContext | None = None,
) -> Any:
    """``torch.load`` of a seekable binary file, verified: the zip's structure and the CRC-32 of every small entry
    (the pickle among them) first, every record's checks while decoding, and the zip CRC-32s of the storages of a
    plain ``torch.save`` file after. Every failure is named after ``name``; :class:`CorruptCheckpointError` means
    damage and nothing else. See :func:`load` for the arguments; ``context``: the load's
    (:class:`~lightning_nvcomp.format.load_context.LoadContext`; default: a new load in the current block), whose state,
    where set, may be shared by several files read as one load (the items of a DCP checkpoint: one decode bound for
    all of them)."""
    source.seek(0, os.SEEK_END)
    file_nbytes = source.tell()
    source.seek(0)
    pickle_bytes = check_structure(source, name, file_nbytes)
    ours = pickle_bytes is not None and any(d in pickle_bytes for d in OUR_DECODERS)
    state = (context and context.state) or LoadState(name, max_decoded_nbytes, file_nbytes)
    # Onto one GPU, our blobs stay in host memory and each record's go to the GPU as it is decoded: torch.load would
    # copy every blob there first (the whole compressed file on the GPU beside the state).
    device = _one_device(map_location) if ours else None
    context = dataclasses.replace(context or new_load(), state=state, device=device)
    # Map the file only where no returned tensor can share its pages: ours decode into new memory.
    fd_path = _fd_path(source) if pickle_bytes is not None and (mmap or (mmap is None and ours)) else None
    try:
        with loading(context):
            obj = torch.load(
                fd_path or source,
                map_location="cpu" if device is not None else map_location,
                weights_only=weights_only,
                mmap=fd_path is not None,
            )
            foreign = context.describing is None and _foreign_storages(obj, state.produced)
            if foreign and pickle_bytes is not None:
                check_data_crcs(source, name, obj)
                if device is not None or (fd_path is not None and not mmap):
                    # a file of ours with plain storages in it (v0.1): load them copied, where they were asked for
                    source.seek(0)
                    obj = torch.load(source, map_location=map_location, weights_only=weights_only)
        return obj
    except Exception as err:
        _raise_load_error(err, name, pickle_bytes)


def _one_device(map_location: Any) -> torch.device | None:
    """The GPU a ``map_location`` sends every storage to, or None (the CPU, a mapping, a function)."""
    if isinstance(map_location, (str, torch.device)):
        try:
            device = torch.device(map_location)
        except RuntimeError:
            return None
        return device if device.type == "cuda" else None
    return None


def _raise_load_error(err: Exception, name: str, pickle_bytes: bytes | None) -> NoReturn:
    """Raise what a failed ``torch.load`` of ``name`` means (``pickle_bytes``: its checked pickle; None: a legacy
    file): damage as :class:`CorruptCheckpointError`, a refused object as :class:`RefusedObjectsError`, an error of
    the machine as it is; each naming the file."""
    if isinstance(err, CheckpointError):
        raise type(err)(err.args[0] if str(err).startswith(name) else f"{name}: {err}") from None
    if isinstance(err, pickle.UnpicklingError):
        if pickle_bytes is None or any(mark in str(err) for mark in _TORCH_ZIP_ERRORS):
            # a legacy file: its pickle has no checksum to tell damage from refusal; torch's zip reader failing:
            # torch 2.4 re-raises every RuntimeError of a weights_only load as an UnpicklingError
            raise CorruptCheckpointError(
                f"{name} cannot be read as a checkpoint (truncated or damaged?): {err}"
            ) from err
        raise RefusedObjectsError(
            f"{name} holds objects that weights_only=True does not load (its pickle is intact: this is not damage). "
            f"Allow them with torch.serialization.add_safe_globals, or, only for a file you trust, load it with "
            f"weights_only=False.\n{err}",
            name,
            tuple(dict.fromkeys(re.findall(r"GLOBAL ([\w.]+)", str(err)))),
        ) from None
    if isinstance(err, RuntimeError):
        # torch's zip reader (inline_container.cc) parses the directory itself, and fails damage we let through.
        if any(mark in str(err) for mark in _TORCH_ZIP_ERRORS) or pickle_bytes is None:
            raise CorruptCheckpointError(f"{name} cannot be loaded ({err}); the file is damaged") from err
        raise _named(err, name) from err
    if pickle_bytes is None and not isinstance(err, (MemoryError, OSError)):
        raise CorruptCheckpointError(
            f"{name} cannot be loaded ({type(err).__name__}: {err}); the legacy file may be truncated or damaged"
        ) from err
    raise _named(err, name) from err


def _named(err: BaseException, name: str) -> BaseException:
    """``err`` with ``name`` in its message (same type), for errors of the machine rather than of the file."""
    try:
        named = type(err)(f"{name}: {err}")
    except Exception:
        return err
    return named


def _foreign_storages(obj: object, produced: set[int]) -> bool:
    """Whether ``obj`` holds a storage our decoders did not make (one torch.load took from the file as it is)."""
    contents = find_contents(obj)
    keys = [t.untyped_storage()._cdata for t in contents.tensors] + list(contents.storages)
    return any(key not in produced for key in keys)


def describe(
    path: str | os.PathLike, storage: StorageBackend | None = None, *, infos: list[TensorInfo] | None = None
) -> Any:
    """Load ``path``'s structure with a :class:`TensorInfo` in place of each compressed tensor, decoding nothing
    (``storage``: as for :func:`load`).

    A tensor that torch rebuilds from other tensors (a nested tensor from its sizes, a quantized one from its scales)
    cannot be rebuilt from descriptions: its rebuild raises TypeError, AttributeError or NotImplementedError. Describe such a file with
    ``infos``: it is then loaded (decoded and checked) as :func:`load` does, and the TensorInfo of every compressed
    tensor is appended to ``infos`` as it is decoded.
    """
    describing = Describing() if infos is None else Describing(decode=True, infos=infos)
    return _load(path, storage, new_load(describing=describing), map_location="cpu", mmap=infos is None)
