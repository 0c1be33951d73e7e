"""``lightning-nvcomp bench``: measure a checkpoint directory and the codecs, predict and time a save with each."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from lightning_nvcomp import container
from lightning_nvcomp.policy import CodecPolicy, Prediction, choose, predict
from lightning_nvcomp.storage import Storage, ThrottledStorage


def trained_like_state(nbytes: int, device: torch.device | str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state shaped like a trained model's checkpoint (fp32 weights, their bf16 copy, AdamW m and v), of about
    ``nbytes``. Synthetic values: ratios differ somewhat from a real run's; pass a real checkpoint when you can."""
    g = torch.Generator().manual_seed(seed)
    n = max(1, nbytes // 14)  # 4 (w) + 2 (bf16 w) + 4 (m) + 4 (v) bytes per parameter
    w = torch.randn(n, generator=g) * 0.02
    grad = torch.randn(n, generator=g) * 1e-3
    state = {"weights": w, "weights_bf16": w.bfloat16(), "exp_avg": grad * 0.1, "exp_avg_sq": grad.square() * 1e-3}
    return {k: v.to(device) for k, v in state.items()}


@dataclass(frozen=True)
class BenchRow:
    prediction: Prediction
    measured_encode_s: float | None
    measured_write_s: float | None


def run(
    directory: str,
    state: object,
    policy: CodecPolicy,
    storage: Storage,
    measure: bool = True,
) -> tuple[float, list[BenchRow], Prediction]:
    """Probe ``directory``, calibrate every codec on ``state``, predict each save and (if ``measure``) time a real
    one. Returns the per-writer bandwidth in GB/s, the rows, and the codec ``auto`` would choose."""
    tensors = container._find_tensors(state)
    raw = sum(t.numel() * t.element_size() for t in tensors)
    gbps = policy.write_gbps(directory)
    predictions = [predict(raw, p, gbps, policy.mode, policy.interval_s) for p in policy.profiles(tensors)]
    rows = []
    for p in predictions:
        encode_s = write_s = None
        if measure:
            path = os.path.join(directory, f".lightning-nvcomp-bench-{p.codec}.ckpt")
            try:
                stats = container.save(state, path, p.codec, storage=storage)
                encode_s, write_s = stats.encode_s, stats.write_s
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        rows.append(BenchRow(p, encode_s, write_s))
    return gbps, rows, choose(predictions)


def format_table(gbps: float, rows: list[BenchRow], chosen: Prediction, raw_nbytes: int, mode: str) -> str:
    """The bench report as text."""
    lines = [
        f"storage: {gbps * 1e3:.0f} MB/s per writer (write + fsync)   state: {raw_nbytes / 1e6:.0f} MB   mode: {mode}",
        "",
        f"{'codec':<6} {'ratio':>6} {'encode GB/s':>11} | {'predicted: encode':>17} {'write':>7} {'blocked':>8} | "
        f"{'measured: encode':>16} {'+write':>7} {'total':>7}",
    ]
    for row in rows:
        p = row.prediction
        speed = raw_nbytes / p.encode_s / 1e9 if p.encode_s else float("inf")
        measured = (
            f"{row.measured_encode_s:>16.2f} {row.measured_write_s:>7.2f} "
            f"{row.measured_encode_s + row.measured_write_s:>7.2f}"
            if row.measured_encode_s is not None
            else f"{'-':>16} {'-':>7} {'-':>7}"
        )
        mark = "  <- auto" if p.codec == chosen.codec else ""
        lines.append(f"{p.codec:<6} {p.ratio:>6.3f} {speed:>11.1f} | {p.encode_s:>17.2f} {p.write_s:>7.2f} "
                     f"{p.blocked_s:>8.2f} | {measured}{mark}")
    lines += ["", f"recommendation: codec={chosen.codec!r} (predicted {chosen.blocked_s:.2f} s blocked per save, "
              f"ratio {chosen.ratio:.3f})"]
    return "\n".join(lines)


def main(args) -> int:
    """Entry point of the ``bench`` subcommand (``args`` from the CLI parser)."""
    if not os.path.isdir(args.dir):
        raise FileNotFoundError(f"bench directory {args.dir} does not exist")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    storage = ThrottledStorage(args.throttle_mbps) if args.throttle_mbps else Storage()
    if args.state:
        state = container.load(args.state, map_location=device)
    else:
        state = trained_like_state(args.state_mb << 20, device)
    policy = CodecPolicy(args.mode, args.interval_s, args.probe_mb << 20, storage)
    begin = time.perf_counter()
    gbps, rows, chosen = run(args.dir, state, policy, storage, measure=not args.no_measure)
    raw = sum(t.numel() * t.element_size() for t in container._find_tensors(state))
    print(format_table(gbps, rows, chosen, raw, args.mode))
    print(f"(bench took {time.perf_counter() - begin:.1f} s)")
    return 0
