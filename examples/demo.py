"""Demo: train a small GPT with Lightning, checkpointing compressed through ``NvcompCheckpointIO``; resume from the
last checkpoint with ``fit(ckpt_path=...)`` and check that the weights and AdamW state come back bit-exact; print the
savings the plugin logged to TensorBoard and the files' sizes next to a plain ``torch.save`` of the same checkpoints.

It runs ``examples/lightning_gpt.py`` in-process with ``configs/demo_cpu.yaml`` (CPU, zstd, seconds): STEPS steps,
then MORE steps resumed from the last checkpoint, then STEPS + MORE steps uninterrupted for comparison.

    python examples/demo.py [--steps 40] [--more 10] [--dir runs/demo]

The runs log to ``DIR/train``, ``DIR/resume`` and ``DIR/uninterrupted`` (replaced on every demo run);
``tensorboard --logdir DIR`` shows the ``nvcomp/`` metrics and ``python examples/plot_savings.py DIR/train`` draws them.
"""

from __future__ import annotations

import argparse
import copy
import glob
import os
import shutil
import tempfile
import warnings
from typing import Any

import lightning as L
import torch
from lightning_gpt import main as lightning_gpt
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lightning_nvcomp  # noqa: F401  (lets torch.load read the compressed files)

EVERY = 10  # configs/demo_cpu.yaml checkpoints every 10 steps
CONFIG = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "demo_cpu.yaml"))
# Known noise: lightning 2.6 on this torch (pytree shim), and the resumed run checkpointing into its own directory.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
warnings.filterwarnings("ignore", message="The dirpath has changed from")
METRICS = ("raw_gb", "stored_gb", "ratio", "blocked_s", "baseline_s", "saved_s_total")


class StateProbe(L.Callback):
    """Copies the module's weights and the optimizer's state when training starts (after a checkpoint is restored)
    and when it ends."""

    def __init__(self) -> None:
        self.start: dict[str, Any] = {}
        self.end: dict[str, Any] = {}

    @staticmethod
    def _copy(trainer: L.Trainer, module: L.LightningModule) -> dict[str, Any]:
        return {
            "state_dict": {k: v.detach().clone() for k, v in module.state_dict().items()},
            "optimizer": copy.deepcopy(trainer.optimizers[0].state_dict()),
        }

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.start = self._copy(trainer, module)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.end = self._copy(trainer, module)


def bit_exact(a: Any, b: Any) -> bool:
    """Whether two nested structures are equal, tensors compared bit for bit (dtype, shape and every byte)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(*(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(bit_exact(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(bit_exact, a, b))
    return a == b


def fit(
    config: str, log_dir: str, version: str, max_steps: int, ckpt_path: str | None = None
) -> tuple[L.Trainer, StateProbe]:
    """Build ``lightning_gpt``'s model, data and Trainer from ``config`` and fit to ``max_steps``."""
    shutil.rmtree(os.path.join(log_dir, version), ignore_errors=True)
    cli = lightning_gpt(
        [
            f"--config={config}",
            f"--trainer.max_steps={max_steps}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={log_dir}",
            "--trainer.logger.init_args.name=",
            f"--trainer.logger.init_args.version={version}",
        ],
        run=False,
    )
    probe = StateProbe()
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    return cli.trainer, probe


def scalars(log_dir: str) -> dict[int, dict[str, float]]:
    """The ``nvcomp/`` metrics in a TensorBoard log directory, by checkpoint step."""
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    events.Reload()
    by_step: dict[int, dict[str, float]] = {}
    for name in METRICS:
        for event in events.Scalars("nvcomp/" + name):
            by_step.setdefault(event.step, {})[name] = event.value
    return by_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="steps before the checkpoint that is resumed")
    parser.add_argument("--more", type=int, default=10, help="steps after resuming")
    parser.add_argument("--dir", default="runs/demo", help="log and checkpoint directory")
    args = parser.parse_args()
    if args.steps <= 0 or args.steps % EVERY or args.more <= 0:
        parser.error(f"--steps must be a positive multiple of {EVERY} (a checkpoint to resume) and --more positive")
    total = args.steps + args.more

    print(f"== training {args.steps} steps ({CONFIG})")
    first, before = fit(CONFIG, args.dir, "train", args.steps)
    last = first.checkpoint_callback.last_model_path
    print(f"\n== resuming from {last} to step {total}")
    _, resumed = fit(CONFIG, args.dir, "resume", total, ckpt_path=last)
    print(f"\n== for comparison: {total} steps without interruption")
    _, straight = fit(CONFIG, args.dir, "uninterrupted", total)

    stored = torch.load(last)  # a plain torch.load decodes the compressed file
    in_file = {"state_dict": stored["state_dict"], "optimizer": stored["optimizer_states"][0]}
    checks = {
        f"checkpoint file == state trained to step {args.steps}": bit_exact(before.end, in_file),
        f"restored state == state trained to step {args.steps}": bit_exact(before.end, resumed.start),
        f"resumed run == uninterrupted run at step {total}": bit_exact(straight.end, resumed.end),
    }
    print("\n== weights and AdamW moments, bit for bit")
    for what, ok in checks.items():
        print(f"{what:<52}{'yes' if ok else 'NO'}")

    print("\n== savings, as logged to TensorBoard (nvcomp/*), and the files on disk")
    header = ("run", "step", "torch.save MB", "file MB", "ratio", "blocked s", "baseline s", "saved s total")
    print("{:<8}{:>6}{:>15}{:>9}{:>8}{:>11}{:>12}{:>15}".format(*header))
    plain_total = file_total = 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for run in ("train", "resume"):
            metrics = scalars(os.path.join(args.dir, run))
            for path in sorted(glob.glob(os.path.join(args.dir, run, "checkpoints", "*.ckpt")), key=os.path.getmtime):
                if os.path.islink(path):
                    continue  # last.ckpt links to the newest one
                checkpoint = torch.load(path)
                torch.save(checkpoint, os.path.join(tmp, "plain.ckpt"))
                plain, size = os.path.getsize(os.path.join(tmp, "plain.ckpt")), os.path.getsize(path)
                plain_total, file_total = plain_total + plain, file_total + size
                m = metrics[checkpoint["global_step"]]
                print(
                    f"{run:<8}{checkpoint['global_step']:>6}{plain / 1e6:>15.2f}{size / 1e6:>9.2f}{m['ratio']:>8.3f}"
                    f"{m['blocked_s']:>11.3f}{m['baseline_s']:>12.3f}{m['saved_s_total']:>15.3f}"
                )
    print(
        f"\non disk: {file_total / 1e6:.1f} MB instead of {plain_total / 1e6:.1f} MB with torch.save "
        f"({100 * (1 - file_total / plain_total):.1f}% smaller, {plain_total / file_total:.3f}x)"
    )
    print(
        "blocked: how long training waited for the save; baseline: an uncompressed synchronous save at the "
        "directory's measured write bandwidth.\nsaved s is negative where coding on this machine costs more than "
        "the bytes it saves take to write (CPU zstd vs a fast local disk);\nGPU codecs (configs/ans.yaml, "
        "configs/auto_async.yaml) are measured in BENCHMARKS.md."
    )
    if not all(checks.values()):
        raise SystemExit("resuming was not bit-exact")


if __name__ == "__main__":
    main()
