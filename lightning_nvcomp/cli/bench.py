"""``lightning-nvcomp bench --dir DIR``: measure a checkpoint directory and the codecs, predict and time a save
with each, and show the codec ``codec="auto"`` would choose."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import torch

from lightning_nvcomp import format as fileformat
from lightning_nvcomp.auto.policy import CodecPolicy
from lightning_nvcomp.auto.prediction import Prediction, choose, predict
from lightning_nvcomp.auto.probe import measure_bandwidth
from lightning_nvcomp.cli.common import EXIT_UNAVAILABLE, add_command, fail, positive_float, positive_int
from lightning_nvcomp.cli.table import table
from lightning_nvcomp.saving import single_file as saving
from lightning_nvcomp.storage import Storage, ThrottledStorage

#: The command's line in the top-level help, and its own help's description.
SUMMARY = "measure a checkpoint directory and the codecs; predict and time a save with each"
DESCRIPTION = (
    "Probe the write bandwidth of DIR (write + fsync) --rounds times, calibrate every codec available here on a "
    "trained-like state (or --state FILE), print the predicted save time of each codec next to the median and "
    "spread of --rounds measured saves, and the codec that codec='auto' would choose."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` command to the top-level parser's ``subparsers``."""
    parser = add_command(subparsers, "bench", run, SUMMARY, DESCRIPTION, subject="dir", measures=True)
    parser.add_argument("--dir", required=True, help="the checkpoint directory to measure")
    parser.add_argument("--state", help="a checkpoint to calibrate on instead of a generated state")
    parser.add_argument("--state-mb", type=positive_int, default=512, help="size of the generated state (MB)")
    parser.add_argument("--probe-mb", type=positive_int, default=256, help="size of the storage probe (MB)")
    parser.add_argument(
        "--throttle-mbps", type=positive_float, help="hold writes to this many MB/s (emulate slow storage)"
    )
    parser.add_argument("--mode", choices=("sync", "async"), default="sync", help="which save time matters")
    parser.add_argument("--interval-s", type=positive_float, help="seconds between saves (async mode)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where the state lives (default: cuda if present)")
    parser.add_argument("--no-measure", action="store_true", help="predict only; do not time real saves")
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="storage probes and timed saves per codec (median, spread)"
    )


# ---------------------------------------------------------------------------------------------------- measuring


def trained_like_state(nbytes: int, device: torch.device | str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state shaped like a trained model's checkpoint (fp32 weights, their bf16 copy, AdamW m and v), of about
    ``nbytes``. Synthetic values: ratios differ somewhat from a real run's; pass a real checkpoint when you can."""
    g = torch.Generator().manual_seed(seed)
    n = max(1, nbytes // 14)  # 4 (w) + 2 (bf16 w) + 4 (m) + 4 (v) bytes per parameter
    w = torch.randn(n, generator=g) * 0.02
    grad = torch.randn(n, generator=g) * 1e-3
    state = {"weights": w, "weights_bf16": w.bfloat16(), "exp_avg": grad * 0.1, "exp_avg_sq": grad.square() * 1e-3}
    return {k: v.to(device) for k, v in state.items()}


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class BenchRow:
    """One codec: its predicted save and the encode and write seconds of each real one timed (none: not timed)."""

    prediction: Prediction
    measured: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Spread:
    """The rounds of one measurement: their median and range."""

    values: tuple[float, ...]
    fmt: str = ".2f"

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def __str__(self) -> str:
        low, high, f = min(self.values), max(self.values), self.fmt
        return f"{self.median:{f}}" + (f" ({low:{f}}-{high:{f}})" if len(self.values) > 1 else "")


def _measure(directory: str, state: object, codec: str, storage: Storage) -> tuple[float, float]:
    """(encode s, write s) of a real save of ``state`` with ``codec`` into ``directory``; the file is removed."""
    path = os.path.join(directory, f".lightning-nvcomp-bench-{codec}.ckpt")
    try:
        stats = saving.save(state, path, codec, storage=storage)
        return stats.encode_s, stats.write_s
    finally:
        if os.path.exists(path):
            os.unlink(path)


def probe_rounds(directory: str, policy: CodecPolicy, storage: Storage, rounds: int) -> Spread:
    """The write bandwidth of ``directory`` in GB/s, probed ``rounds`` times (a skipped probe raises)."""
    found = []
    for _ in range(rounds):
        gbps = measure_bandwidth(directory, policy.probe_nbytes, storage)
        if gbps is None:
            raise OSError(f"too little free space in {directory} for a {policy.probe_nbytes >> 20} MB storage probe")
        found.append(gbps)
    return Spread(tuple(found))


def measure(
    directory: str,
    state: object,
    policy: CodecPolicy,
    storage: Storage,
    rounds: int = 3,
    timed: bool = True,
) -> tuple[Spread, list[BenchRow], Prediction]:
    """Probe ``directory`` ``rounds`` times, calibrate every codec on ``state``, predict each save at the median
    bandwidth and (if ``timed``) time ``rounds`` real ones. Returns the bandwidth in GB/s per writer, the rows, and
    the codec ``auto`` would choose."""
    tensors = fileformat.find_contents(state).tensors
    raw = _nbytes(tensors)
    gbps = probe_rounds(directory, policy, storage, rounds)
    predictions = [predict(raw, p, gbps.median, policy.mode, policy.interval_s) for p in policy.profiles(tensors)]
    rows = []
    for p in predictions:
        measured = tuple(_measure(directory, state, p.codec, storage) for _ in range(rounds if timed else 0))
        rows.append(BenchRow(p, measured))
    return gbps, rows, choose(predictions, policy.interval_s)


# ---------------------------------------------------------------------------------------------------- rendering

_HEADER = [
    "codec",
    "ratio",
    "encode GB/s",
    "|",
    "predicted: encode",
    "write",
    "blocked",
    "|",
    "measured: encode",
    "+write",
    "total (range)",
    "",
]
#: Each column at least as wide as in the first version of this table; "|" columns joined by single spaces make
#: " | " between the groups; the last column marks the chosen codec.
_WIDTHS = [6, 6, 11, 1, 17, 7, 8, 1, 16, 7, 7]


def _cells(row: BenchRow, raw: int, chosen: Prediction) -> list[str]:
    p = row.prediction
    speed = raw / p.encode_s / 1e9 if p.encode_s else float("inf")
    if not row.measured:
        measured = ["-", "-", "-"]
    else:
        encode, write = (Spread(tuple(m[i] for m in row.measured)) for i in (0, 1))
        total = Spread(tuple(e + w for e, w in row.measured))
        measured = [f"{encode.median:.2f}", f"{write.median:.2f}", str(total)]
    mark = " <- auto" if p.codec == chosen.codec else ""
    predicted = [f"{p.encode_s:.2f}", f"{p.write_s:.2f}", f"{p.blocked_s:.2f}"]
    return [p.codec, f"{p.ratio:.3f}", f"{speed:.1f}", "|", *predicted, "|", *measured, mark]


def format_table(
    gbps: Spread, rows: list[BenchRow], chosen: Prediction, raw: int, mode: str, synthetic: bool = False
) -> str:
    """The bench report as text: measured times are medians of the rounds, the total with its range."""
    cells = [_cells(row, raw, chosen) for row in rows]
    right = set(range(1, len(_HEADER) - 1))
    rates = Spread(tuple(g * 1e3 for g in gbps.values), fmt=".0f")
    lines = [
        f"storage: {rates} MB/s per writer (write + fsync, {len(gbps.values)} probes: median (range))   "
        f"state: {raw / 1e6:.0f} MB   mode: {mode}",
        "",
        table(_HEADER, cells, right, sep=" ", widths=_WIDTHS),
        "",
        f"recommendation: codec='{chosen.codec}' (predicted {chosen.blocked_s:.2f} s blocked per save, "
        f"ratio {chosen.ratio:.3f})",
    ]
    if synthetic:
        lines.append(
            "note: the state is synthetic (random values shaped like a trained model's): its ratios and coding "
            "speeds differ from a real run's; pass --state FILE (one of your checkpoints) to measure yours"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Probe the directory, calibrate the codecs, print predicted and measured save times per codec."""
    if os.path.exists(args.dir) and not os.path.isdir(args.dir):
        return fail(
            f"bench --dir {args.dir}: not a directory; pass the directory whose storage to measure", EXIT_UNAVAILABLE
        )
    if not os.path.isdir(args.dir):
        raise FileNotFoundError(f"bench directory {args.dir} does not exist")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    storage = ThrottledStorage(args.throttle_mbps * 1e6) if args.throttle_mbps else Storage()
    if args.state:
        state = fileformat.load(args.state, map_location=device)
    else:
        state = trained_like_state(args.state_mb << 20, device)
    policy = CodecPolicy(args.mode, args.interval_s, args.probe_mb << 20, storage)
    begin = time.perf_counter()
    gbps, rows, chosen = measure(args.dir, state, policy, storage, args.rounds, timed=not args.no_measure)
    raw = _nbytes(fileformat.find_contents(state).tensors)
    print(format_table(gbps, rows, chosen, raw, args.mode, synthetic=not args.state))
    print(f"(bench took {time.perf_counter() - begin:.1f} s)")
    return 0
