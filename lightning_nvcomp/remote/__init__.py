"""Deprecated since 0.2, removed in 0.3: ``lightning_nvcomp.remote`` is :mod:`lightning_nvcomp.storage.remote` now
(``RemoteOptions`` is also ``lightning_nvcomp.RemoteOptions``)."""

import warnings

from lightning_nvcomp.storage.remote import (
    OutcomeUnknownError,
    RemoteAccessError,
    RemoteNotFoundError,
    RemoteOptions,
    RemoteStorageError,
    RemoteUnreachableError,
)

warnings.warn(
    "lightning_nvcomp.remote is deprecated: import RemoteOptions from lightning_nvcomp (or lightning_nvcomp.storage.remote)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "OutcomeUnknownError",
    "RemoteAccessError",
    "RemoteNotFoundError",
    "RemoteOptions",
    "RemoteStorageError",
    "RemoteUnreachableError",
]
