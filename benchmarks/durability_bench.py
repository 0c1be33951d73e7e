"""What each durability costs a sync save through ``NvcompCheckpointIO``: the time training is blocked per save and the
time until the file is durable (``nvcomp/durable_s``), for saves to new names (``epoch=N.ckpt``) and saves that
replace one of the same name (``last.ckpt``: with ``background`` durability flushed before its rename).

    python benchmarks/durability_bench.py --mb 256 --saves 5 --dir /path/on/the/disk/to/measure
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from lightning_nvcomp import NvcompCheckpointIO


def run(directory: str, durable: str, replace: bool, state: dict, saves: int) -> tuple[float, float | None]:
    """Median blocked seconds and median seconds until durable (None: never known durable) over ``saves`` saves."""
    io = NvcompCheckpointIO(codec="none", durable=durable, probe_mb=4)
    io.save_checkpoint(state, f"{directory}/warm-{durable}.ckpt")  # the one-off probe and baseline
    io.wait()
    first = len(io.savings.history)
    for i in range(saves):
        io.save_checkpoint(state, f"{directory}/{'last' if replace else f'epoch={i}'}-{durable}.ckpt")
        io.wait()  # one save at a time: each is measured alone
    io.teardown()
    history = io.savings.history[first:]
    durable_s = [m["nvcomp/durable_s"] for m in history if "nvcomp/durable_s" in m]
    return statistics.median(m["nvcomp/blocked_s"] for m in history), statistics.median(
        durable_s
    ) if durable_s else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="checkpoint size in MiB (float32, stored as is)")
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to save (default: a temporary directory)")
    args = parser.parse_args()
    state = {"w": torch.randn(args.mb << 18), "global_step": 1}
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        print("| durability | saves to | blocked s | durable after s |\n|---|---|---|---|")
        for durable in ("background", "sync", "os"):
            for replace in (False, True):
                blocked, durable_s = run(directory, durable, replace, state, args.saves)
                where = "the same name" if replace else "new names"
                after = "never known" if durable_s is None else f"{durable_s:.3f}"
                print(f"| {durable} | {where} | {blocked:.3f} | {after} |")


if __name__ == "__main__":
    main()
