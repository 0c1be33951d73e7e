"""Train the byte-level GPT of ``gpt.py`` with Lightning, checkpointing through ``lightning_nvcomp``.

Everything is set by a LightningCLI config; the configs in ``configs/`` add the compressed checkpoint IO:

    python examples/lightning_gpt.py fit --config configs/demo_cpu.yaml     # CPU, zstd, under a minute
    python examples/lightning_gpt.py fit --config configs/ans.yaml          # GPU, gANS
    python examples/lightning_gpt.py fit --config configs/ans.yaml --trainer.max_steps 3000 \
        --ckpt_path runs/ans/version_0/checkpoints/last.ckpt                # resume, on to a larger max_steps

A resumed run trains on to ``trainer.max_steps``: resuming a finished run needs a larger one, or it stops at once.
Loading a checkpoint elsewhere (``GPTModule.load_from_checkpoint``, ``torch.load``) needs ``lightning_nvcomp``
imported, which this module does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, IterableDataset

import lightning_nvcomp  # noqa: F401  (registers the decoders: GPTModule.load_from_checkpoint reads the files)

from gpt import GPT, stdlib_corpus


class GPTModule(L.LightningModule):
    """``gpt.GPT`` trained with AdamW, linear warm-up then cosine decay to 10% of ``lr`` over ``decay_steps``.

    The schedule does not depend on ``trainer.max_steps``, so a run resumed with a larger ``max_steps`` continues
    the schedule it was checkpointed with.
    """

    def __init__(
        self,
        dim: int = 384,
        layers: int = 6,
        heads: int = 6,
        context: int = 256,
        lr: float = 6e-4,
        weight_decay: float = 0.1,
        warmup_steps: int = 50,
        decay_steps: int = 5000,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(dim=dim, layers=layers, heads=heads, context=context)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, betas=(0.9, 0.95), weight_decay=hp.weight_decay)

        def factor(step: int) -> float:
            warmup = min(1.0, (step + 1) / hp.warmup_steps)
            progress = min(1.0, step / hp.decay_steps)
            return warmup * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

        schedule = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class RandomWindows(IterableDataset):
    """Endless batches of random ``length``-byte windows of ``corpus``. Batch ``b`` is a pure function of
    ``(seed, rank, b)``, so a run resumed at batch ``start`` sees the batches the uninterrupted run would have."""

    def __init__(self, corpus: torch.Tensor, length: int, batch_size: int, seed: int, rank: int, start: int) -> None:
        self.corpus, self.length, self.batch_size = corpus, length, batch_size
        self.seed, self.rank, self.start = seed, rank, start

    def __iter__(self) -> Iterator[torch.Tensor]:
        b = self.start
        while True:
            rng = np.random.default_rng([self.seed, self.rank, b])
            starts = rng.integers(0, self.corpus.numel() - self.length, size=self.batch_size)
            yield torch.stack([self.corpus[s : s + self.length] for s in starts.tolist()]).long()
            b += 1


class StdlibText(L.LightningDataModule):
    """The Python standard library's sources (``gpt.stdlib_corpus``) as random windows of the model's context + 1
    bytes (inputs and next-byte targets). Each rank draws its own windows.

    Args:
        batch_size: windows per batch (per device).
        corpus_mb: how much of the standard library to read.
        seed: seed of the window positions.
    """

    def __init__(self, batch_size: int = 16, corpus_mb: int = 16, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.corpus: torch.Tensor | None = None

    def setup(self, stage: str) -> None:
        if self.corpus is None:
            self.corpus = stdlib_corpus(self.hparams.corpus_mb << 20)

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        # Called after a checkpoint is restored: start at the batch the checkpoint stopped before.
        start = trainer.global_step * trainer.accumulate_grad_batches
        windows = RandomWindows(
            self.corpus,
            trainer.lightning_module.model.context + 1,
            self.hparams.batch_size,
            self.hparams.seed,
            trainer.global_rank,
            start,
        )
        return DataLoader(windows, batch_size=None)


def main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """The command line. ``args``: instead of ``sys.argv``; ``run=False``: build the model, data and Trainer from
    the config (no subcommand) and return them in the CLI object without fitting."""
    return LightningCLI(GPTModule, StdlibText, save_config_kwargs={"overwrite": True}, args=args, run=run)


if __name__ == "__main__":
    main()
