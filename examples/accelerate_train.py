"""Train the byte-level GPT of ``gpt.py`` with Hugging Face Accelerate, checkpointing through ``lightning_nvcomp``.

``attach(accelerator, ...)`` is the only change to an ordinary Accelerate loop: ``accelerator.save_state()`` then
writes the model, the AdamW state, the scheduler and the registered objects compressed (nvCOMP on a GPU, zstd on
the CPU), and the savings go to the Accelerator's trackers (here TensorBoard) as ``nvcomp/...`` metrics, at the step
of the last ``accelerator.log`` (here the number of steps done, as the losses).
Checkpoints use Accelerate's automatic naming (``PROJECT_DIR/checkpoints/checkpoint_N``), the last
``--total-limit`` kept.

    python examples/accelerate_train.py --cpu --dim 128 --layers 2 --steps 60 --save-every 20 --codec zstd
    python examples/accelerate_train.py --cpu --dim 128 --layers 2 --steps 100 --save-every 20 --codec zstd \
        --resume latest                                                        # continues at step 60
    python examples/accelerate_train.py --steps 2000 --save-every 250 --async-save          # GPU, codec auto
    accelerate launch --num_processes 2 examples/accelerate_train.py --steps 2000 --async-save  # 2 GPUs (DDP)
    tensorboard --logdir runs/accelerate_gpt

A resumed run continues exactly where the checkpoint left off: the same batches (drawn from a generator seeded by
the step), the same learning-rate schedule (it does not depend on ``--steps``) and the restored RNG states.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

from lightning_nvcomp.accelerate import attach

from gpt import GPT, stdlib_corpus


class Progress:
    """The loop's own state, saved with the checkpoint through ``accelerator.register_for_checkpointing``."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "tokens": self.tokens}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step, self.tokens = int(state["step"]), int(state["tokens"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--steps", type=int, default=200, help="train until this many optimizer steps in total")
    p.add_argument("--save-every", type=int, default=50, help="save_state every this many steps (and at the end)")
    p.add_argument("--codec", default="auto", choices=["auto", "ans", "zstd", "none"])
    p.add_argument("--async-save", action="store_true", help="write checkpoints on a background thread")
    p.add_argument("--project-dir", default="runs/accelerate_gpt", help="checkpoints/ and TensorBoard logs go here")
    p.add_argument("--resume", metavar="PATH", help="a checkpoint directory to load_state from, or 'latest'")
    p.add_argument("--total-limit", type=int, default=2, help="checkpoints to keep")
    p.add_argument("--gpu-hour-usd", type=float, default=2.0, help="price of a GPU-hour, for nvcomp/saved_usd_total")
    p.add_argument("--probe-mb", type=int, default=256, help="size of the storage-bandwidth probe")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="sequences per step and process")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--decay-steps", type=int, default=5000, help="cosine decay length (independent of --steps)")
    p.add_argument("--corpus-mb", type=int, default=16, help="MB of standard-library source to train on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def checkpoint_index(path: str) -> int:
    """N of a ``checkpoint_N`` directory."""
    match = re.fullmatch(r"checkpoint_(\d+)", os.path.basename(os.path.normpath(path)))
    if not match:
        raise ValueError(f"{path} is not an automatically named checkpoint_N directory")
    return int(match.group(1))


def latest_checkpoint(project_dir: str) -> str:
    root = os.path.join(project_dir, "checkpoints")
    names = [n for n in os.listdir(root) if re.fullmatch(r"checkpoint_\d+", n)] if os.path.isdir(root) else []
    if not names:
        raise FileNotFoundError(f"no checkpoint_N directory in {root}")
    return os.path.join(root, max(names, key=checkpoint_index))


def batch_at(corpus: torch.Tensor, step: int, rank: int, batch: int, context: int, seed: int) -> torch.Tensor:
    """The batch of ``step`` on process ``rank``: a function of its arguments only, so a resumed run sees the
    same data as an uninterrupted one."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    starts = torch.randint(0, corpus.numel() - context - 1, (batch,), generator=gen)
    return torch.stack([corpus[s : s + context + 1] for s in starts.tolist()]).long()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    use_gpu = torch.cuda.is_available() and not args.cpu
    config = ProjectConfiguration(
        project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=args.total_limit
    )
    accelerator = Accelerator(
        cpu=not use_gpu, mixed_precision="bf16" if use_gpu else "no", log_with="tensorboard", project_config=config
    )
    accelerator.init_trackers("tensorboard", config={k: v for k, v in vars(args).items() if v is not None})
    torch.manual_seed(args.seed)

    model = GPT(dim=args.dim, layers=args.layers, heads=args.heads, context=args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def factor(step: int) -> float:  # linear warm-up, then cosine decay to 10% over --decay-steps
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        done = min(1.0, (step - args.warmup_steps) / max(1, args.decay_steps - args.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    attachment = attach(
        accelerator,
        codec=args.codec,
        async_save=args.async_save,
        gpu_hour_usd=args.gpu_hour_usd,
        probe_mb=args.probe_mb,
        interval_s=None,
    )

    if args.resume:
        path = latest_checkpoint(args.project_dir) if args.resume == "latest" else args.resume
        accelerator.load_state(path)
        # Accelerate names the next checkpoint after project_configuration.iteration, which starts at 0 in every
        # process: continue after the newest checkpoint there, or save_state refuses an existing name.
        try:
            newest = checkpoint_index(latest_checkpoint(args.project_dir))
        except FileNotFoundError:
            newest = -1
        accelerator.project_configuration.iteration = newest + 1
        accelerator.print(f"resumed from {path} at step {progress.step}")

    corpus = stdlib_corpus(args.corpus_mb << 20)
    accelerator.print(
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {corpus.numel() / 1e6:.1f} MB of text, "
        f"{accelerator.num_processes} process(es) on {accelerator.device}, codec={args.codec}, "
        f"async_save={args.async_save}"
    )
    model.train()
    begin = time.perf_counter()
    while progress.step < args.steps:
        step = progress.step
        rows = batch_at(corpus, step, accelerator.process_index, args.batch, args.context, args.seed)
        rows = rows.to(accelerator.device)
        with accelerator.autocast():
            logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten())
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step += 1
        progress.tokens += rows[:, 1:].numel() * accelerator.num_processes

        # logged at the number of steps done, as the checkpoint below: its nvcomp/ metrics go to the step of the
        # last accelerator.log
        if step == 0 or progress.step % args.log_every == 0 or progress.step == args.steps:
            loss_value = accelerator.reduce(loss.detach(), reduction="mean").item()
            accelerator.log({"train/loss": loss_value, "train/lr": scheduler.get_last_lr()[0]}, step=progress.step)
            accelerator.print(f"step {progress.step:5d}  loss {loss_value:.3f}  {time.perf_counter() - begin:.1f}s")
        if progress.step % args.save_every == 0 or progress.step == args.steps:
            saved = time.perf_counter()
            location = accelerator.save_state()  # compressed; Accelerate prunes beyond --total-limit
            accelerator.print(f"saved {location} (training waited {time.perf_counter() - saved:.2f} s)")

    attachment.detach()  # waits for a background write and logs its metrics
    if accelerator.is_main_process and attachment.writer.savings.history:
        last = attachment.writer.savings.history[-1]
        print(
            f"last checkpoint: ratio {last['nvcomp/ratio']:.3f}x, training blocked {last['nvcomp/blocked_s']:.2f} s; "
            f"saved so far {last['nvcomp/saved_s_total']:.1f} s"
            + (f" = ${last['nvcomp/saved_usd_total']:.4f}" if "nvcomp/saved_usd_total" in last else "")
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()
