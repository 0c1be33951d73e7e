"""``lightning-nvcomp estimate``: what synchronous checkpoints cost in idle GPU time and dollars, uncompressed and
with each codec. The numbers come from :mod:`lightning_nvcomp.telemetry.estimate` (the cost model); this module reads the
options and prints the tables."""

from __future__ import annotations

import argparse
import math
import re

from lightning_nvcomp.cli.common import add_command, positive_float, positive_int
from lightning_nvcomp.cli.table import table
from lightning_nvcomp.telemetry import estimate as costs
from lightning_nvcomp.telemetry.components import CODEC_NAMES, CODECS, OPTIMIZERS, PRECISIONS
from lightning_nvcomp.telemetry.estimate import GIB, CodecRow, Estimate

# ---------------------------------------------------------------------------------------------------- arguments

#: Other spellings accepted by :func:`arg_ratio` (``ans`` is what ``save(codec=...)`` calls gANS).
CODEC_ALIASES = {"ans": "gans"}
_MULTIPLIERS = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_CODEC_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]*")


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


#: The command's line in the top-level help, and its own help's description.
SUMMARY = "estimate idle GPU time and dollars spent on checkpoints, uncompressed vs gANS / zstd"
DESCRIPTION = (
    "Estimate the checkpoint size by component, the GPU time a synchronous save leaves idle and what it costs per "
    "month, uncompressed and with each codec (ratios measured on an H200 by benchmarks/codec_bench.py), and with "
    "--mtbf-hours the Young/Daly interval and the work lost to failures. Units: sizes in GiB (2^30 bytes), storage "
    "bandwidth in GiB/s. The defaults are the published case (70B, bf16-mixed, AdamW, gradients included: ~782 GiB, "
    "~156 s at 5 GiB/s). Assumes a sharded save (each GPU compresses its own shard) with compression hidden behind "
    "the write; a month is 30 days."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``estimate`` command to the top-level parser's ``subparsers``."""
    parser = add_command(subparsers, "estimate", run, SUMMARY, DESCRIPTION)
    _add_job_options(parser)
    _add_state_options(parser)
    _add_model_options(parser)


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    """The job's options: its model's size, its GPUs, its storage, how often it saves and what a GPU-hour costs."""
    add = parser.add_argument
    add("--params", type=arg_params, default=70e9, help="model parameters, e.g. 70e9 or 70B (default: 70e9)")
    add("--gpus", type=positive_int, default=128, help="GPUs in the job, all idle during a save (default: 128)")
    add(
        "--storage-gbps",
        type=positive_float,
        default=5.0,
        metavar="GIB_PER_S",
        help="aggregate storage bandwidth shared by all GPUs, read as GiB/s (2^30 bytes/s), used for writes and "
        "restart reads (default: 5)",
    )
    add(
        "--interval-min",
        type=positive_float,
        default=30.0,
        metavar="MIN",
        help="minutes between checkpoints (default: 30)",
    )
    add(
        "--gpu-hour-usd",
        type=positive_float,
        default=4.40,
        metavar="USD",
        help="price of one GPU-hour in dollars (default: 4.40)",
    )


def _add_state_options(parser: argparse.ArgumentParser) -> None:
    """What each parameter stores in the checkpoint: the optimizer's state, the precision, master weights, gradients."""
    add = parser.add_argument
    add(
        "--optimizer",
        choices=OPTIMIZERS,
        default="adamw",
        help="adamw: fp32 m and v (8 bytes/param); sgd: fp32 momentum (4); none (default: adamw)",
    )
    add(
        "--precision",
        choices=PRECISIONS,
        default="bf16-mixed",
        help="bf16-mixed: bf16 weights and gradients; fp32: fp32 weights and gradients; fp8: fp8 weights, bf16 "
        "gradients (default: bf16-mixed)",
    )
    add(
        "--master-weights",
        action="store_true",
        help="add fp32 master weights (4 bytes/param), as real mixed precision keeps; off by default to match the "
        "published case; no effect with fp32",
    )
    add(
        "--no-grads",
        dest="gradients",
        action="store_false",
        help="leave gradients out (the published case includes them; Lightning checkpoints don't)",
    )


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    """What the cost model is given beyond its defaults: the job's failure rate, and compression ratios of its own."""
    add = parser.add_argument
    add(
        "--mtbf-hours",
        type=positive_float,
        metavar="H",
        help="mean time between failures of the whole job, hours: adds the Young/Daly interval sqrt(2 * write time "
        "* MTBF) and the work lost per failure (half an interval + the restart read) and per month",
    )
    add(
        "--ratio",
        type=arg_ratio,
        action="extend",
        nargs="+",
        metavar="CODEC=R",
        help="whole-checkpoint compression ratio replacing a measured default (gans or ans, zstd) or adding a codec "
        "(any other name, e.g. blog=1.18); R > 0",
    )


def run(args: argparse.Namespace) -> int:
    """Print what synchronous checkpoints cost in idle GPU time and dollars, uncompressed and with each codec."""
    result = costs.estimate(
        args.params,
        args.gpus,
        args.storage_gbps,
        args.interval_min,
        args.gpu_hour_usd,
        precision=args.precision,
        optimizer=args.optimizer,
        master_weights=args.master_weights,
        gradients=args.gradients,
        mtbf_hours=args.mtbf_hours,
        ratios=dict(args.ratio or []),
    )
    print(render(result))
    return 0


# ---------------------------------------------------------------------------------------------------- rendering


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


def _costs_table(header: list[str], est: Estimate, cells: list[list[str]], usd_months: list[float]) -> str:
    """One row per codec: its ``cells``, its dollars per month and what it saves on the uncompressed first row."""
    base = usd_months[0]
    rows = [
        [*row, _usd(usd), "" if r.codec == "none" else _usd(base - usd)]
        for r, row, usd in zip(est.rows, cells, usd_months)
    ]
    return table(header, rows, right=range(1, len(header)))


def _heading(est: Estimate) -> list[str]:
    """The case estimated, and the units with this case's own uncompressed save as their example."""
    uncompressed = est.rows[0]
    per_month = uncompressed.idle.checkpoints_per_month
    gpus = f"{est.gpus} GPU{'s' if est.gpus > 1 else ''}"
    return [
        f"Checkpoint cost: {_count(est.params)} params, {est.precision}, optimizer {est.optimizer}, {gpus}, "
        f"storage {est.storage_gibps:g} GiB/s, every {est.interval_min:g} min ({per_month:,.6g} checkpoints per "
        f"30-day month), ${est.gpu_hour_usd:.2f}/GPU-hour",
        f"Units: GiB = 2^30 bytes; storage bandwidth is read as GiB/s (so {_num(uncompressed.nbytes / GIB)} GiB at "
        f"{est.storage_gibps:g} GiB/s = {_num(uncompressed.idle.write_s)} s).",
        "",
    ]


def _components(est: Estimate) -> list[str]:
    """The checkpoint by component with the default ratio of each codec that ``--ratio`` did not replace."""
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
    raw = est.nbytes
    rows.append(["total", "", f"{raw / est.params:g}", _num(raw / GIB, 1), *(f"{totals[c]:.3f} " for c in shown)])
    lines = [table(header, rows, right=range(2, len(header)))]
    if any(c.assumed for c in est.components):
        lines.append(
            "* not measured: borrowed from a similar measured class (see lightning_nvcomp/telemetry/components.py); "
            "--ratio overrides"
        )
    return [*lines, "Default ratios: measured on an H200 by benchmarks/codec_bench.py (2026-11-29).", ""]


def _synchronous(est: Estimate) -> list[str]:
    """Idle time and dollars of synchronous saves at the chosen interval, per codec."""
    header = ["codec", "ratio", "size GiB", "idle s/ckpt", "GPU-s/ckpt", "idle GPU-h/month", "$/month", "saved $/month"]
    cells = [
        [
            r.label,
            f"{r.ratio:.3f}{' (--ratio)' if r.overridden else ''}",
            _num(r.nbytes / GIB, 1),
            _num(r.idle.write_s, 1),
            _num(r.idle.write_s * est.gpus),
            _num(r.idle.gpu_hours_month),
        ]
        for r in est.rows
    ]
    return [
        "Synchronous saves (every GPU idle until the bytes are on storage; compression assumed hidden behind the "
        "write, as benchmarked):",
        _costs_table(header, est, cells, [r.idle.usd_month for r in est.rows]),
    ]


def _at_optimal(r: CodecRow) -> tuple[list[str], float]:
    """A row of the Young/Daly table: its cells before the totals, and its total dollars per month."""
    assert r.optimal is not None and r.optimal_idle is not None
    cells = [
        r.label,
        _num(r.idle.write_s, 1),
        _num(r.optimal.interval_s / 60, 1),
        _num(r.optimal.lost_s_per_failure),
        _usd(r.optimal.usd_month),
        _usd(r.optimal_idle.usd_month),
    ]
    return cells, r.optimal.usd_month + r.optimal_idle.usd_month


def _at_interval(r: CodecRow) -> tuple[list[str], float]:
    """A row of the chosen interval's failure table: its cells before the totals, and its total dollars per month."""
    assert r.at_interval is not None
    cells = [
        r.label,
        _num(r.at_interval.lost_s_per_failure),
        _num(r.at_interval.gpu_hours_month),
        _usd(r.at_interval.usd_month),
        _usd(r.idle.usd_month),
    ]
    return cells, r.at_interval.usd_month + r.idle.usd_month


def _failures(est: Estimate) -> list[str]:
    """Work lost to failures plus checkpoints, at the Young/Daly interval and at the chosen one, per codec."""
    first = est.rows[0].optimal
    assert first is not None
    lines = [
        "",
        f"Failures: MTBF {est.mtbf_hours:g} h ({first.failures_per_month:,.6g} per month). Lost per failure = half "
        "an interval of compute + reading the checkpoint back (same bandwidth), all GPUs idle.",
    ]
    for title, row, header in (
        (
            "At the Young/Daly interval sqrt(2 * write s * MTBF):",
            _at_optimal,
            ["codec", "write s", "Young/Daly min", "lost s/failure", "lost $/month", "ckpt $/month"],
        ),
        (
            f"At --interval-min {est.interval_min:g}:",
            _at_interval,
            ["codec", "lost s/failure", "lost GPU-h/month", "lost $/month", "ckpt $/month"],
        ),
    ):
        cells, usd = zip(*(row(r) for r in est.rows))
        lines += [title, _costs_table([*header, "total $/month", "saved $/month"], est, list(cells), list(usd))]
    return lines


def render(est: Estimate) -> str:
    """The text ``lightning-nvcomp estimate`` prints for ``est``.

    Args:
        est: the result of :func:`lightning_nvcomp.telemetry.estimate.estimate`.
    """
    lines = [*_heading(est), *_components(est), *_synchronous(est)]
    if est.mtbf_hours is not None:
        lines += _failures(est)
    lines += [f"note: {note}" for note in est.notes]
    return "\n".join(lines)
