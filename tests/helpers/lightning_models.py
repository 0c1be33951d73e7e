"""A tiny, deterministic LightningModule and DataModule for the Lightning integration tests.

Importable by child processes (LightningCLI, DDP scripts) as ``tests.helpers.lightning_models``: put the repository
root on ``PYTHONPATH``. Imports only the ``lightning`` namespace, so it must not be used with a ``pytorch_lightning``
Trainer (see :func:`make_classes`).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset


def _data(n: int, in_dim: int, seed: int) -> TensorDataset:
    """A fixed regression problem: the same tensors for every call with the same arguments."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=gen)
    w = torch.randn(in_dim, 1, generator=gen)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=gen)
    return TensorDataset(x, y)


def make_classes(pl):
    """``(TinyModule, TinyData)`` built on the given Lightning package (``lightning.pytorch`` or
    ``pytorch_lightning``): a Trainer of one namespace refuses modules of the other."""

    class TinyModule(pl.LightningModule):
        """Two linear layers trained with AdamW (which has per-parameter state to save and restore)."""

        def __init__(self, in_dim: int = 8, hidden: int = 16, lr: float = 0.01) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(in_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
            # a buffer of another dtype, so checkpoints hold more than float32 parameters
            self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.seen += x.shape[0]
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    class TinyData(pl.LightningDataModule):
        """``n`` fixed samples in batches of ``batch_size``, never shuffled: every run sees the same batches."""

        def __init__(self, n: int = 32, batch_size: int = 8, in_dim: int = 8, seed: int = 0) -> None:
            super().__init__()
            self.n, self.batch_size, self.in_dim, self.seed = n, batch_size, in_dim, seed

        def train_dataloader(self):
            return DataLoader(_data(self.n, self.in_dim, self.seed), batch_size=self.batch_size, shuffle=False)

        def val_dataloader(self):
            return DataLoader(_data(16, self.in_dim, self.seed + 1), batch_size=self.batch_size, shuffle=False)

    return TinyModule, TinyData


import lightning.pytorch as _lightning_pytorch  # noqa: E402

TinyModule, TinyData = make_classes(_lightning_pytorch)
# importable (and picklable) under their names, for LightningCLI class paths and spawned processes
TinyModule.__qualname__, TinyData.__qualname__ = "TinyModule", "TinyData"


def cli_main() -> None:
    """``LightningCLI`` over the tiny model and data (run with ``fit --config ...`` in a child process)."""
    from lightning.pytorch.cli import LightningCLI

    LightningCLI(TinyModule, TinyData, save_config_kwargs={"overwrite": True})


def quiet_trainer(root, **kwargs):
    """A quiet, deterministic CPU ``lightning`` Trainer without validation (checkpoints are saved at each training
    epoch end), two epochs; ``kwargs`` override or add Trainer arguments."""
    import lightning as L

    options = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        limit_val_batches=0,
        default_root_dir=root,
        max_epochs=2,
    )
    options.update(kwargs)
    return L.Trainer(**options)
