"""Deprecated since 0.2, removed in 0.3: ``lightning_nvcomp.policy`` is :mod:`lightning_nvcomp.auto` now."""

import warnings

from lightning_nvcomp.auto import CodecPolicy

warnings.warn(
    "lightning_nvcomp.policy is deprecated: import CodecPolicy from lightning_nvcomp.auto",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["CodecPolicy"]
