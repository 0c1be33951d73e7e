"""Deprecated since 0.2, removed in 0.3: ``lightning_nvcomp.resources`` is the package's private
:mod:`lightning_nvcomp._process` now (the process-wide resources, and the effects on the process listed in
docs/ARCHITECTURE.md)."""

import warnings

from lightning_nvcomp._process import PauseBetweenCalls, collector_paused, reset, shared

warnings.warn(
    "lightning_nvcomp.resources is deprecated: the process-wide resources are private (lightning_nvcomp._process); "
    "reset() stays importable from here until 0.3",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["PauseBetweenCalls", "collector_paused", "reset", "shared"]
