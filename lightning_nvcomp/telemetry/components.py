"""What a checkpoint holds, for the cost model of ``lightning-nvcomp estimate`` (:mod:`.estimate`): its classes of
tensors (:class:`Component`) by precision and optimizer, their bytes per parameter, and the compression ratio each
class was measured at (or borrows). Dataclasses and pure functions, no IO.

Precisions (bytes per parameter; the published case is ``bf16-mixed`` + ``adamw`` + gradients = 2 + 8 + 2 = 12):

* ``bf16-mixed``: bf16 weights (2), bf16 gradients (2). Real mixed precision also keeps fp32 master weights
  (4 more); ``master_weights=True`` adds them (off by default, to match the published case).
* ``fp32``: fp32 weights (4), fp32 gradients (4); the weights are the master copy (``master_weights`` adds none).
* ``fp8``: fp8 weights (1), bf16 gradients (2); ``master_weights=True`` adds fp32 master weights (4).

Optimizers: ``adamw``: fp32 exp_avg (m) and exp_avg_sq (v), 4 + 4; ``sgd``: one fp32 momentum buffer, 4;
``none``: no optimizer state.

Compression ratios (raw bytes / stored bytes) per tensor class, measured with this package on an H200
(benchmarks/results/codec.md in git history, run of 2026-11-29, nvCOMP 6.0.0, 85.4M-param GPT trained 300 AdamW steps):
bf16 weights 1.518 gANS / 1.454 GPU zstd; fp32 weights 1.213 / 1.185; Adam m 1.195 / 1.178; Adam v 1.234 / 1.229.
Classes that were not measured borrow a measured class and are marked *assumed*: bf16 gradients use bf16 weights
(same two-byte layout: one noise byte, one sign/exponent byte), fp32 gradients and SGD momentum use Adam m (m is an
average of gradients), fp8 weights are counted as incompressible (1.0; nothing of that width was measured).
fp32 master weights are fp32 weights (measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PRECISIONS = ("bf16-mixed", "fp32", "fp8")
OPTIMIZERS = ("adamw", "sgd", "none")

#: The codecs with measured defaults, in display order, and their display names.
CODECS = ("gans", "zstd")
CODEC_NAMES = {"gans": "gANS", "zstd": "zstd"}

#: Ratios measured on an H200 (benchmarks/results/codec.md in git history, 2026-11-29: "ours gANS" and "ours GPU zstd" columns).
MEASURED_RATIOS: dict[str, dict[str, float]] = {
    "bf16 weights": {"gans": 1.518, "zstd": 1.454},
    "fp32 weights": {"gans": 1.213, "zstd": 1.185},
    "adam m": {"gans": 1.195, "zstd": 1.178},
    "adam v": {"gans": 1.234, "zstd": 1.229},
}
#: Ratio 1.0 for every codec: a class counted as incompressible.
_INCOMPRESSIBLE = {"gans": 1.0, "zstd": 1.0}


@dataclass(frozen=True)
class Component:
    """One class of tensors in the checkpoint.

    Attributes:
        name: what it is, e.g. ``weights`` or ``Adam v (exp_avg_sq)``.
        dtype: its element type, e.g. ``bf16``.
        bytes_per_param: bytes it stores per model parameter.
        nbytes: its size for the model, bytes.
        ratios: default compression ratio per codec (keys of :data:`CODECS`).
        assumed: True if ``ratios`` are borrowed from another class rather than measured on this one.
    """

    name: str
    dtype: str
    bytes_per_param: float
    nbytes: float
    ratios: Mapping[str, float]
    assumed: bool = False


def checkpoint_components(
    params: float,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    *,
    master_weights: bool = False,
    gradients: bool = True,
) -> list[Component]:
    """The tensor classes a checkpoint of the model holds, with sizes and default ratios (see the module doc).

    Args:
        params: number of model parameters (> 0).
        precision: ``bf16-mixed``, ``fp32`` or ``fp8``: the dtypes of weights and gradients.
        optimizer: ``adamw`` (fp32 m and v), ``sgd`` (fp32 momentum) or ``none``.
        master_weights: add fp32 master weights (no effect with ``fp32``, whose weights are the master copy).
        gradients: include gradients (the published case does; Lightning's own checkpoints do not).

    Returns:
        Components in the order weights, master weights, optimizer state, gradients.

    Raises:
        ValueError: unknown precision or optimizer, or params not > 0.
    """
    if not params > 0 or not math.isfinite(params):
        raise ValueError(f"params must be a finite number > 0, got {params}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    m = MEASURED_RATIOS
    spec: list[tuple[str, str, float, Mapping[str, float], bool]] = []  # name, dtype, bytes, ratios, assumed
    if precision == "bf16-mixed":
        spec.append(("weights", "bf16", 2, m["bf16 weights"], False))
    elif precision == "fp32":
        spec.append(("weights", "fp32", 4, m["fp32 weights"], False))
    else:
        spec.append(("weights", "fp8", 1, _INCOMPRESSIBLE, True))
    if master_weights and precision != "fp32":
        spec.append(("master weights", "fp32", 4, m["fp32 weights"], False))
    if optimizer == "adamw":
        spec.append(("Adam m (exp_avg)", "fp32", 4, m["adam m"], False))
        spec.append(("Adam v (exp_avg_sq)", "fp32", 4, m["adam v"], False))
    elif optimizer == "sgd":
        spec.append(("SGD momentum", "fp32", 4, m["adam m"], True))
    if gradients:
        if precision == "fp32":
            spec.append(("gradients", "fp32", 4, m["adam m"], True))
        else:
            spec.append(("gradients", "bf16", 2, m["bf16 weights"], True))
    return [Component(name, dtype, nb, params * nb, dict(ratios), assumed) for name, dtype, nb, ratios, assumed in spec]


def effective_ratio(components: Sequence[Component], codec: str) -> float:
    """The whole checkpoint's ratio with ``codec``: total raw bytes / total stored bytes.

    Args:
        components: the checkpoint's classes (each must have a default ratio for ``codec``).
        codec: a key of :data:`CODECS`.
    """
    raw = sum(c.nbytes for c in components)
    stored = sum(c.nbytes / c.ratios[codec] for c in components)
    return raw / stored
