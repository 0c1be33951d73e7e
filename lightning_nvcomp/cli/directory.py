"""What a path given to ``inspect`` or ``verify`` is (:func:`kind_of`): a checkpoint file, a DCP checkpoint directory,
one data file of a DCP checkpoint, or a directory of checkpoints (what Accelerate's ``save_state`` writes, say); and
the checkpoints in a directory, with the entries that are none and why (:func:`members`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from lightning_nvcomp.errors import CheckpointError
from lightning_nvcomp.storage import storage_for

#: The names DCP gives a checkpoint's metadata and its data files (``torch.distributed.checkpoint``), spelled here so
#: that a command on a single file does not import DCP (a second).
DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"

#: What a path is.
FILE, DCP, DCP_DATA_FILE, DIRECTORY = "file", "DCP checkpoint", "DCP data file", "directory"

#: Names ``torch.save`` files go by (Accelerate's ``*.bin`` and ``*.pkl``, Lightning's ``*.ckpt``...): in a directory,
#: such a file is checked as a checkpoint whatever its first bytes (damage there must not make it "another file").
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".tar")
#: The first bytes of a ``torch.save`` file: a zip, or a legacy file (a pickle that starts with torch's magic number).
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_PICKLE = b"\x80"


def kind_of(path: str) -> str:
    """Whether ``path`` (a local path or a URL) is a checkpoint file (or nothing yet: a missing file), a DCP checkpoint
    directory (it holds a ``.metadata``), a DCP data file, or another directory."""
    storage = storage_for(path)
    if storage.isdir(path):
        return DCP if storage.exists(storage.join(path, DCP_METADATA)) else DIRECTORY
    return DCP_DATA_FILE if path.endswith(DCP_SUFFIX) else FILE


def name_of(path: str) -> str:
    """The last part of a path or URL."""
    return os.path.basename(path.rstrip("/"))


@dataclass(frozen=True)
class Member:
    """A checkpoint in a directory: a file (``kind`` :data:`FILE`) or a DCP checkpoint directory (:data:`DCP`)."""

    name: str
    path: str
    kind: str


def members(path: str) -> tuple[list[Member], list[tuple[str, str]]]:
    """The checkpoints in the directory ``path``: the files that hold ``torch.save`` checkpoints (by their name or
    their first bytes) and the subdirectories that are DCP checkpoints; and every other entry, with why it is not
    checked (hidden files among them: a save in progress writes its temporary file under a hidden name). Where
    ``path`` is a DCP checkpoint itself, its ``.metadata`` and data files are neither (they are that checkpoint)."""
    storage = storage_for(path)
    names = sorted(storage.listdir(path))
    dcp = DCP_METADATA in names
    found, others = [], []
    for name in names:
        entry = storage.join(path, name)
        if storage.isdir(entry):
            if storage.exists(storage.join(entry, DCP_METADATA)):
                found.append(Member(name, entry, DCP))
            else:
                others.append((name, "a directory that is not a DCP checkpoint (no .metadata)"))
        elif name == DCP_METADATA or (dcp and name.endswith(DCP_SUFFIX)):
            continue
        elif name.startswith("."):
            others.append((name, "a hidden file (a save's temporary file, say)"))
        elif name.endswith(DCP_SUFFIX):
            others.append((name, "a DCP data file with no .metadata beside it (left by an interrupted save?)"))
        else:
            with storage.open_read(entry) as f:
                head = f.read(len(_LEGACY_MAGIC))
            if head.startswith(_PICKLE) and not head.startswith(_LEGACY_MAGIC):
                others.append((name, "a plain pickle, not a torch checkpoint (not loaded: unpickling runs its code)"))
            elif name.endswith(TORCH_SUFFIXES) or head.startswith((_ZIP_MAGIC, _LEGACY_MAGIC)):
                found.append(Member(name, entry, FILE))
            else:
                others.append((name, "not a torch checkpoint"))
    return found, others


def checkpoint_of(data_file: str) -> str:
    """The directory of the DCP checkpoint whose data file ``data_file`` is.

    Raises:
        FileNotFoundError: there is no file ``data_file``.
        CheckpointError: its directory holds no ``.metadata``, without which its items cannot be located (not damage).
    """
    storage = storage_for(data_file)
    if not storage.exists(data_file):
        raise FileNotFoundError(f"{data_file} does not exist")
    directory = storage.parent(data_file)
    if not storage.exists(storage.join(directory, DCP_METADATA)):
        raise CheckpointError(
            f"{data_file} is a data file of a DCP checkpoint, whose items only the checkpoint's {DCP_METADATA} "
            f"locates, and {directory} has none (DCP writes it last: an interrupted save?); nothing shows the file is "
            "damaged. Give the checkpoint directory it belongs to"
        )
    return directory


def no_checkpoint(path: str, others: list[tuple[str, str]]) -> FileNotFoundError:
    """The error of a directory that holds no checkpoint, listing what it holds (a missing checkpoint: status 1)."""
    listed = "".join(f"\n  {name}: {why}" for name, why in others)
    return FileNotFoundError(f"{path} is a directory that holds no checkpoint{listed or ' (it is empty)'}")
