"""The error a framework integration (or a remote storage backend) raises when what it needs is not installed: it
names the extra to install.

The core of lightning_nvcomp (save/load, dcp, the CLI) needs neither Lightning nor Accelerate nor fsspec; each
integration module imports its framework inside ``try`` and turns a failure into :class:`MissingExtraError`, and so
does :func:`lightning_nvcomp.locations.storage_for` for a URL whose fsspec implementation is missing.
"""

from __future__ import annotations

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
    """An integration was imported without its framework; ``extra`` is the pip extra that installs it."""

    def __init__(self, extra: str, what: str, cause: BaseException | None = None) -> None:
        self.extra, self.what = extra, what
        message = f'{what} needs {FRAMEWORKS[extra]}: pip install "lightning-nvcomp[{extra}]"'
        if cause is not None:
            message += f" (importing it failed: {cause})"
        super().__init__(message, name=getattr(cause, "name", None))
