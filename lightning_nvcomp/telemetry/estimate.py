"""What synchronous checkpoints cost in idle GPU time and dollars, uncompressed and with each codec.

The cost model behind ``lightning-nvcomp estimate``: dataclasses and pure functions computing numbers, no IO
(:mod:`lightning_nvcomp.cli.estimate` reads the options and prints the tables).

Units. Sizes are GiB (2**30 bytes) and storage bandwidth is GiB/s. The published case (NVIDIA's nvCOMP blog: 70B
parameters, bf16-mixed, AdamW, gradients included, 5 GB/s of storage) reads this way: 70e9 params x 12 bytes =
840e9 bytes = 782.3 GiB, and 782.3 GiB / 5 GiB/s = 156.5 s. Reading "5 GB/s" as decimal 5e9 bytes/s instead would
give 168 s (7% more).

Model of a checkpoint. A synchronous save stops every GPU until the whole checkpoint is on storage, so the idle
time per checkpoint is ``checkpoint bytes / aggregate storage bandwidth`` (the bandwidth all GPUs share). The save
is assumed sharded (FSDP / torch.distributed.checkpoint: each GPU compresses and writes its own shard) and
compression is assumed hidden behind the write, as the benchmarks measure (benchmarks/results/lightning.md in git history: sync
save wall time <= 1.05 x compressed bytes / storage bandwidth + 0.2 s), so a compressed checkpoint costs
``bytes / ratio / bandwidth``. :func:`compression_hidden` checks that assumption against the slowest end-to-end
encode rate measured per GPU. A month is 30 days; it holds ``30 * 24 * 60 / interval_min`` checkpoints.

The checkpoint's classes of tensors, their sizes and their measured compression ratios are in
:mod:`.components`.

Failures. Given the job's mean time between failures (any failure that stops the whole job), the Young/Daly
first-order optimal interval is ``sqrt(2 * C * MTBF)`` with ``C`` the checkpoint write time. The work lost per
failure is taken as half an interval of compute (failures fall uniformly within an interval) plus the restart's
read of the checkpoint back from storage (at the same bandwidth, compressed bytes, decode hidden like encode);
every GPU is idle for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from lightning_nvcomp.telemetry.components import CODEC_NAMES, CODECS, Component, checkpoint_components, effective_ratio

GIB = 2**30
#: Seconds in the 30-day month used for every monthly figure.
MONTH_S = 30 * 24 * 3600

#: Slowest end-to-end encode rate per GPU measured for each codec, bytes/s (codec.md, "e2e enc" columns: gANS
#: 1.4 GB/s on fp32 weights, zstd 0.9 GB/s on bf16 weights; includes planes, D2H copies and CRC-32).
MEASURED_E2E_ENCODE_BPS = {"gans": 1.4e9, "zstd": 0.9e9}


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
        precision: one of :data:`~.components.PRECISIONS`.
        optimizer: one of :data:`~.components.OPTIMIZERS`.
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
        precision: see :func:`~.components.checkpoint_components`.
        optimizer: see :func:`~.components.checkpoint_components`.
        master_weights: see :func:`~.components.checkpoint_components`.
        gradients: see :func:`~.components.checkpoint_components`.
        mtbf_hours: the job's mean time between failures; None: no failure estimate.
        ratios: whole-checkpoint ratio per codec, replacing the measured defaults (``gans``, ``zstd``) or adding
            codecs (any other name, e.g. ``blog=1.18``).

    Raises:
        ValueError: a number out of range, an unknown precision or optimizer.
    """
    _check_positive(
        gpus=gpus,
        storage_gibps=storage_gibps,
        interval_min=interval_min,
        gpu_hour_usd=gpu_hour_usd,
        mtbf_hours=mtbf_hours,
    )
    components = checkpoint_components(params, precision, optimizer, master_weights=master_weights, gradients=gradients)
    choices = _codec_ratios(components, ratios or {})
    est = Estimate(
        params=params,
        precision=precision,
        optimizer=optimizer,
        gpus=gpus,
        storage_gibps=storage_gibps,
        interval_min=interval_min,
        gpu_hour_usd=gpu_hour_usd,
        mtbf_hours=mtbf_hours,
        components=components,
        rows=[],
    )
    est = replace(est, rows=[_codec_row(est, *choice) for choice in choices])
    return replace(est, notes=_notes(est))


def _check_positive(**values: float | None) -> None:
    """Raise ValueError naming the first value that is given (not None) and is not a finite number > 0."""
    for name, value in values.items():
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number > 0, got {value}")


def _codec_ratios(
    components: Sequence[Component], overrides: Mapping[str, float]
) -> list[tuple[str, str, float, bool]]:
    """(codec, label, whole-checkpoint ratio, overridden) of each row: uncompressed, the measured codecs (or their
    ``overrides``), then the codecs only the overrides name."""
    for codec, ratio in overrides.items():
        if not (ratio > 0 and math.isfinite(ratio)):
            raise ValueError(f"ratio for {codec} must be a finite number > 0, got {ratio}")
    choices: list[tuple[str, str, float, bool]] = [("none", "uncompressed", 1.0, False)]
    for codec in CODECS:
        if codec in overrides:
            choices.append((codec, CODEC_NAMES[codec], overrides[codec], True))
        else:
            choices.append((codec, CODEC_NAMES[codec], effective_ratio(components, codec), False))
    return choices + [(codec, codec, ratio, True) for codec, ratio in overrides.items() if codec not in CODECS]


def _codec_row(est: Estimate, codec: str, label: str, ratio: float, overridden: bool) -> CodecRow:
    """The costs of checkpointing ``est``'s model with one codec at ``ratio``."""
    nbytes = est.nbytes / ratio
    write_s = write_seconds(nbytes, est.storage_gibps)
    interval_s = est.interval_min * 60
    row = CodecRow(codec, label, ratio, nbytes, idle_cost(write_s, interval_s, est.gpus, est.gpu_hour_usd), overridden)
    if codec != "none":
        row = replace(row, hidden=compression_hidden(codec, est.gpus, est.storage_gibps, ratio))
    if est.mtbf_hours is None:
        return row
    best = young_daly_interval_s(write_s, est.mtbf_hours)
    return replace(
        row,
        optimal=failure_cost(best, write_s, est.mtbf_hours, est.gpus, est.gpu_hour_usd),
        optimal_idle=idle_cost(write_s, best, est.gpus, est.gpu_hour_usd),
        at_interval=failure_cost(interval_s, write_s, est.mtbf_hours, est.gpus, est.gpu_hour_usd),
    )


def _notes(est: Estimate) -> list[str]:
    """The caveats worth printing: the assumptions that do not hold for ``est``'s inputs."""
    notes = []
    base = est.rows[0]
    if base.idle.write_s > est.interval_min * 60:
        notes.append(
            f"an uncompressed checkpoint takes {base.idle.write_s:.0f} s, longer than the {est.interval_min:g} min "
            "interval: the job would do nothing but checkpoint"
        )
    for row in est.rows:
        if row.hidden is False:
            rate = MEASURED_E2E_ENCODE_BPS[row.codec]
            notes.append(
                f"{row.label}: {est.gpus} GPU(s) at the slowest measured end-to-end encode rate ({rate / 1e9:.1f} "
                f"GB/s each) may not keep pace with {est.storage_gibps:g} GiB/s of storage; compression may not be "
                "fully hidden and its savings are overstated"
            )
    if est.mtbf_hours is not None and base.optimal is not None and base.optimal.interval_s > est.mtbf_hours * 3600:
        notes.append("the Young/Daly interval exceeds the MTBF: its first-order formula is not valid here")
    return notes
