"""What synchronous checkpoints cost in idle GPU time and dollars, uncompressed and with each codec.

Pure functions (no IO) behind ``lightning-nvcomp estimate``.

Units. Sizes are GiB (2**30 bytes) and storage bandwidth is GiB/s. The published case (DESIGN.md section 1,
NVIDIA's nvCOMP blog) reads this way: 70e9 params x 12 bytes = 840e9 bytes = 782.3 GiB, and
782.3 GiB / 5 GiB/s = 156.5 s. Reading "5 GB/s" as decimal 5e9 bytes/s instead would give 168 s (7% more).

Model of a checkpoint. A synchronous save stops every GPU until the whole checkpoint is on storage, so the idle
time per checkpoint is ``checkpoint bytes / aggregate storage bandwidth`` (the bandwidth all GPUs share). The save
is assumed sharded (FSDP / torch.distributed.checkpoint: each GPU compresses and writes its own shard) and
compression is assumed hidden behind the write, as the benchmarks measure (DESIGN.md section 6: sync save wall
time <= 1.05 x compressed bytes / storage bandwidth + 0.2 s), so a compressed checkpoint costs
``bytes / ratio / bandwidth``. :func:`compression_hidden` checks that assumption against the slowest end-to-end
encode rate measured per GPU. A month is 30 days; it holds ``30 * 24 * 60 / interval_min`` checkpoints.

Precisions (bytes per parameter; the published case is ``bf16-mixed`` + ``adamw`` + gradients = 2 + 8 + 2 = 12):

* ``bf16-mixed``: bf16 weights (2), bf16 gradients (2). Real mixed precision also keeps fp32 master weights
  (4 more); ``master_weights=True`` adds them (off by default, to match the published case).
* ``fp32``: fp32 weights (4), fp32 gradients (4); the weights are the master copy (``master_weights`` adds none).
* ``fp8``: fp8 weights (1), bf16 gradients (2); ``master_weights=True`` adds fp32 master weights (4).

Optimizers: ``adamw``: fp32 exp_avg (m) and exp_avg_sq (v), 4 + 4; ``sgd``: one fp32 momentum buffer, 4;
``none``: no optimizer state.

Compression ratios (raw bytes / stored bytes) per tensor class, measured with this package on an H200
(benchmarks/results/codec.md, run of 2026-11-29, nvCOMP 6.0.0, 85.4M-param GPT trained 300 AdamW steps):
bf16 weights 1.518 gANS / 1.454 GPU zstd; fp32 weights 1.213 / 1.185; Adam m 1.195 / 1.178; Adam v 1.234 / 1.229.
Classes that were not measured borrow a measured class and are marked *assumed*: bf16 gradients use bf16 weights
(same two-byte layout: one noise byte, one sign/exponent byte), fp32 gradients and SGD momentum use Adam m (m is an
average of gradients), fp8 weights are counted as incompressible (1.0; nothing of that width was measured).
fp32 master weights are fp32 weights (measured).

Failures. Given the job's mean time between failures (any failure that stops the whole job), the Young/Daly
first-order optimal interval is ``sqrt(2 * C * MTBF)`` with ``C`` the checkpoint write time. The work lost per
failure is taken as half an interval of compute (failures fall uniformly within an interval) plus the restart's
read of the checkpoint back from storage (at the same bandwidth, compressed bytes, decode hidden like encode);
every GPU is idle for both.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

GIB = 2**30
#: Seconds in the 30-day month used for every monthly figure.
MONTH_S = 30 * 24 * 3600

PRECISIONS = ("bf16-mixed", "fp32", "fp8")
OPTIMIZERS = ("adamw", "sgd", "none")

#: The codecs with measured defaults, in display order, and their display names.
CODECS = ("gans", "zstd")
CODEC_NAMES = {"gans": "gANS", "zstd": "zstd"}
#: Other spellings accepted by :func:`arg_ratio` (``ans`` is what ``save(codec=...)`` calls gANS).
CODEC_ALIASES = {"ans": "gans"}

#: Ratios measured on an H200 (benchmarks/results/codec.md, 2026-11-29: "ours gANS" and "ours GPU zstd" columns).
MEASURED_RATIOS: dict[str, dict[str, float]] = {
    "bf16 weights": {"gans": 1.518, "zstd": 1.454},
    "fp32 weights": {"gans": 1.213, "zstd": 1.185},
    "adam m": {"gans": 1.195, "zstd": 1.178},
    "adam v": {"gans": 1.234, "zstd": 1.229},
}
#: Ratio 1.0 for every codec: a class counted as incompressible.
_INCOMPRESSIBLE = {"gans": 1.0, "zstd": 1.0}

#: Slowest end-to-end encode rate per GPU measured for each codec, bytes/s (codec.md, "e2e enc" columns: gANS
#: 1.4 GB/s on fp32 weights, zstd 0.9 GB/s on bf16 weights; includes planes, D2H copies and CRC-32).
MEASURED_E2E_ENCODE_BPS = {"gans": 1.4e9, "zstd": 0.9e9}

_MULTIPLIERS = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


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


@dataclass(frozen=True)
class IdleCost:
    """GPU idle time caused by synchronous checkpoints at one interval.

    Attributes:
        write_s: wall seconds per checkpoint during which every GPU is idle.
        checkpoints_per_month: checkpoints in a 30-day month.
        gpu_hours_month: idle GPU-hours per month, all GPUs together.
        usd_month: what those GPU-hours cost.
    """

    write_s: float
    checkpoints_per_month: float
    gpu_hours_month: float
    usd_month: float


@dataclass(frozen=True)
class FailureCost:
    """Work lost to failures at one checkpoint interval.

    Attributes:
        interval_s: seconds between checkpoints.
        lost_s_per_failure: wall seconds of lost compute per failure (half an interval plus the restart read).
        failures_per_month: expected failures in a 30-day month.
        gpu_hours_month: lost GPU-hours per month, all GPUs together.
        usd_month: what those GPU-hours cost.
    """

    interval_s: float
    lost_s_per_failure: float
    failures_per_month: float
    gpu_hours_month: float
    usd_month: float


@dataclass(frozen=True)
class CodecRow:
    """The cost of checkpointing with one codec (``none``: uncompressed).

    Attributes:
        codec: key (``none``, ``gans``, ``zstd`` or a name given with ``--ratio``).
        label: display name.
        ratio: raw bytes / stored bytes over the whole checkpoint.
        nbytes: stored bytes per checkpoint.
        idle: idle cost at the chosen interval.
        overridden: True if ``ratio`` was given by the user rather than derived from the measured defaults.
        hidden: whether the measured encode rate keeps pace with storage (None: unknown for this codec).
        optimal: failure cost at the Young/Daly interval (None without an MTBF).
        optimal_idle: idle cost at the Young/Daly interval (None without an MTBF).
        at_interval: failure cost at the chosen interval (None without an MTBF).
    """

    codec: str
    label: str
    ratio: float
    nbytes: float
    idle: IdleCost
    overridden: bool = False
    hidden: bool | None = None
    optimal: FailureCost | None = None
    optimal_idle: IdleCost | None = None
    at_interval: FailureCost | None = None


@dataclass(frozen=True)
class Estimate:
    """Everything ``lightning-nvcomp estimate`` prints.

    Attributes:
        params: model parameters.
        precision: one of :data:`PRECISIONS`.
        optimizer: one of :data:`OPTIMIZERS`.
        gpus: GPUs idle during a save.
        storage_gibps: aggregate storage bandwidth, GiB/s.
        interval_min: minutes between checkpoints.
        gpu_hour_usd: price of one GPU-hour.
        mtbf_hours: mean time between job failures, hours (None: failures not estimated).
        components: the checkpoint's tensor classes.
        rows: uncompressed first, then each codec.
        notes: caveats worth printing (assumptions that do not hold for these inputs).
    """

    params: float
    precision: str
    optimizer: str
    gpus: int
    storage_gibps: float
    interval_min: float
    gpu_hour_usd: float
    mtbf_hours: float | None
    components: list[Component]
    rows: list[CodecRow]
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> float:
        """Uncompressed checkpoint bytes."""
        return sum(c.nbytes for c in self.components)


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


def write_seconds(nbytes: float, storage_gibps: float) -> float:
    """Seconds to write (or read) ``nbytes`` at ``storage_gibps`` GiB/s.

    Args:
        nbytes: bytes.
        storage_gibps: aggregate storage bandwidth in GiB/s (> 0).
    """
    return nbytes / (storage_gibps * GIB)


def checkpoints_per_month(interval_s: float) -> float:
    """Checkpoints in a 30-day month, one every ``interval_s`` seconds.

    Args:
        interval_s: seconds between checkpoints (> 0).
    """
    return MONTH_S / interval_s


def gpu_hours_cost(seconds: float, gpus: int, gpu_hour_usd: float) -> tuple[float, float]:
    """(GPU-hours, dollars) of ``seconds`` of wall time during which all ``gpus`` sit idle.

    Args:
        seconds: wall seconds.
        gpus: GPUs idle for all of them.
        gpu_hour_usd: price of one GPU-hour.
    """
    gpu_hours = seconds / 3600 * gpus
    return gpu_hours, gpu_hours * gpu_hour_usd


def idle_cost(write_s: float, interval_s: float, gpus: int, gpu_hour_usd: float) -> IdleCost:
    """Idle GPU time of synchronous checkpoints taking ``write_s`` each, one every ``interval_s``.

    Args:
        write_s: wall seconds per checkpoint (all GPUs idle).
        interval_s: seconds between checkpoints.
        gpus: GPUs in the job.
        gpu_hour_usd: price of one GPU-hour.
    """
    per_month = checkpoints_per_month(interval_s)
    gpu_hours, usd = gpu_hours_cost(write_s * per_month, gpus, gpu_hour_usd)
    return IdleCost(write_s, per_month, gpu_hours, usd)


def young_daly_interval_s(write_s: float, mtbf_hours: float) -> float:
    """The Young/Daly first-order optimal checkpoint interval, ``sqrt(2 * C * MTBF)``, in seconds.

    Args:
        write_s: checkpoint write time ``C``, seconds.
        mtbf_hours: the job's mean time between failures, hours (valid when ``C`` is much smaller).
    """
    return math.sqrt(2 * write_s * mtbf_hours * 3600)


def failure_cost(interval_s: float, read_s: float, mtbf_hours: float, gpus: int, gpu_hour_usd: float) -> FailureCost:
    """Expected work lost to failures: per failure half an interval of compute plus reading the checkpoint back.

    Args:
        interval_s: seconds between checkpoints.
        read_s: seconds to read the checkpoint at restart (all GPUs idle).
        mtbf_hours: the job's mean time between failures, hours.
        gpus: GPUs in the job.
        gpu_hour_usd: price of one GPU-hour.
    """
    lost = interval_s / 2 + read_s
    failures = MONTH_S / (mtbf_hours * 3600)
    gpu_hours, usd = gpu_hours_cost(lost * failures, gpus, gpu_hour_usd)
    return FailureCost(interval_s, lost, failures, gpu_hours, usd)


def compression_hidden(codec: str, gpus: int, storage_gibps: float, ratio: float) -> bool | None:
    """Whether ``gpus`` encoding at the slowest measured end-to-end rate keep pace with the storage.

    Storage absorbing ``storage_gibps`` of compressed bytes needs ``storage_gibps * ratio`` of raw bytes encoded per
    second, spread over all GPUs (sharded save).

    Args:
        codec: codec key; None is returned for codecs without a measured rate.
        gpus: GPUs encoding their shards in parallel.
        storage_gibps: aggregate storage bandwidth, GiB/s.
        ratio: the codec's ratio on this checkpoint.
    """
    rate = MEASURED_E2E_ENCODE_BPS.get(codec)
    if rate is None:
        return None
    return gpus * rate >= storage_gibps * GIB * ratio


def estimate(
    params: float,
    gpus: int,
    storage_gibps: float,
    interval_min: float,
    gpu_hour_usd: float,
    *,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    master_weights: bool = False,
    gradients: bool = True,
    mtbf_hours: float | None = None,
    ratios: Mapping[str, float] | None = None,
) -> Estimate:
    """Cost of synchronous checkpoints, uncompressed and with each codec.

    Args:
        params: model parameters.
        gpus: GPUs idle during each save.
        storage_gibps: aggregate storage write (and restart read) bandwidth, GiB/s.
        interval_min: minutes between checkpoints.
        gpu_hour_usd: price of one GPU-hour.
        precision: see :func:`checkpoint_components`.
        optimizer: see :func:`checkpoint_components`.
        master_weights: see :func:`checkpoint_components`.
        gradients: see :func:`checkpoint_components`.
        mtbf_hours: the job's mean time between failures; None: no failure estimate.
        ratios: whole-checkpoint ratio per codec, replacing the measured defaults (``gans``, ``zstd``) or adding
            codecs (any other name, e.g. ``blog=1.18``).

    Raises:
        ValueError: a number out of range, an unknown precision or optimizer.
    """
    for name, value in (
        ("gpus", gpus),
        ("storage_gibps", storage_gibps),
        ("interval_min", interval_min),
        ("gpu_hour_usd", gpu_hour_usd),
        ("mtbf_hours", mtbf_hours),
    ):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
    components = checkpoint_components(params, precision, optimizer, master_weights=master_weights, gradients=gradients)
    overrides = dict(ratios or {})
    for codec, ratio in overrides.items():
        if not (ratio > 0 and math.isfinite(ratio)):
            raise ValueError(f"ratio for {codec} must be a finite number > 0, got {ratio}")
    raw = sum(c.nbytes for c in components)
    interval_s = interval_min * 60
    choices: list[tuple[str, str, float, bool]] = [("none", "uncompressed", 1.0, False)]
    for codec in CODECS:
        if codec in overrides:
            choices.append((codec, CODEC_NAMES[codec], overrides[codec], True))
        else:
            choices.append((codec, CODEC_NAMES[codec], effective_ratio(components, codec), False))
    choices += [(codec, codec, ratio, True) for codec, ratio in overrides.items() if codec not in CODECS]

    rows, notes = [], []
    for codec, label, ratio, overridden in choices:
        nbytes = raw / ratio
        write_s = write_seconds(nbytes, storage_gibps)
        row = CodecRow(codec, label, ratio, nbytes, idle_cost(write_s, interval_s, gpus, gpu_hour_usd), overridden)
        if codec != "none":
            row = replace(row, hidden=compression_hidden(codec, gpus, storage_gibps, ratio))
        if mtbf_hours is not None:
            best = young_daly_interval_s(write_s, mtbf_hours)
            row = replace(
                row,
                optimal=failure_cost(best, write_s, mtbf_hours, gpus, gpu_hour_usd),
                optimal_idle=idle_cost(write_s, best, gpus, gpu_hour_usd),
                at_interval=failure_cost(interval_s, write_s, mtbf_hours, gpus, gpu_hour_usd),
            )
        rows.append(row)

    if rows[0].idle.write_s > interval_s:
        notes.append(
            f"an uncompressed checkpoint takes {rows[0].idle.write_s:.0f} s, longer than the {interval_min:g} min "
            "interval: the job would do nothing but checkpoint"
        )
    for row in rows:
        if row.hidden is False:
            rate = MEASURED_E2E_ENCODE_BPS[row.codec]
            notes.append(
                f"{row.label}: {gpus} GPU(s) at the slowest measured end-to-end encode rate ({rate / 1e9:.1f} GB/s "
                f"each) may not keep pace with {storage_gibps:g} GiB/s of storage; compression may not be fully "
                "hidden and its savings are overstated"
            )
    if mtbf_hours is not None and rows[0].optimal is not None and rows[0].optimal.interval_s > mtbf_hours * 3600:
        notes.append("the Young/Daly interval exceeds the MTBF: its first-order formula is not valid here")
    return Estimate(
        params=params,
        precision=precision,
        optimizer=optimizer,
        gpus=gpus,
        storage_gibps=storage_gibps,
        interval_min=interval_min,
        gpu_hour_usd=gpu_hour_usd,
        mtbf_hours=mtbf_hours,
        components=components,
        rows=rows,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------------- rendering


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Columns padded to their widest cell: the first ``left`` left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i < left else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in (header, *rows)
    ]
    return "\n".join(line.rstrip() for line in lines)


def _count(n: float) -> str:
    """``70.0B``, ``1.5T``, ``350.0M``: a parameter count."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:g}"


def _num(x: float, decimals: int = 0) -> str:
    """``35,246`` or ``156.5``: thousands separated; small values keep 3 significant digits (``0.466``)."""
    if 0 < abs(x) < 10 ** (2 - decimals):
        return f"{x:.3g}"
    return f"{x:,.{decimals}f}"


def _usd(x: float) -> str:
    """``$35,246``; below $100 with cents (``$54.12``)."""
    return f"${x:,.0f}" if abs(x) >= 100 else f"${x:.2f}"


def render(est: Estimate) -> str:
    """The text ``lightning-nvcomp estimate`` prints for ``est``.

    Args:
        est: the result of :func:`estimate`.
    """
    out: list[str] = []
    raw = est.nbytes
    per_month = est.rows[0].idle.checkpoints_per_month
    out.append(
        f"Checkpoint cost: {_count(est.params)} params, {est.precision}, optimizer {est.optimizer}, {est.gpus} GPU{'s' if est.gpus > 1 else ''}, "
        f"storage {est.storage_gibps:g} GiB/s, every {est.interval_min:g} min ({per_month:,.6g} checkpoints per "
        f"30-day month), ${est.gpu_hour_usd:.2f}/GPU-hour"
    )
    out.append("Units: GiB = 2^30 bytes; storage bandwidth is read as GiB/s (so 782 GiB at 5 GiB/s = 156 s).")
    out.append("")

    shown = [c for c in CODECS if not any(r.codec == c and r.overridden for r in est.rows)]
    header = ["component", "dtype", "bytes/param", "size GiB", *(f"{CODEC_NAMES[c]} ratio" for c in shown)]
    rows = [
        [
            c.name,
            c.dtype,
            f"{c.bytes_per_param:g}",
            _num(c.nbytes / GIB, 1),
            *(f"{c.ratios[codec]:.3f}{'*' if c.assumed else ' '}" for codec in shown),
        ]
        for c in est.components
    ]
    totals = {r.codec: r.ratio for r in est.rows}
    rows.append(["total", "", f"{raw / est.params:g}", _num(raw / GIB, 1), *(f"{totals[c]:.3f} " for c in shown)])
    out.append(_table(header, rows, left=2))
    if any(c.assumed for c in est.components):
        out.append("* not measured: borrowed from a similar measured class (see estimate.py); --ratio overrides")
    out.append("Default ratios: measured on an H200, benchmarks/results/codec.md (2026-11-29).")
    out.append("")

    base = est.rows[0]
    out.append(
        "Synchronous saves (every GPU idle until the bytes are on storage; compression assumed hidden behind the "
        "write, as benchmarked):"
    )
    header = ["codec", "ratio", "size GiB", "idle s/ckpt", "GPU-s/ckpt", "idle GPU-h/month", "$/month", "saved $/month"]
    rows = []
    for r in est.rows:
        ratio = f"{r.ratio:.3f}{' (--ratio)' if r.overridden else ''}"
        saved = "" if r.codec == "none" else _usd(base.idle.usd_month - r.idle.usd_month)
        rows.append(
            [
                r.label,
                ratio,
                _num(r.nbytes / GIB, 1),
                _num(r.idle.write_s, 1),
                _num(r.idle.write_s * est.gpus),
                _num(r.idle.gpu_hours_month),
                _usd(r.idle.usd_month),
                saved,
            ]
        )
    out.append(_table(header, rows))

    if est.mtbf_hours is not None:
        first = est.rows[0].optimal
        assert first is not None
        out.append("")
        out.append(
            f"Failures: MTBF {est.mtbf_hours:g} h ({first.failures_per_month:,.6g} per month). Lost per failure = half "
            "an interval of compute + reading the checkpoint back (same bandwidth), all GPUs idle."
        )
        header = [
            "codec",
            "write s",
            "Young/Daly min",
            "lost s/failure",
            "lost $/month",
            "ckpt $/month",
            "total $/month",
            "saved $/month",
        ]
        rows = []
        base_total = 0.0
        for r in est.rows:
            assert r.optimal is not None and r.optimal_idle is not None
            total = r.optimal.usd_month + r.optimal_idle.usd_month
            if r.codec == "none":
                base_total = total
            rows.append(
                [
                    r.label,
                    _num(r.idle.write_s, 1),
                    _num(r.optimal.interval_s / 60, 1),
                    _num(r.optimal.lost_s_per_failure),
                    _usd(r.optimal.usd_month),
                    _usd(r.optimal_idle.usd_month),
                    _usd(total),
                    "" if r.codec == "none" else _usd(base_total - total),
                ]
            )
        out.append("At the Young/Daly interval sqrt(2 * write s * MTBF):")
        out.append(_table(header, rows))
        header = [
            "codec",
            "lost s/failure",
            "lost GPU-h/month",
            "lost $/month",
            "ckpt $/month",
            "total $/month",
            "saved $/month",
        ]
        rows = []
        for r in est.rows:
            assert r.at_interval is not None
            total = r.at_interval.usd_month + r.idle.usd_month
            if r.codec == "none":
                base_total = total
            rows.append(
                [
                    r.label,
                    _num(r.at_interval.lost_s_per_failure),
                    _num(r.at_interval.gpu_hours_month),
                    _usd(r.at_interval.usd_month),
                    _usd(r.idle.usd_month),
                    _usd(total),
                    "" if r.codec == "none" else _usd(base_total - total),
                ]
            )
        out.append(f"At --interval-min {est.interval_min:g}:")
        out.append(_table(header, rows))

    for note in est.notes:
        out.append(f"note: {note}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------- arguments


def parse_count(text: str) -> float:
    """A parameter count: ``70e9``, ``70000000000``, ``70B``, ``1.5T``, ``350M`` (K, M, B or G, T suffixes).

    Args:
        text: the count as typed.

    Raises:
        ValueError: not a number, not finite or not > 0.
    """
    s = text.strip().replace("_", "")
    scale = 1.0
    if s and s[-1].lower() in _MULTIPLIERS:
        scale, s = _MULTIPLIERS[s[-1].lower()], s[:-1]
    value = float(s) * scale  # ValueError for junk
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def arg_params(text: str) -> float:
    """argparse ``type=`` for ``--params``: :func:`parse_count`, errors as argparse errors.

    Args:
        text: the option's value.
    """
    try:
        return parse_count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a parameter count > 0 such as 70e9 or 70B, got {text!r}") from None


def arg_positive_float(text: str) -> float:
    """argparse ``type=``: a finite float > 0.

    Args:
        text: the option's value.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def arg_positive_int(text: str) -> int:
    """argparse ``type=``: an integer > 0.

    Args:
        text: the option's value.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}")
    return value


_CODEC_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]*")


def arg_ratio(text: str) -> tuple[str, float]:
    """argparse ``type=`` for ``--ratio CODEC=R``: (codec key, ratio), ratio a finite number > 0.

    ``gans`` (or ``ans``) and ``zstd`` replace the measured defaults; any other name adds a codec.

    Args:
        text: the option's value.
    """
    name, sep, value = text.partition("=")
    name = name.strip().lower()
    try:
        ratio = float(value)
    except ValueError:
        ratio = math.nan
    if not sep or not _CODEC_RE.fullmatch(name) or not (ratio > 0 and math.isfinite(ratio)):
        raise argparse.ArgumentTypeError(
            f"expected CODEC=RATIO with a ratio > 0 (raw bytes / stored bytes), e.g. gans=1.30, got {text!r}"
        )
    if name in ("none", "uncompressed", "raw"):
        raise argparse.ArgumentTypeError(f"{name!r} is the uncompressed baseline (ratio 1); name a codec")
    return CODEC_ALIASES.get(name, name), ratio
