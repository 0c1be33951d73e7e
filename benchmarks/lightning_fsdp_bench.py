"""Lightning's sharded checkpoints on several GPUs: a GPT (>= 1B parameters at the defaults) trained by a Trainer with
``FSDPStrategy(state_dict_type="sharded")`` (or ``ModelParallelStrategy``, FSDP2) and AdamW, then saved at the end of
training by every rank with Lightning's own strategy and with ours (:class:`~lightning_nvcomp.NvcompFSDPStrategy`:
gANS, Zstd, auto), in one run. Per rank and in total: bytes, ratio, time ``trainer.save_checkpoint`` blocked training,
peak extra GPU memory. Then Lightning's own and our checkpoint are loaded back through the strategy into the
zeroed model and optimizer (bit-exact on every rank: Lightning's checkpoint by Lightning's own load, ours by ours),
and both on one process (resharded to 1; Lightning's by DCP's reader, ours by ours), where ours must equal
Lightning's bit for bit.

    torchrun --nproc_per_node 2 benchmarks/lightning_fsdp_bench.py --out /tmp/lightning_fsdp.md
    torchrun --nproc_per_node 2 benchmarks/lightning_fsdp_bench.py --strategy mp --dim 64 --layers 2 --steps 3 --dir /tmp/lf  # CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import shutil
import sys
import time
import warnings

import lightning.pytorch as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

import lightning_nvcomp
from lightning_nvcomp import NvcompFSDPStrategy, NvcompModelParallelStrategy
from lightning_nvcomp.codec.gpu import gpu_available, nvcomp_version
from lightning_nvcomp.dcp import NvcompFileSystemReader, default_policy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, publish, same_bytes, sync  # noqa: E402
from gpt import GPT, Block, stdlib_corpus  # noqa: E402

warnings.filterwarnings("ignore", message=".*(Detected an existing checkpoint|FSDP.state_dict_type|ShardedTensor).*")


class Corpus(torch.utils.data.IterableDataset):
    """Endless random windows of the corpus, a different stream on every rank."""

    def __init__(self, corpus: torch.Tensor, context: int, seed: int) -> None:
        self.corpus, self.context, self.seed = corpus, context, seed

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed)
        while True:
            s = int(torch.randint(0, self.corpus.numel() - self.context - 1, (1,), generator=gen))
            yield self.corpus[s : s + self.context + 1].long()


class GPTModule(L.LightningModule):
    def __init__(self, gpt: GPT, batch: int, sharding: str) -> None:
        super().__init__()
        self.gpt, self.batch, self.sharding = gpt, batch, sharding

    def configure_model(self) -> None:
        if self.sharding == "mp":  # ModelParallelStrategy leaves the sharding to the module
            from torch.distributed.fsdp import fully_shard

            for block in self.gpt.blocks:
                fully_shard(block, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.gpt, mesh=self.device_mesh["data_parallel"])

    def training_step(self, rows: torch.Tensor, _: int) -> torch.Tensor:
        loss = F.cross_entropy(self.gpt(rows[:, :-1]).flatten(0, 1).float(), rows[:, 1:].flatten())
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.1)

    def train_dataloader(self):
        data = Corpus(stdlib_corpus(), self.gpt.context, seed=self.global_rank)
        return torch.utils.data.DataLoader(data, batch_size=self.batch)


def trained_state(trainer: L.Trainer) -> list[torch.Tensor]:
    """This rank's parameters and optimizer state, in a fixed order."""
    params = list(trainer.lightning_module.parameters())
    opt = trainer.optimizers[0]
    states = [opt.state[p][k] for p in params if p in opt.state for k in sorted(opt.state[p])]
    return [p.detach() for p in local_tensors(params)] + local_tensors(states)


class SaveAndLoad(L.Callback):
    """At the end of training (model and optimizer still sharded on the GPUs): every save, then the loads."""

    def __init__(self, args: argparse.Namespace, own: type) -> None:
        self.args, self.own, self.rows, self.loads, self.predictions = args, own, [], {}, []

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        strategy, rank = trainer.strategy, trainer.global_rank
        reference = [t.cpu().clone() for t in trained_state(trainer)]
        raw = sum(t.numel() * t.element_size() for t in reference)
        codecs = [
            c for c in (["ans", "zstd", "auto"] if gpu_available() else ["zstd", "auto"]) if c in self.args.codecs
        ]
        methods = [("Lightning", None)] + [(f"Nvcomp {c}", c) for c in codecs]
        paths = {name: os.path.join(self.args.dir, name.replace(" ", "_")) for name, _ in methods}
        for rep in range(self.args.repeat):  # rep 0: each method's first save of the run; reversed every other rep
            for name, codec in methods if rep % 2 == 0 else methods[::-1]:
                self.rows.append((name, rep, self._save(trainer, name, codec, paths[name], raw)))

        # Back through the strategy into the zeroed model and optimizer, on the same ranks.
        checked = methods[1][0]
        for rep in range(self.args.repeat):
            for name in ("Lightning", checked) if rep % 2 == 0 else (checked, "Lightning"):
                for t in trained_state(trainer):
                    t.zero_()
                sync()
                begin = time.perf_counter()
                if name == "Lightning":  # Lightning's own load (its readers), as its own save above
                    self.own.load_checkpoint(strategy, paths[name])
                else:
                    strategy.load_checkpoint(paths[name])
                sync()
                seconds = time.perf_counter() - begin
                same: list = [None] * trainer.world_size
                dist.all_gather_object(same, same_bytes(trained_state(trainer), reference))
                self.loads.setdefault(name, []).append((seconds, all(same)))

        # Both on one process: the whole checkpoint, resharded from every rank to 1; ours equals Lightning's.
        if rank == 0:
            whole = {}
            for name in ("Lightning", checked):
                begin = time.perf_counter()
                whole[name] = {}
                _load_state_dict(
                    whole[name],
                    storage_reader=(FileSystemReader if name == "Lightning" else NvcompFileSystemReader)(paths[name]),
                    planner=_EmptyStateDictLoadPlanner(),
                    no_dist=True,
                )
                self.loads[f"{name}, one process"] = [(time.perf_counter() - begin, None)]
            self.one_same = same_bytes(local_tensors(whole["Lightning"]), local_tensors(whole[checked]))
            self.one_count = len(local_tensors(whole[checked]))
        strategy.barrier()

    def _save(self, trainer: L.Trainer, name: str, codec: str | None, path: str, raw: int) -> list:
        """One ``trainer.save_checkpoint``'s work with Lightning's own strategy (codec None) or ours; every rank's
        figures."""
        strategy, rank = trainer.strategy, trainer.global_rank
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        strategy.barrier()
        sync()
        base = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        begin = time.perf_counter()
        checkpoint = trainer._checkpoint_connector.dump_checkpoint()
        if codec is None:
            self.own.save_checkpoint(strategy, checkpoint, path)  # Lightning's own sharded save
        else:
            strategy.options = dataclasses.replace(strategy.options, codec=codec)
            strategy.save_checkpoint(checkpoint, path)
        strategy.barrier()
        blocked = time.perf_counter() - begin
        extra = (torch.cuda.max_memory_allocated() - base) / 1e9 if torch.cuda.is_available() else 0.0
        stored = sum(p.stat().st_size for p in pathlib.Path(path).glob(f"__{rank}_*.distcp"))
        mine = {"raw": raw, "stored": stored, "blocked": blocked, "extra_gb": extra, "codec": "-", "write_s": None}
        if codec is not None:
            rank_stats = strategy.last_stats.ranks[rank]  # write_data's wall time: coding and writing
            mine.update(codec=rank_stats.codec, write_s=rank_stats.encode_s + rank_stats.write_s)
        if codec == "auto" and default_policy("sync").last_decision:
            self.predictions = default_policy("sync").last_decision[1]  # rank 0 decides: its predictions
        gathered: list = [None] * trainer.world_size
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            print(name, gathered, flush=True)
        return gathered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", choices=["fsdp", "mp"], default="fsdp")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dir", default="/tmp/lightning-fsdp-bench")
    parser.add_argument("--codecs", default="ans,zstd,auto", help="our codecs to save with (besides Lightning's own)")
    parser.add_argument("--repeat", type=int, default=1, help="saves and loads per method (the first: rep 0)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    devices = int(os.environ.get("WORLD_SIZE", 1))
    if args.strategy == "fsdp":
        strategy, own = (
            NvcompFSDPStrategy(codec="ans" if gpu else "zstd", state_dict_type="sharded", auto_wrap_policy={Block}),
            FSDPStrategy,
        )
    else:
        # Lightning's default splits the devices into tensor-parallel ranks; this module shards only across data.
        strategy = NvcompModelParallelStrategy(codec="zstd", data_parallel_size=devices, tensor_parallel_size=1)
        own = ModelParallelStrategy
    torch.manual_seed(0)
    local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    with local:  # each rank builds the model where it trains (a 1B model on the CPU is slow to initialise)
        gpt = GPT(dim=args.dim, layers=args.layers, heads=max(1, args.dim // 128))
    n_params = sum(p.numel() for p in gpt.parameters())
    bench = SaveAndLoad(args, own)
    trainer = L.Trainer(
        accelerator="cuda" if gpu else "cpu",
        devices=devices,
        strategy=strategy,
        max_steps=args.steps,
        precision="bf16-mixed" if gpu else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[bench],
    )
    begin = time.perf_counter()
    trainer.fit(GPTModule(gpt, args.batch, args.strategy))
    if trainer.global_rank == 0:
        publish(report(args, n_params, devices, bench, time.perf_counter() - begin), args.out)


def report(args: argparse.Namespace, n_params: int, world: int, bench: SaveAndLoad, seconds: float) -> list[str]:
    gpu = torch.cuda.is_available()
    strategy = 'FSDPStrategy(state_dict_type="sharded")' if args.strategy == "fsdp" else "ModelParallelStrategy (FSDP2)"
    lines = [
        f"# Lightning {strategy} on {world} {'GPUs' if gpu else 'CPU ranks'}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; {world} x "
        f"{torch.cuda.get_device_name() if gpu else 'CPU process'}; torch {torch.__version__}; lightning "
        f"{L.__version__}; nvCOMP {nvcomp_version()}; lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT, {n_params / 1e9:.2f}B params, {args.steps} AdamW steps ({'bf16-mixed' if gpu else 'fp32'}) "
        f"on the Python standard library's sources; {seconds:.0f} s for the whole run",
        "- each save at the end of training, by every rank to the local disk, files fsynced; blocked = "
        "trainer.save_checkpoint's work (dump_checkpoint + the strategy's save_checkpoint + barrier); rep 0 is each "
        "method's first save of the run; the methods run in turn, in reverse order every other repetition, and "
        "so do the loads",
        "",
        "| method | rep | codec | rank | raw GB | stored GB | ratio | blocked s | of it, DCP write s | extra GPU GB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rep, gathered in sorted(bench.rows, key=lambda row: row[1]):
        for r, g in enumerate(gathered):
            lines.append(
                f"| {name} | {rep} | {g['codec']} | {r} | {g['raw'] / 1e9:.2f} | {g['stored'] / 1e9:.2f} | "
                f"{g['raw'] / g['stored']:.3f} | {g['blocked']:.2f} | "
                f"{'-' if g['write_s'] is None else format(g['write_s'], '.2f')} | {g['extra_gb']:.2f} |"
            )
        if len(gathered) > 1:
            raw, stored = sum(g["raw"] for g in gathered), sum(g["stored"] for g in gathered)
            lines.append(
                f"| {name} | {rep} | | all | {raw / 1e9:.2f} | {stored / 1e9:.2f} | {raw / stored:.3f} | "
                f"{max(g['blocked'] for g in gathered):.2f} | | {max(g['extra_gb'] for g in gathered):.2f} |"
            )
    if bench.predictions:
        lines += [
            "",
            "auto's predictions on rank 0 (per rank; it picks the least predicted lost time; a tie, within 5% or "
            "0.1 s where that is at most 1% of the interval, goes to the smaller file, then the sooner durable):",
            "",
            "| codec | ratio | encode s | write s | blocked s |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {p.codec} | {p.ratio:.3f} | {p.encode_s:.2f} | {p.write_s:.2f} | {p.blocked_s:.2f} |"
            for p in bench.predictions
        ]
    lines += ["", "| load | seconds (rep 0, 1, ...) | bit-exact |", "|---|---|---|"]
    for name, runs in bench.loads.items():
        how = "Lightning's own" if name == "Lightning" else "our"
        where = name if "one process" in name else f"{name}, {how} strategy.load_checkpoint on {world} ranks"
        sames = [same for _, same in runs]
        verdict = ("yes" if all(sames) else "NO") if None not in sames else "see below"
        lines.append(f"| {where} | {' / '.join(f'{sec:.2f}' for sec, _ in runs)} | {verdict} |")
    lines += [
        "",
        f"On one process (resharded {world} -> 1): {bench.one_count} tensors of ours equal Lightning's bit "
        f"for bit: {'yes' if bench.one_same else 'NO'}.",
    ]
    return lines


if __name__ == "__main__":
    main()
