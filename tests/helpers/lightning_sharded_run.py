"""A Lightning run with a sharded strategy, launched as a script (Lightning starts the other ranks by re-running it).

    python lightning_sharded_run.py STRATEGY CODEC ROOT MAX_STEPS [CKPT_PATH]   (GPUS=n: n GPUs, default 1)

STRATEGY: ``mp`` (ModelParallelStrategy + FSDP2 on every CPU or GPU rank) or ``fsdp`` (FSDPStrategy, sharded state,
GPU only); CODEC: a lightning_nvcomp codec, or ``plain`` for Lightning's own strategy (``STATE_ON_GPU=0``: ours
with ``state_on_gpu=False``; ``DELTA=K``: ours with ``delta=DeltaOptions(keyframe_every=K)``; ``TOP_K=k``: only
the k checkpoints of the latest steps kept). An epoch is 4 steps; a checkpoint is saved at the end of each into
ROOT/checkpoints;
logs go to ROOT/csv; ROOT/result-<rank>.json says what the run did (for ours, how the last save's state reached the
writer: ``strategy.last_state``).
"""

from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from lightning_nvcomp import DeltaOptions, NvcompFSDPStrategy, NvcompModelParallelStrategy, NvcompSavings


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 32))

    def configure_model(self) -> None:
        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            from torch.distributed._composable.fsdp import fully_shard

            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch), batch.flip(-1))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        # 4 steps an epoch on every rank, however many data-parallel ranks share the data
        data = torch.randn(32 * self.trainer.world_size, 32, generator=torch.Generator().manual_seed(1))
        return torch.utils.data.DataLoader(data, batch_size=8)


def main() -> None:
    kind, codec, root, max_steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ckpt_path = sys.argv[5] if len(sys.argv) > 5 else None
    gpu = torch.cuda.is_available()
    devices = int(os.environ.get("GPUS", 1)) if gpu else 2
    ours = {"codec": codec, "state_on_gpu": os.environ.get("STATE_ON_GPU", "1") == "1"}
    if int(os.environ.get("DELTA", 0)):
        ours["delta"] = DeltaOptions(keyframe_every=int(os.environ["DELTA"]))
    top_k = int(os.environ.get("TOP_K", -1))
    kept = {"save_top_k": top_k, "monitor": "step", "mode": "max"} if top_k > 0 else {"save_top_k": -1}
    if kind == "mp":
        # Lightning's default makes every device a tensor-parallel rank; Net shards across data-parallel ranks only.
        sizes = {"data_parallel_size": devices, "tensor_parallel_size": 1}
        strategy = ModelParallelStrategy(**sizes) if codec == "plain" else NvcompModelParallelStrategy(**ours, **sizes)
    else:
        strategy = (
            FSDPStrategy(state_dict_type="sharded")
            if codec == "plain"
            else NvcompFSDPStrategy(**ours, state_dict_type="sharded")
        )
    trainer = L.Trainer(
        accelerator="cuda" if gpu else "cpu",
        devices=devices,
        strategy=strategy,
        max_steps=max_steps,
        logger=CSVLogger(root, name="csv", version=0),
        enable_progress_bar=False,
        enable_model_summary=False,
        # NvcompSavings is also installed by the package's entry point; named here for runs from a source tree.
        callbacks=[ModelCheckpoint(dirpath=f"{root}/checkpoints", every_n_epochs=1, **kept), NvcompSavings()],
    )
    trainer.fit(Net(), ckpt_path=ckpt_path)
    stats = getattr(strategy, "last_stats", None)
    state = getattr(strategy, "last_state", None)
    result = {
        "global_step": trainer.global_step,
        "ranks": [[rank, r.codec, r.raw_nbytes, r.file_nbytes] for rank, r in enumerate(stats.ranks)]
        if stats
        else None,
        "state": {"offloaded": state.offloaded, "devices": sorted(state.devices)} if state else None,
        "sharded_loads": getattr(strategy, "sharded_loads", None),
    }
    with open(f"{root}/result-{trainer.global_rank}.json", "w") as f:
        json.dump(result, f)
    if torch.distributed.is_initialized():  # torch asks for it; a child once aborted at its exit with its group up
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
