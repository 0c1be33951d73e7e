"""Deprecated since 0.2, removed in 0.3: ``lightning_nvcomp.estimate`` is :mod:`lightning_nvcomp.telemetry.estimate`
now (what a checkpoint holds and its measured ratios: :mod:`lightning_nvcomp.telemetry.components`)."""

import warnings

from lightning_nvcomp.telemetry.components import (
    CODEC_NAMES,
    CODECS,
    MEASURED_RATIOS,
    OPTIMIZERS,
    PRECISIONS,
    Component,
    checkpoint_components,
    effective_ratio,
)
from lightning_nvcomp.telemetry.estimate import (
    GIB,
    MEASURED_E2E_ENCODE_BPS,
    MONTH_S,
    CodecRow,
    Estimate,
    FailureCost,
    IdleCost,
    checkpoints_per_month,
    compression_hidden,
    estimate,
    failure_cost,
    gpu_hours_cost,
    idle_cost,
    write_seconds,
    young_daly_interval_s,
)

warnings.warn(
    "lightning_nvcomp.estimate is deprecated: import from lightning_nvcomp.telemetry.estimate (the cost model) and "
    "lightning_nvcomp.telemetry.components (what a checkpoint holds)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "GIB",
    "MEASURED_E2E_ENCODE_BPS",
    "MEASURED_RATIOS",
    "MONTH_S",
    "OPTIMIZERS",
    "PRECISIONS",
    "CodecRow",
    "Component",
    "Estimate",
    "FailureCost",
    "IdleCost",
    "checkpoint_components",
    "checkpoints_per_month",
    "compression_hidden",
    "effective_ratio",
    "estimate",
    "failure_cost",
    "gpu_hours_cost",
    "idle_cost",
    "write_seconds",
    "young_daly_interval_s",
]
