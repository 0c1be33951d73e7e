"""Delta checkpoints in the file: what a written checkpoint offers as a base (:func:`base_file`: its id and its records,
read from its pickle without running it), a record's bytes coded against the same record of the base
(:func:`encode_against`), and the base's bytes fetched back to undo it (:func:`undo`).

A delta record names its base by file name (in its own directory), the base's zip ``serialization_id`` and the base
record whole (see docs/FORMAT.md, format 4). Decoding one opens the base, checks its id, reads that record's blobs and
decodes them (a base may be a delta itself: the chain is followed), all checked as any record is: a missing or
replaced base raises :class:`~lightning_nvcomp.errors.MissingBaseError` naming it, a damaged one
:class:`~lightning_nvcomp.errors.CorruptCheckpointError` naming it; never wrong bytes.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Collection
from typing import Any, BinaryIO

import numpy as np
import torch

from lightning_nvcomp.codec import delta as transforms
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.schema import _padded
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, MissingBaseError
from lightning_nvcomp.format.load_state import LoadState
from lightning_nvcomp.storage import StorageBackend, storage_for

#: The longest chain of bases a load follows (a longer one is a damaged or hostile file: a base cannot be newer).
MAX_CHAIN = 64


@dataclasses.dataclass(frozen=True)
class BaseRecord:
    """A record of a written checkpoint: its dict and the keys of its blobs (``data/<key>`` entries)."""

    record: dict
    blobs: list[str]

    def fits(self, dtype: torch.dtype, storages: list[list[int]]) -> bool:
        """Whether a record of ``dtype`` whose storages lie at ``storages`` can be coded against this one."""
        rec = self.record
        return rec.get("dtype") == str(dtype).removeprefix("torch.") and rec.get("storages") == storages


@dataclasses.dataclass(frozen=True)
class BaseFile:
    """A checkpoint file that later saves may be coded against.

    Attributes:
        path: where it is (a local path or a URL).
        id: its zip's ``serialization_id``, which a delta records: a different file under its name is not its base.
        records: its records in coding order (their first blobs' order).
    """

    path: str
    id: str
    records: list[BaseRecord]


def base_file(path: str, storage: StorageBackend | None = None) -> BaseFile | None:
    """What the checkpoint at ``path`` offers as a base, or None where it offers nothing (not a file of ours, written by
    an older version, unreadable): the save is then stored alone. Nothing in the file runs: its pickle is read by an
    unpickler that builds inert stand-ins and notes the records of our decoders' calls."""
    storage = storage or storage_for(path)
    try:
        with storage.open_read(path) as f:
            archive = zipfile.ZipFile(f)
            top = archive.namelist()[0].split("/")[0]
            ident = archive.read(f"{top}/.data/serialization_id").decode("ascii")
            calls = _Calls(archive.read(f"{top}/data.pkl"))
            calls.load()
    except Exception:  # noqa: BLE001 - a file that offers no base is saved against by no one: a keyframe follows
        return None
    found: dict[int, BaseRecord] = {}
    for blobs, rec in calls.records:
        if isinstance(rec, dict) and rec.get("format", 0) >= 3 and blobs and all(isinstance(b, str) for b in blobs):
            found.setdefault(rec.get("check", 0), BaseRecord(rec, blobs))
    ordered = sorted(found.values(), key=lambda r: int(r.blobs[0]))
    return BaseFile(path, ident, ordered)


class _Inert:
    """What every object of a base's pickle becomes while its records are read: takes anything, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Calls(pickle.Unpickler):
    """Reads a pickle noting the (blob keys, record) of every call of our decoders; every other global is inert."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.records: list[tuple[list, object]] = []

    def find_class(self, module: str, name: str) -> Any:
        if module == "lightning_nvcomp" and name in ("decode_tensor", "decode_storage"):
            return self._note
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda key, *args: key
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        return pid[2] if isinstance(pid, tuple) and len(pid) > 2 else None

    def _note(self, blobs: Any = None, rec: Any = None, *args: Any) -> _Inert:
        self.records.append((list(blobs) if isinstance(blobs, list) else [], rec))
        return _Inert()


def delta_field(transforms_: list[str | None], itemsize: int, base: BaseFile, rec: BaseRecord) -> dict:
    """The ``delta`` field of a record whose storages are coded with ``transforms_`` (None: as they are) against
    ``rec`` of ``base`` (docs/FORMAT.md)."""
    return {
        "transforms": [t or "none" for t in transforms_],
        "itemsize": itemsize,
        "base": {"file": os.path.basename(base.path), "id": base.id, "blobs": rec.blobs, "record": rec.record},
    }


def encode_against(
    storages: list[torch.Tensor],
    table: list[list[int]],
    dtype: torch.dtype,
    codec: str,
    base: BaseFile,
    rec: BaseRecord,
) -> tuple[torch.Tensor, dict] | None:
    """A record's bytes coded against ``rec`` of ``base``: its ``storages`` (1-D uint8, lying in it at ``table``'s
    offsets) each transformed the way that codes a sample of it smallest (or kept), into a buffer that first holds
    the base record's bytes (decoded on the storages' device: one record's worth of memory); with the record's
    ``delta`` field. None where every storage codes smaller alone."""
    base_bytes = _decoded(base.path, base.id, rec.blobs, rec.record, storages[0].device, None, 0, {})
    itemsize = transforms.width(dtype)
    measured = [i for i, (_, nbytes) in enumerate(table) if nbytes >= _CHOOSE_NBYTES]
    pairs = [(storages[i], base_bytes[table[i][0] : table[i][0] + table[i][1]]) for i in measured]
    choices = transforms.choose(pairs, itemsize, lambda windows: records.coded_nbytes(windows, dtype, codec))
    chosen: list[str | None] = [None] * len(storages)
    for i, transform in zip(measured, choices):
        chosen[i] = transform
    if not any(chosen):
        return None
    for data, (start, nbytes), transform in zip(storages, table, chosen):
        window = base_bytes[start : start + nbytes]
        if transform is None:
            window.copy_(data)
        else:
            transforms.apply(transform, data, window, itemsize, window)
    return base_bytes, delta_field(chosen, itemsize, base, rec)


#: Storages smaller than this are stored as they are in a delta record: choosing costs more than it gains.
_CHOOSE_NBYTES = 16 << 10


def undo(rec: dict, pieces: list[torch.Tensor], name: str, state: LoadState, cache: dict) -> None:
    """Undo a delta record's transform on its decoded ``pieces`` (its storages, in place), with the bytes of its base
    record: ``name`` is the path of the file that holds ``rec``; ``state`` the load's (the base is decoded within its
    bound, which :func:`base_stored_nbytes` widened); ``cache`` keeps the bases' opened files for the rest of the
    load."""
    delta = rec["delta"]
    base = delta["base"]
    device = pieces[0].device if pieces else torch.device("cpu")
    base_bytes = _decoded(
        _base_path(name, base["file"]), base["id"], base["blobs"], base["record"], device, state, 1, cache
    )
    if base["record"].get("storages") != rec["storages"] or base_bytes.numel() != rec["nbytes"]:
        raise CorruptCheckpointError(f"its base record in {base['file']} does not lie as the record does")
    for (start, nbytes), piece, transform in zip(rec["storages"], pieces, delta["transforms"]):
        if transform != "none":
            transforms.undo(transform, piece, base_bytes[start : start + nbytes], delta["itemsize"])


def base_stored_nbytes(rec: dict) -> int:
    """The stored bytes of a delta record's base record (what its load reads from the base)."""
    return _stored_nbytes(rec["delta"]["base"]["record"])


def _stored_nbytes(rec: dict) -> int:
    sizes = rec.get("sizes")
    return sum(_padded(n) for n in sizes if isinstance(n, int)) if isinstance(sizes, list) else 0


def _base_path(name: str, file: str) -> str:
    storage = storage_for(name)
    return storage.join(storage.parent(name), file)


def _decoded(
    path: str,
    ident: str,
    keys: list[str],
    rec: dict,
    device: torch.device,
    state: LoadState | None,
    depth: int,
    cache: dict,
) -> torch.Tensor:
    """The decoded bytes of record ``rec`` of the base at ``path`` (its blobs ``keys``), checked: its file's id is
    ``ident``, its blobs' CRCs and fields are the record's, and a base of its own is followed."""
    if depth > MAX_CHAIN:
        raise CorruptCheckpointError(f"its chain of bases is longer than {MAX_CHAIN} at {path}")
    opened = cache.get((path, ident))
    if opened is None:
        opened = cache[(path, ident)] = _opened(path, ident)
    if opened.id != ident:
        raise MissingBaseError(
            f"its base {path} was replaced by another file (serialization id {opened.id}, not {ident}): the delta "
            "cannot be decoded without the file it was saved against"
        )
    try:
        blobs = [opened.blob(key) for key in keys]
        if state is not None:
            state.charge(blobs, rec.get("nbytes", 0) if isinstance(rec.get("nbytes"), int) else 0, path)
        data = records.decode(blobs, rec, device)
        if "delta" in rec:
            inner = rec["delta"]["base"]
            if state is not None:
                state.include(_stored_nbytes(inner["record"]))
            base_bytes = _decoded(
                _base_path(path, inner["file"]),
                inner["id"],
                inner["blobs"],
                inner["record"],
                device,
                state,
                depth + 1,
                cache,
            )
            if base_bytes.numel() != data.numel() or inner["record"].get("storages") != rec.get("storages"):
                raise CorruptCheckpointError(f"its base record in {inner['file']} does not lie as the record does")
            for (start, nbytes), transform in zip(rec["storages"], rec["delta"]["transforms"]):
                if transform != "none":
                    piece = data[start : start + nbytes]
                    transforms.undo(transform, piece, base_bytes[start : start + nbytes], rec["delta"]["itemsize"])
    except MissingBaseError:
        raise
    except CheckpointError as err:
        message = str(err)
        raise type(err)(message if message.startswith(path) else f"its base {path}: {message}") from None
    return data


def _opened(path: str, ident: str) -> _Opened:
    """The base at ``path`` of id ``ident``: the file there, or where another file took its name, the copy of it
    kept beside it (:func:`sidecar_name`)."""
    storage = storage_for(path)
    kept = storage.join(storage.parent(path), sidecar_name(os.path.basename(path), ident))
    try:
        opened = _Opened(path)
    except MissingBaseError:
        if not storage.exists(kept):
            raise
        return _Opened(kept)
    if opened.id != ident and storage.exists(kept):
        return _Opened(kept)
    return opened


class _Opened:
    """A base file opened for a load or a save: its id and its entries' places."""

    def __init__(self, path: str) -> None:
        storage = storage_for(path)
        try:
            self.file: BinaryIO = storage.open_read(path)
        except FileNotFoundError:
            raise MissingBaseError(
                f"its base {path} is missing: a delta cannot be decoded without the checkpoint it was saved against "
                "(restore that file, or load a checkpoint that does not need it)"
            ) from None
        try:
            archive = zipfile.ZipFile(self.file)
            names = archive.namelist()
            top = names[0].split("/")[0] if names else ""
            self.id = archive.read(f"{top}/.data/serialization_id").decode("ascii")
            self.entries = {
                info.filename.removeprefix(f"{top}/data/"): info
                for info in archive.infolist()
                if info.filename.startswith(f"{top}/data/")
            }
        except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, ValueError, EOFError, struct.error) as err:
            raise CorruptCheckpointError(f"its base {path} is not a readable checkpoint ({err})") from None
        self.mapped: np.ndarray | None = None  # a local file's pages, copy-on-write: blobs are read where they lie
        try:
            self.mapped = np.memmap(self.file, dtype=np.uint8, mode="c")
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            pass

    def blob(self, key: str) -> torch.Tensor:
        """Entry ``data/<key>``'s bytes (stored, as every entry of ours), which the record's CRCs then check."""
        info = self.entries.get(key)
        if info is None or info.compress_type != zipfile.ZIP_STORED:
            raise CorruptCheckpointError(f"it holds no stored entry data/{key}")
        self.file.seek(info.header_offset)
        header = self.file.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise CorruptCheckpointError(f"entry data/{key} has no local header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        if self.mapped is not None:
            if start + info.file_size > self.mapped.size:
                raise CorruptCheckpointError(f"entry data/{key} is truncated")
            return torch.from_numpy(self.mapped[start : start + info.file_size])
        self.file.seek(start)
        out = torch.empty(info.file_size, dtype=torch.uint8)
        view, at = memoryview(out.numpy()), 0
        while at < info.file_size:
            chunk = self.file.read(min(info.file_size - at, 64 << 20))
            if not chunk:
                raise CorruptCheckpointError(f"entry data/{key} is truncated")
            view[at : at + len(chunk)] = chunk
            at += len(chunk)
        return out


def sidecar_name(file: str, ident: str) -> str:
    """The hidden name a base ``file`` of id ``ident`` keeps its bytes under once another file took its name."""
    return f".{file}.{ident}.base"


def needed_bases(storage: StorageBackend, directory: str, exclude: Collection[str] = ()) -> set[tuple[str, str]]:
    """The (file name, id) of every base that a checkpoint in ``directory`` (but those in ``exclude``) is coded
    against."""
    needed = set()
    for name in storage.listdir(directory):
        path = storage.join(directory, name)
        if path in exclude or storage.isdir(path):
            continue
        found = base_file(path, storage)
        for rec in found.records if found is not None else []:
            if "delta" in rec.record:
                base = rec.record["delta"]["base"]
                needed.add((base["file"], base["id"]))
    return needed


def chain(path: str, storage: StorageBackend | None = None) -> list[str]:
    """The files the checkpoint at ``path`` needs to load, nearest first: its base, the base's base, and so on back
    to a file that stands alone (empty for a standalone file). Read from the files' pickles, decoding nothing."""
    storage = storage or storage_for(path)
    found: list[str] = []
    current = base_file(path, storage)
    while current is not None and len(found) < MAX_CHAIN:
        bases = [r.record["delta"]["base"] for r in current.records if "delta" in r.record]
        if not bases:
            break
        following = storage.join(storage.parent(current.path), bases[0]["file"])
        kept = storage.join(storage.parent(current.path), sidecar_name(bases[0]["file"], bases[0]["id"]))
        found.append(following)
        current = base_file(following, storage)
        if (current is None or current.id != bases[0]["id"]) and storage.exists(kept):
            current = base_file(kept, storage)
    return found
