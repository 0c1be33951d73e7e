"""torch.distributed.checkpoint (DCP) storage that compresses every rank's local shards: the public import path of
:mod:`lightning_nvcomp.integrations.dcp` (its docstring tells how it works)::

    from lightning_nvcomp.dcp import NvcompFileSystemWriter, NvcompFileSystemReader

It is also the module every checkpoint's ``.metadata`` names: ``lightning_nvcomp.dcp._checked_metadata`` and
``lightning_nvcomp.dcp.NvcompStorageInfo`` are part of the file format (docs/FORMAT.md §7), so they stay importable
here under those names whichever module defines them (files of every version, and DCP's default reader, find them
here).
"""

from lightning_nvcomp.integrations.dcp import (
    STAGE_COMPRESS,
    DcpCheckpointStats,
    NvcompFileSystemReader,
    NvcompFileSystemWriter,
    NvcompStorageInfo,
    default_policy,
)
from lightning_nvcomp.integrations.dcp.metadata import _checked_metadata, _CheckedMetadata, _load_metadata

__all__ = [
    "STAGE_COMPRESS",
    "DcpCheckpointStats",
    "NvcompFileSystemReader",
    "NvcompFileSystemWriter",
    "NvcompStorageInfo",
    "_CheckedMetadata",
    "_checked_metadata",
    "_load_metadata",
    "default_policy",
]
