"""What a written checkpoint offers later saves as a base (:func:`base_file`: its id and its records, read from its
pickle without running it), and what the checkpoints of a directory need (:func:`needed_bases`, :func:`chain`): a
delta record names its base's file and id (docs/FORMAT.md, format 4), so what needs what is read from the files."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import zipfile
from collections.abc import Collection
from typing import Any

import torch

from lightning_nvcomp.storage import StorageBackend, storage_for
from lightning_nvcomp.storage.sized_reader import Window

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
    #: How a delta in another file names it (``NAME`` or ``../DIR/NAME``: see :func:`reference`).
    ref: str = ""
    #: ``(offset, length)`` of the archive in the file, where it is one item of a DCP data file; None: the file.
    span: tuple[int, int] | None = None


def base_file(path: str, storage: StorageBackend | None = None, span: tuple[int, int] | None = None) -> BaseFile | None:
    """What the checkpoint at ``path`` (with ``span``: the archive at that ``(offset, length)`` in it) offers as a
    base, or None where it offers nothing (not a file of ours, written by an older version, unreadable): the save is
    then stored alone. Nothing in the file runs: its pickle is read by an unpickler that builds inert stand-ins and
    notes the records of our decoders' calls."""
    storage = storage or storage_for(path)
    try:
        with storage.open_read(path) as f:
            archive = zipfile.ZipFile(f if span is None else Window(f, *span, path))
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
    return BaseFile(path, ident, ordered, span=span)


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


def offered(base: str, path: str, storage: StorageBackend) -> BaseFile | None:
    """What the checkpoint ``base`` offers a save to ``path`` as its base, named as that save names it (its
    :attr:`BaseFile.ref`); None where it offers nothing (see :func:`base_file` and :func:`reference`)."""
    ref = reference(base, path, storage)
    found = base_file(base, storage) if ref is not None else None
    return dataclasses.replace(found, ref=ref) if found is not None and ref is not None else None


def reference(base: str, path: str, storage: StorageBackend) -> str | None:
    """How a delta at ``path`` names its base ``base``: ``NAME`` in the same directory, ``../DIR/NAME`` in a
    directory beside it (Accelerate's ``checkpoint_N`` folders), or None where it cannot (elsewhere, or itself)."""
    here, there = storage.parent(path), storage.parent(base)
    name = base.rstrip("/").rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1]
    if there == here:
        return None if base == path else name
    if storage.parent(there) == storage.parent(here):
        folder = there.rstrip("/").rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1]
        return f"../{folder}/{name}"
    return None


def candidates(holder: str, ref: str, ident: str, storage: StorageBackend) -> list[str]:
    """Where the base that the file ``holder`` names ``ref`` (of id ``ident``) may be, in order: the file itself, the
    copy kept under its hidden name beside it (a base replaced while needed), the copy beside ``holder`` (a base whose
    folder was pruned while needed)."""
    directory = storage.parent(holder)
    parts = ref.split("/")
    folder = storage.join(storage.parent(directory), parts[1]) if len(parts) == 3 else directory
    hidden = sidecar_name(parts[-1], ident)
    return [storage.join(folder, parts[-1]), storage.join(folder, hidden), storage.join(directory, hidden)]


def sidecar_name(file: str, ident: str) -> str:
    """The hidden name a base ``file`` of id ``ident`` keeps its bytes under once another file took its name."""
    return f".{file}.{ident}.base"


def needed_bases(storage: StorageBackend, directory: str, exclude: Collection[str] = ()) -> set[tuple[str, str]]:
    """The (file name, id) of every base that a checkpoint in ``directory`` (but those in ``exclude``) is coded
    against, wherever the base lies."""
    needed = set()
    for name in storage.listdir(directory):
        path = storage.join(directory, name)
        if path in exclude or storage.isdir(path):
            continue
        found = base_file(path, storage)
        for rec in found.records if found is not None else []:
            if "delta" in rec.record:
                base = rec.record["delta"]["base"]
                needed.add((base["file"].rsplit("/", 1)[-1], base["id"]))  # by name: ids tell files apart
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
        places = candidates(current.path, bases[0]["file"], bases[0]["id"], storage)
        found.append(places[0])
        current = next((f for f in map(lambda p: base_file(p, storage), places) if f and f.id == bases[0]["id"]), None)
    return found
