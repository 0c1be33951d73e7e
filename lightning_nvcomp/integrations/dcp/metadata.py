"""What a DCP checkpoint of this package records: the checked ``.metadata`` (:class:`_CheckedMetadata`, read back
through :func:`_checked_metadata` and :func:`_load_metadata`, under ``weights_only`` rules: what each pickle may
import is :func:`_metadata_names`), each item's :class:`NvcompStorageInfo`, the checkpoint id and data file header that
bind the data files to their ``.metadata`` (:func:`data_file_header`), and the checks an item's storage info must
pass before its file is opened (:func:`check_storage_info`).

``_checked_metadata`` and ``NvcompStorageInfo`` are pickled into every ``.metadata`` under the names
``lightning_nvcomp.dcp._checked_metadata`` and ``lightning_nvcomp.dcp.NvcompStorageInfo``: those names are part of the
file format (docs/FORMAT.md §7), so they are pinned here whichever module defines them, and ``lightning_nvcomp.dcp``
must keep exposing both.
"""

from __future__ import annotations

import contextvars
import functools
import os
import pathlib
import pickle
import pickletools
import re
import secrets
import zlib
from dataclasses import dataclass
from pathlib import PureWindowsPath
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from lightning_nvcomp._compat.dcp import StorageInfo, private_metadata_names, transform_descriptors
from lightning_nvcomp.codec.schema import plain_name
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, RefusedObjectsError
from lightning_nvcomp.integrations.dcp.unpickle import CALLED, MADE, VALUE, Refused, restricted_loads
from lightning_nvcomp.options import CONCRETE_CODECS

#: The module whose names ``.metadata`` pickles (part of the file format: files of every version name it).
PICKLED_MODULE = "lightning_nvcomp.dcp"
METADATA = ".metadata"
#: The version of the checked ``.metadata`` format (see :func:`_checked_metadata`).
METADATA_FORMAT = 1
#: Codecs an item's storage info may name (``None``: a plain ``torch.save`` item).
ITEM_CODECS = tuple(c.value for c in CONCRETE_CODECS)
#: Offsets and lengths beyond this are refused before any arithmetic or allocation (no file is that large).
MAX_FILE_OFFSET = 1 << 62
#: The name ``_checked_metadata`` reports: the path while our reader reads it, else ``.metadata``.
_metadata_name: contextvars.ContextVar[str] = contextvars.ContextVar("lnv_dcp_metadata", default=METADATA)


# -- checked .metadata ------------------------------------------------------------------------------------------


class _CheckedMetadata:
    """What ``.metadata`` holds: DCP's pickle of the ``Metadata`` and its CRC-32. Unpickling it (any reader's
    ``pickle.load``) calls :func:`_checked_metadata`, which returns the verified ``Metadata`` itself."""

    __slots__ = ("crc", "payload")

    def __init__(self, metadata: Metadata) -> None:
        self.payload = pickle.dumps(metadata)
        self.crc = zlib.crc32(self.payload)

    def __reduce__(self) -> tuple:
        return (_checked_metadata, (self.payload, self.crc, METADATA_FORMAT))


def _checked_metadata(payload: bytes, crc: int, version: int = METADATA_FORMAT) -> Metadata:
    """Unpickle a checkpoint's ``Metadata`` after checking its CRC-32 (called by ``pickle.load`` of ``.metadata``).

    Raises:
        CorruptCheckpointError: the CRC does not match (the checkpoint metadata is damaged), or the fields are not
            what the writer stores.
        RefusedObjectsError: the payload (intact) imports or does what DCP's metadata never does (see
            :mod:`~lightning_nvcomp.integrations.dcp.unpickle`); none of it was run.
        CheckpointError: a format version this code does not know, or an intact payload that cannot be unpickled
            here.
    """
    where = _metadata_name.get()
    if type(version) is not int or version != METADATA_FORMAT:
        raise CheckpointError(
            f"{where}: the checkpoint metadata has format version {version!r}, unknown to this lightning_nvcomp "
            f"(it reads version {METADATA_FORMAT}): written by a newer version, or damaged"
        )
    if not isinstance(payload, bytes) or type(crc) is not int:
        raise CorruptCheckpointError(f"{where}: the checkpoint metadata is damaged (its checked record is malformed)")
    actual = zlib.crc32(payload)
    if actual != crc:
        raise CorruptCheckpointError(
            f"{where}: the checkpoint metadata is damaged (CRC-32 {actual:#010x}, recorded {crc:#010x}); the "
            "checkpoint cannot be loaded safely"
        )
    try:
        metadata = restricted_loads(payload, _metadata_names())
    except Refused as err:  # intact bytes (the CRC matched): written by a newer version, or crafted
        raise RefusedObjectsError(
            f"{where}: the checkpoint metadata is refused: {err}, which the metadata this version writes never "
            "does; nothing of it was run (written by a newer lightning_nvcomp or torch, or crafted)",
            where,
            (err.name,) if err.name else (),
        ) from None
    except (MemoryError, CheckpointError):
        raise
    except Exception as err:  # intact bytes (the CRC matched): not damage
        raise CheckpointError(
            f"{where}: the checkpoint metadata is intact but cannot be unpickled here ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where}: holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def _load_metadata(data: bytes, name: str) -> Metadata:
    """The ``Metadata`` of a ``.metadata`` file's bytes: the checked format (CRC verified) or a plain pickle (files
    of earlier versions, DCP's own), read under ``weights_only`` rules (:func:`_file_names`). Errors name ``name``;
    damage raises :class:`CorruptCheckpointError`, what the rules refuse :class:`RefusedObjectsError` (none of it
    run)."""
    # The checked wrapper names lightning_nvcomp.dcp._checked_metadata in its first bytes (DCP's pickle names
    # torch.distributed.checkpoint.metadata.Metadata there); damage may have changed one of the two names.
    checked = b"_checked_metadata" in data[:64] or PICKLED_MODULE.encode() in data[:64]
    if checked:
        # Parsed before it is loaded: a damaged length field (one flipped opcode makes the CRC's LONG1 a BINBYTES8)
        # makes pickle.loads allocate that length before reading it (a MemoryError, not a damage report).
        try:
            for _ in pickletools.genops(data):
                pass
        except Exception as err:
            raise CorruptCheckpointError(
                f"{name}: the checkpoint metadata is damaged ({type(err).__name__}: {err})"
            ) from err
    token = _metadata_name.set(name)
    try:
        metadata = restricted_loads(data, _file_names())
    except Refused as err:
        if checked:  # the checked wrapper names nothing but _checked_metadata: anything else is damage (or crafted)
            raise CorruptCheckpointError(
                f"{name}: the checkpoint metadata is damaged: {err}; refused, nothing of it was run"
            ) from None
        raise RefusedObjectsError(
            f"{name}: the checkpoint metadata is refused: {err}, which DCP's metadata never does; nothing of it was "
            "run (damaged, crafted, or written by a custom planner with classes of its own). Only if you trust the "
            "file: torch.distributed.checkpoint's own FileSystemReader unpickles it without restriction",
            name,
            (err.name,) if err.name else (),
        ) from None
    except (MemoryError, CheckpointError):
        raise
    except Exception as err:  # a truncated or damaged pickle fails in many ways
        raise CorruptCheckpointError(
            f"{name}: the checkpoint metadata is damaged or truncated ({type(err).__name__}: {err})"
        ) from err
    finally:
        _metadata_name.reset(token)
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f"{name}: holds a {type(metadata).__name__}, not DCP checkpoint metadata")
    if not isinstance(getattr(metadata, "storage_data", None), dict) or not isinstance(
        getattr(metadata, "state_dict_metadata", None), dict
    ):
        raise CorruptCheckpointError(f"{name}: the checkpoint metadata is damaged (no storage or state dict records)")
    return metadata


# -- the items' storage info ------------------------------------------------------------------------------------


@dataclass
class NvcompStorageInfo(StorageInfo):
    """DCP's per-item storage record plus how the item was stored: ``codec`` (``ans``, ``zstd`` or ``none``; None: a
    plain ``torch.save`` item, such as a byte item), the shard's raw size and ``checkpoint_id``, the id of the save
    that wrote the item's data file, which starts with :func:`data_file_header` (None: written before checkpoint
    ids existed, not checked), and ``base``, the checkpoint directory beside this one that a delta item is coded
    against (``../step-10``; None: the item stands alone). The item's bytes are a ``torch.save`` zip (the container
    format when compressed)."""

    codec: str | None = None
    raw_nbytes: int | None = None
    checkpoint_id: str | None = None
    base: str | None = None


# The names every .metadata pickles (part of the file format, docs/FORMAT.md §7): pinned to lightning_nvcomp.dcp,
# which re-exports both, so files written now load wherever files of earlier versions do, and vice versa.
_checked_metadata.__module__ = PICKLED_MODULE
NvcompStorageInfo.__module__ = PICKLED_MODULE


# -- what a .metadata pickle may import -------------------------------------------------------------------------


@functools.cache
def _metadata_names() -> dict[str, tuple[Any, str]]:
    """What a pickled DCP ``Metadata`` may import (torch 2.4-2.13's, and ours), by the name it is pickled as, with
    its use (:mod:`~lightning_nvcomp.integrations.dcp.unpickle`): the metadata dataclasses, ``torch.Size``, dtypes,
    the checkpoint id's path classes and what torch pickles enums and layouts through."""
    classes, callables = private_metadata_names()
    public = (Metadata, TensorStorageMetadata, BytesStorageMetadata, ChunkStorageMetadata, TensorProperties)
    names: dict[str, tuple[Any, str]] = {
        f"{c.__module__}.{c.__qualname__}": (c, MADE) for c in (*public, MetadataIndex, StorageMeta)
    }
    names.update({name: (c, MADE) for name, c in classes.items()})
    names[f"{PICKLED_MODULE}.NvcompStorageInfo"] = (NvcompStorageInfo, MADE)
    names.update({name: (f, CALLED) for name, f in callables.items()})
    names["torch.Size"] = (torch.Size, CALLED)
    for path in (pathlib.PosixPath, pathlib.WindowsPath):  # pathlib's classes live in pathlib._local from 3.13
        names[f"pathlib.{path.__name__}"] = names[f"{path.__module__}.{path.__qualname__}"] = (path, CALLED)
    names.update({f"torch.{n}": (v, VALUE) for n, v in vars(torch).items() if isinstance(v, torch.dtype)})
    return names


@functools.cache
def _file_names() -> dict[str, tuple[Any, str]]:
    """What a ``.metadata`` file's pickle may import: the checked wrapper, or (files of earlier versions, DCP's own)
    a plain ``Metadata``."""
    return {f"{PICKLED_MODULE}._checked_metadata": (_checked_metadata, CALLED), **_metadata_names()}


# -- checkpoint ids ---------------------------------------------------------------------------------------------

#: What every data file of a save with a checkpoint id starts with, before :func:`data_file_header`'s fields.
DATA_FILE_MAGIC = b"lightning_nvcomp-dcp-data"
#: Bytes of a data file's start read to report the header found there.
DATA_FILE_HEADER_MAX = 512
_CHECKPOINT_ID = re.compile(r"[0-9a-f]{16}")


def new_checkpoint_id() -> str:
    """A fresh checkpoint id: 16 hex digits (64 random bits), different for every save."""
    return secrets.token_hex(8)


def data_file_header(checkpoint_id: str, name: str) -> bytes:
    """The line a data file of the save ``checkpoint_id`` starts with, ``name`` being its own file name: what binds
    it to the ``.metadata`` whose items record that id and name (no item lies there: readers skip it)."""
    return b"%s %s %s\n" % (DATA_FILE_MAGIC, checkpoint_id.encode(), name.encode())


def header_fields(data: bytes) -> tuple[str, str] | None:
    """``(checkpoint id, file name)`` of the header ``data`` (a data file's first bytes) starts with; None if it
    starts with none."""
    line, newline, _ = data.partition(b"\n")
    fields = line.split(b" ", 2)
    if not newline or len(fields) != 3 or fields[0] != DATA_FILE_MAGIC:
        return None
    return fields[1].decode("ascii", "replace"), fields[2].decode("utf-8", "replace")


def check_storage_info(info: StorageInfo, where: str) -> None:
    """Refuse an item whose storage info cannot be honest: a data file outside the checkpoint directory, offsets or
    lengths that are not non-negative ints of a plausible size, an unknown codec (before any file is opened)."""
    rel = info.relative_path
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise CorruptCheckpointError(f"{where}: its data file name {rel!r} is not a file name (damaged metadata)")
    parts = re.split(r"[\\/]", rel)
    if os.path.isabs(rel) or rel[0] in "/\\" or ".." in parts or PureWindowsPath(rel).drive:
        raise CorruptCheckpointError(
            f"{where}: its data file {rel!r} lies outside the checkpoint directory; refused (damaged or hostile "
            "metadata)"
        )
    for field in ("offset", "length"):
        value = getattr(info, field, None)
        if type(value) is not int or not 0 <= value < MAX_FILE_OFFSET:
            raise CorruptCheckpointError(f"{rel}: {where} has {field} {value!r}; the checkpoint metadata is damaged")
    if isinstance(info, NvcompStorageInfo):
        _check_codec_fields(info, rel, where)


def _check_codec_fields(info: NvcompStorageInfo, rel: str, where: str) -> None:
    if info.codec is not None and info.codec not in ITEM_CODECS:
        raise CorruptCheckpointError(f"{rel}: {where}: unknown codec {info.codec!r} in the checkpoint metadata")
    if info.codec is not None and transform_descriptors(info):
        raise CorruptCheckpointError(
            f"{rel}: {where}: stream transforms {info.transform_descriptors!r} on a compressed item "
            "(the writer never applies any); the checkpoint metadata is damaged"
        )
    raw = info.raw_nbytes
    if raw is not None and (type(raw) is not int or not 0 <= raw < MAX_FILE_OFFSET):
        raise CorruptCheckpointError(f"{rel}: {where} has raw size {raw!r}; the checkpoint metadata is damaged")
    base = getattr(info, "base", None)  # files of 0.3.0 and before have none
    if base is not None and not (isinstance(base, str) and base.startswith("../") and plain_name(base[3:])):
        raise CorruptCheckpointError(
            f"{rel}: {where} names base {base!r}, not ../DIR; the checkpoint metadata is damaged"
        )
    checkpoint_id = info.checkpoint_id
    if checkpoint_id is not None and (type(checkpoint_id) is not str or not _CHECKPOINT_ID.fullmatch(checkpoint_id)):
        raise CorruptCheckpointError(
            f"{rel}: {where} has checkpoint id {checkpoint_id!r}; the checkpoint metadata is damaged"
        )
