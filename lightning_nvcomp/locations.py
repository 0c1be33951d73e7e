"""Deprecated since 0.2, removed in 0.3: ``lightning_nvcomp.locations`` is :mod:`lightning_nvcomp.storage` now."""

import warnings

from lightning_nvcomp.storage import StorageBackend, is_url, storage_for

warnings.warn(
    "lightning_nvcomp.locations is deprecated: import storage_for, StorageBackend and is_url from lightning_nvcomp.storage",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["StorageBackend", "is_url", "storage_for"]
