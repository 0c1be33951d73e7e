"""Exceptions raised by lightning_nvcomp. Every message names the file, record or tensor at fault."""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class: something about a checkpoint file or a save/load request is wrong."""


class CorruptCheckpointError(CheckpointError):
    """The stored bytes or their description fail validation (checksum, sizes, offsets, format)."""


class CodecUnavailableError(CheckpointError):
    """The codec a record needs cannot run here (e.g. gANS without a CUDA GPU and nvCOMP)."""


class RefusedObjectsError(CheckpointError):
    """The file's pickle is intact but holds objects that a ``weights_only=True`` load refuses (classes or functions
    outside torch's allowed globals, e.g. a whole module saved with ``torch.save(model)``): not damage.

    Attributes:
        path: the file.
        refused: the refused globals as torch names them (``torch.nn.modules.linear.Linear``), where it does.
    """

    def __init__(self, message: str, path: str = "", refused: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.path, self.refused = path, refused


class DecodeLimitError(CheckpointError):
    """A load would decode more bytes than its bound allows (a decompression bomb, or data that is mostly zeros);
    the message says how to raise the bound for a trusted file."""


class MissingBaseError(CheckpointError):
    """A delta checkpoint's base (the earlier checkpoint its records are coded against) is missing, or a different
    file now has its name; the message names both. Restore it, or load a checkpoint that does not need it."""


class UnsupportedFormatError(CheckpointError):
    """The file was written by a newer lightning_nvcomp, in a format this version does not read: upgrade."""


#: The optional-dependency extra of each framework (pyproject.toml) and the name users know it by.
FRAMEWORKS = {
    "lightning": "Lightning",
    "accelerate": "Accelerate",
    "remote": "fsspec",
    "s3": "s3fs",
    "gcs": "gcsfs",
    "azure": "adlfs",
    "hdfs": "pyarrow",
}


class MissingExtraError(ImportError):
    """An integration (or a remote storage backend) was imported without its framework; ``extra`` is the pip extra
    that installs it. The core (save/load, dcp, the CLI) needs neither Lightning nor Accelerate nor fsspec: each
    integration imports its framework inside ``try`` and turns a failure into this error."""

    def __init__(self, extra: str, what: str, cause: BaseException | None = None) -> None:
        self.extra, self.what = extra, what
        message = f'{what} needs {FRAMEWORKS[extra]}: pip install "lightning-nvcomp[{extra}]"'
        if cause is not None:
            message += f" (importing it failed: {cause})"
        super().__init__(message, name=getattr(cause, "name", None))
