"""The Lightning integration, for real: Trainers (``lightning`` and ``pytorch_lightning``), Fabric, LightningCLI and
gloo DDP in child processes, TensorBoard / CSV / offline W&B loggers, real checkpoint files compared bit for bit.

CPU only: zstd and uncompressed saves. Small models and few steps; each storage probe writes 4 MB.
"""

from __future__ import annotations

import csv
import glob
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import warnings
import zipfile
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

import lightning_nvcomp
from lightning_nvcomp import NvcompCheckpointIO

from tests.helpers.lightning_models import TinyData, TinyModule, make_classes, quiet_trainer
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import CHILD_DIGEST_SRC, child_json, python_child, run_killable, tensor_digest
from tests.helpers.states import assert_tree_bit_exact
from tests.helpers.wandb_run import wandb_records

#: Every metric a save logs (``predicted_blocked_s`` only with codec="auto", ``saved_usd_total`` only with a price,
#: ``durable_s`` unless durability is "os").
METRICS = {
    f"nvcomp/{name}"
    for name in [
        "raw_gb",
        "stored_gb",
        "ratio",
        "codec_id",
        "blocked_s",
        "waited_s",
        "probe_s",
        "write_s",
        "slowed_s",
        "lost_s",
        "durable_s",
        "baseline_s",
        "saved_s",
        "saved_s_total",
        "saved_gpu_hours_total",
    ]
}

#: 32 samples in batches of 8: four optimizer steps per epoch.
STEPS_PER_EPOCH = 4


def trainer(root: Path, **kwargs) -> L.Trainer:
    """A quiet, deterministic CPU Trainer without validation (checkpoints are saved at each training epoch end)."""
    return quiet_trainer(root, **kwargs)


def every_epoch(dirpath: Path, **kwargs) -> ModelCheckpoint:
    """A ModelCheckpoint saving ``epoch=E-step=S.ckpt`` at every epoch end (keeping all unless told otherwise)."""
    options = dict(dirpath=dirpath, filename="{epoch}-{step}", every_n_epochs=1, save_top_k=-1)
    options.update(kwargs)
    return ModelCheckpoint(**options)


def model(seed: int = 0, **hparams) -> TinyModule:
    torch.manual_seed(seed)
    return TinyModule(**hparams)


def hidden_files(directory: Path) -> list[str]:
    """Save temp files (``.NAME.*.tmp``) and storage probe leftovers: anything hidden."""
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def pickle_of(path: Path) -> bytes:
    """The ``data.pkl`` of a torch.save zip (it names the functions that rebuild the tensors)."""
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        return archive.read(name)


def is_compressed(path: Path) -> bool:
    """Whether the checkpoint's records hold coded chunks (codec "none" stores every chunk raw, still as our
    checksummed records; a file of another checkpoint IO holds no records)."""
    if b"lightning_nvcomp\ndecode_tensor" not in pickle_of(path):
        return False
    codecs: set[str] = set()
    stack = [lightning_nvcomp.format.describe(path)]
    while stack:
        item = stack.pop()
        if isinstance(item, lightning_nvcomp.format.TensorInfo):
            codecs.update(item.record["codecs"])
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return bool(codecs - {"raw"})


def assert_matches_training(ckpt: dict, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The checkpoint holds exactly the module's weights and the optimizer's state, bit for bit."""
    assert_tree_bit_exact(module.state_dict(), ckpt["state_dict"])
    assert_tree_bit_exact(optimizer.state_dict(), ckpt["optimizer_states"][0])


def savings_callbacks(t) -> list:
    return [cb for cb in t.callbacks if type(cb).__name__ == "NvcompSavings"]


def metric_rows(csv_path: Path) -> dict[int, list[dict[str, float]]]:
    """CSVLogger rows holding nvcomp metrics, by step."""
    rows: dict[int, list[dict[str, float]]] = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            values = {k: float(v) for k, v in row.items() if k.startswith("nvcomp/") and v != ""}
            if values:
                rows.setdefault(int(row["step"]), []).append(values)
    return rows


# ----------------------------------------------------------------------------------------------------------------
# 1. fit writes checkpoints; top-k pruning; last.ckpt; plain torch.load
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_fit_writes_top_k_and_last_checkpoints(tmp_path: Path, codec: str) -> None:
    plugin = NvcompCheckpointIO(codec=codec, probe_mb=4)
    ckdir = tmp_path / "ckpts"
    checkpoint = every_epoch(ckdir, save_top_k=2, monitor="step", mode="max", save_last=True)
    t = trainer(tmp_path, plugins=[plugin], callbacks=[checkpoint], max_epochs=4)
    assert t.strategy.checkpoint_io is plugin
    module = model()
    t.fit(module, datamodule=TinyData())

    # Only the two best (latest) epoch files and last.ckpt remain: the older ones were removed, nothing is left over
    # (no temp file of an atomic write, no storage probe file).
    assert sorted(os.listdir(ckdir)) == ["epoch=2-step=12.ckpt", "epoch=3-step=16.ckpt", "last.ckpt"]
    assert hidden_files(ckdir) == []
    assert checkpoint.best_model_path == str(ckdir / "epoch=3-step=16.ckpt")
    # 4 epoch saves + 4 last.ckpt saves, each measured
    assert len(plugin.savings.history) == 8

    optimizer = t.optimizers[0]
    for name in ("epoch=3-step=16.ckpt", "last.ckpt"):
        path = ckdir / name
        assert is_compressed(path) == (codec != "none")
        ckpt = torch.load(path, weights_only=True)  # plain torch.load: lightning_nvcomp is imported
        assert ckpt["global_step"] == 16 and ckpt["epoch"] == 3
        assert_matches_training(ckpt, module, optimizer)
        assert ckpt["hyper_parameters"] == {"in_dim": 8, "hidden": 16, "lr": 0.01}
    older = torch.load(ckdir / "epoch=2-step=12.ckpt", weights_only=True)
    assert older["global_step"] == 12
    assert int(older["state_dict"]["seen"]) == 3 * 32


def test_checkpoints_load_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """What another program sees: a zstd checkpoint loads with ``torch.load(weights_only=True)`` once
    ``lightning_nvcomp`` is imported (Lightning not needed); an uncompressed one needs nothing at all."""
    paths = {}
    for codec in ("zstd", "none"):
        t = trainer(
            tmp_path,
            plugins=[NvcompCheckpointIO(codec=codec, probe_mb=4)],
            callbacks=[every_epoch(tmp_path / codec)],
            max_epochs=1,
        )
        module = model()
        t.fit(module, datamodule=TinyData())
        paths[codec] = (tmp_path / codec / "epoch=0-step=4.ckpt", module.state_dict(), t.optimizers[0].state_dict())

    code = """
        import json, sys, torch
        import lightning_nvcomp  # every codec's file holds our checked records, "none" included
        exec(sys.argv[3])
        ckpt = torch.load(sys.argv[2], weights_only=True)
        state = {k: tensor_digest(v) for k, v in ckpt["state_dict"].items()}
        opt = {f"{i}.{k}": tensor_digest(v)
               for i, s in ckpt["optimizer_states"][0]["state"].items() for k, v in s.items()}
        lightning = any(m.split(".")[0] in ("lightning", "pytorch_lightning") for m in sys.modules)
        print(json.dumps({"state": state, "opt": opt, "step": ckpt["global_step"], "lightning": lightning}))
    """
    for codec, (path, state, opt) in paths.items():
        out = child_json(python_child(code, codec, str(path), CHILD_DIGEST_SRC, check=True))
        assert out["step"] == STEPS_PER_EPOCH and out["lightning"] is False
        assert out["state"] == {k: tensor_digest(v) for k, v in state.items()}
        assert out["opt"] == {f"{i}.{k}": tensor_digest(v) for i, s in opt["state"].items() for k, v in s.items()}

    # Without lightning_nvcomp, the compressed file is refused (its decoder is not an allowed global), not misread.
    refused = python_child("import sys, torch; torch.load(sys.argv[1], weights_only=True)", str(paths["zstd"][0]))
    assert refused.returncode != 0 and "decode_tensor" in refused.stderr


# ----------------------------------------------------------------------------------------------------------------
# 2. resume continues identically; 3. load_from_checkpoint
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_resume_continues_bit_exactly(tmp_path: Path, async_save: bool) -> None:
    """Train 3 epochs in one go; separately, resume from the epoch-0 checkpoint: same weights, optimizer state,
    step counters and final checkpoint, bit for bit."""
    full = trainer(
        tmp_path,
        plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=async_save)],
        callbacks=[every_epoch(tmp_path / "full")],
        max_epochs=3,
    )
    full_model = model(seed=0)
    full.fit(full_model, datamodule=TinyData())

    resumed = trainer(
        tmp_path,
        plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=async_save)],
        callbacks=[every_epoch(tmp_path / "resumed")],
        max_epochs=3,
    )
    resumed_model = model(seed=1)  # different initial weights: everything must come from the checkpoint
    resumed.fit(resumed_model, datamodule=TinyData(), ckpt_path=tmp_path / "full" / "epoch=0-step=4.ckpt")

    assert full.global_step == resumed.global_step == 3 * STEPS_PER_EPOCH
    assert full.current_epoch == resumed.current_epoch == 3
    assert_tree_bit_exact(full_model.state_dict(), resumed_model.state_dict())
    assert_tree_bit_exact(full.optimizers[0].state_dict(), resumed.optimizers[0].state_dict())

    # the resumed run saved only the epochs it trained, and its last file equals the uninterrupted run's
    assert sorted(os.listdir(tmp_path / "resumed")) == ["epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt"]
    a = torch.load(tmp_path / "full" / "epoch=2-step=12.ckpt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "epoch=2-step=12.ckpt", weights_only=True)
    for key in ("state_dict", "optimizer_states", "global_step", "epoch", "hyper_parameters"):
        assert_tree_bit_exact(a[key], b[key], key)
    assert_matches_training(b, resumed_model, resumed.optimizers[0])


def test_auto_codec(tmp_path: Path) -> None:
    """codec="auto" measures and picks a codec per save; the files say which, and the metrics carry the forecast."""
    plugin = NvcompCheckpointIO(codec="auto", probe_mb=4)
    ckdir = tmp_path / "ckpts"
    t = trainer(tmp_path, plugins=[plugin], callbacks=[every_epoch(ckdir)], logger=CSVLogger(tmp_path))
    module = model()
    t.fit(module, datamodule=TinyData())
    assert sorted(os.listdir(ckdir)) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    assert hidden_files(ckdir) == []
    for name, metrics in zip(sorted(os.listdir(ckdir)), plugin.savings.history):
        # The forecast of the codec chosen and of every candidate (no GPU: none and zstd).
        predicted = {"nvcomp/predicted_blocked_s", "nvcomp/predicted_none_blocked_s", "nvcomp/predicted_zstd_blocked_s"}
        assert set(metrics) == METRICS | predicted
        chosen = "zstd" if metrics["nvcomp/codec_id"] == 1.0 else "none"
        assert metrics["nvcomp/predicted_blocked_s"] == metrics[f"nvcomp/predicted_{chosen}_blocked_s"]
        assert metrics["nvcomp/codec_id"] in (0.0, 1.0)  # no GPU: none or zstd
        assert is_compressed(ckdir / name) == (metrics["nvcomp/codec_id"] == 1.0)
    assert_matches_training(torch.load(ckdir / "epoch=1-step=8.ckpt", weights_only=True), module, t.optimizers[0])
    rows = metric_rows(Path(t.logger.log_dir) / "metrics.csv")
    assert sorted(rows) == [4, 8] and all("nvcomp/predicted_blocked_s" in r[0] for r in rows.values())


class RecordsRunEnding(NvcompCheckpointIO):
    """Our checkpoint IO, noting at each save whether auto has been told that the fit ends after it, and the
    interval between saves auto knew of once it had decided."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ending: list[bool] = []
        self.intervals: list[float | None] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        self.ending.append(self.writer.policy.run_ending)
        super().save_checkpoint(checkpoint, path, storage_options)
        self.intervals.append(self.writer.policy.interval)


@pytest.mark.parametrize(
    "fit, checkpoint",
    [
        (dict(max_steps=6, max_epochs=-1), dict(every_n_train_steps=2)),  # saves at steps 2, 4, 6
        (dict(max_epochs=3), dict(every_n_epochs=1)),  # saves at the end of epochs 0, 1, 2
    ],
    ids=["max_steps", "max_epochs"],
)
def test_auto_is_told_which_checkpoints_end_the_fit(tmp_path: Path, fit: dict, checkpoint: dict) -> None:
    """The fit waits for its last checkpoint's write: only that save is decided as the run's end (its async write
    counted in full), the earlier ones by what training waits for; a second fit starts over. The first save is
    decided knowing the interval since the fit's start."""
    plugin = RecordsRunEnding(codec="auto", async_save=True, probe_mb=4)
    callback = ModelCheckpoint(dirpath=tmp_path / "ckpts", filename="{step}", save_top_k=-1, **checkpoint)
    begin = time.perf_counter()
    trainer(tmp_path, plugins=[plugin], callbacks=[callback], **fit).fit(model(), datamodule=TinyData())
    assert plugin.ending == [False, False, True]
    assert plugin.intervals[0] is not None and 0 < plugin.intervals[0] < time.perf_counter() - begin
    assert plugin.writer.policy.run_ending  # until the next fit's setup
    again = ModelCheckpoint(dirpath=tmp_path / "again", filename="{step}", save_top_k=-1, **checkpoint)
    trainer(tmp_path, plugins=[plugin], callbacks=[again], **fit).fit(model(), datamodule=TinyData())
    assert plugin.ending[3:] == [False, False, True]


def test_load_from_checkpoint_is_bit_exact(tmp_path: Path) -> None:
    t = trainer(
        tmp_path, plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4)], callbacks=[every_epoch(tmp_path / "ckpts")]
    )
    trained = model(in_dim=8, hidden=12, lr=0.02)
    t.fit(trained, datamodule=TinyData())
    path = tmp_path / "ckpts" / "epoch=1-step=8.ckpt"
    assert is_compressed(path)

    loaded = TinyModule.load_from_checkpoint(path)
    assert dict(loaded.hparams) == {"in_dim": 8, "hidden": 12, "lr": 0.02}
    assert_tree_bit_exact(trained.state_dict(), loaded.state_dict())
    assert all(p.device.type == "cpu" for p in loaded.parameters())


# ----------------------------------------------------------------------------------------------------------------
# 4. LightningCLI in a child process
# ----------------------------------------------------------------------------------------------------------------


def _cli_config(path: Path, root: Path, ckdir: Path, max_epochs: int) -> Path:
    path.write_text(
        textwrap.dedent(f"""\
        seed_everything: 0
        trainer:
          accelerator: cpu
          devices: 1
          max_epochs: {max_epochs}
          logger: false
          enable_progress_bar: false
          enable_model_summary: false
          deterministic: true
          limit_val_batches: 0
          default_root_dir: {root}
          plugins:
            - class_path: lightning_nvcomp.NvcompCheckpointIO
              init_args:
                codec: zstd
                probe_mb: 4
          callbacks:
            - class_path: lightning.pytorch.callbacks.ModelCheckpoint
              init_args:
                dirpath: {ckdir}
                filename: "{{epoch}}-{{step}}"
                save_top_k: -1
                every_n_epochs: 1
        model:
          hidden: 12
        """)
    )
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    proc = python_child(
        "from tests.helpers import lightning_models; lightning_models.cli_main()",
        *args,
        timeout=180,
        env={"PYTHONPATH": path},
    )
    assert proc.returncode == 0, f"LightningCLI failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_lightning_cli_fit_and_resume(tmp_path: Path) -> None:
    first = _cli("fit", "--config", str(_cli_config(tmp_path / "first.yaml", tmp_path / "r1", tmp_path / "c1", 2)))
    assert sorted(os.listdir(tmp_path / "c1")) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    assert is_compressed(tmp_path / "c1" / "epoch=1-step=8.ckpt")
    assert "lightning_nvcomp: " in first.stdout + first.stderr  # the plugin wrote them (its console summary)

    resume_from = tmp_path / "c1" / "epoch=1-step=8.ckpt"
    second = _cli(
        "fit",
        "--config",
        str(_cli_config(tmp_path / "second.yaml", tmp_path / "r2", tmp_path / "c2", 4)),
        "--ckpt_path",
        str(resume_from),
    )
    assert f"Restoring states from the checkpoint path at {resume_from}" in second.stdout + second.stderr
    # a resumed run saves only epochs 2 and 3 (a fresh one would have written epoch 0 and 1 too)
    assert sorted(os.listdir(tmp_path / "c2")) == ["epoch=2-step=12.ckpt", "epoch=3-step=16.ckpt"]
    final = torch.load(tmp_path / "c2" / "epoch=3-step=16.ckpt", weights_only=True)
    assert final["global_step"] == 16 and final["hyper_parameters"]["hidden"] == 12

    # ... and it is the same training as 4 uninterrupted epochs in this process
    L.seed_everything(0, verbose=False)
    reference = TinyModule(hidden=12)
    t = trainer(
        tmp_path,
        plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4)],
        callbacks=[],
        max_epochs=4,
        enable_checkpointing=False,
    )
    t.fit(reference, datamodule=TinyData())
    assert_matches_training(final, reference, t.optimizers[0])


# ----------------------------------------------------------------------------------------------------------------
# 5. both namespaces, the auto-installed callback, Fabric
# ----------------------------------------------------------------------------------------------------------------


def test_lightning_trainer_gets_one_savings_callback(tmp_path: Path) -> None:
    t = trainer(tmp_path, plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4)])
    (callback,) = savings_callbacks(t)
    assert isinstance(callback, L.pytorch.Callback)
    assert type(callback) is lightning_nvcomp.NvcompSavings


def test_pytorch_lightning_trainer(tmp_path: Path) -> None:
    import lightning_fabric
    import pytorch_lightning as pl

    PLModule, PLData = make_classes(pl)
    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4)
    assert isinstance(plugin, lightning_fabric.plugins.CheckpointIO)
    ckdir = tmp_path / "ckpts"
    t = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        plugins=[plugin],
        logger=pl.loggers.CSVLogger(tmp_path),
        callbacks=[pl.callbacks.ModelCheckpoint(dirpath=ckdir, filename="{epoch}-{step}", save_top_k=-1)],
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        limit_val_batches=0,
    )
    assert t.strategy.checkpoint_io is plugin
    (callback,) = savings_callbacks(t)
    assert isinstance(callback, pl.Callback) and not isinstance(callback, L.pytorch.Callback)

    torch.manual_seed(0)
    module = PLModule()
    t.fit(module, datamodule=PLData())
    assert sorted(os.listdir(ckdir)) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    ckpt = torch.load(ckdir / "epoch=1-step=8.ckpt", weights_only=True)
    assert is_compressed(ckdir / "epoch=1-step=8.ckpt") and ckpt["global_step"] == 8
    assert_matches_training(ckpt, module, t.optimizers[0])
    # the pytorch_lightning callback found the plugin and logged its savings at each checkpoint's step
    rows = metric_rows(Path(t.logger.log_dir) / "metrics.csv")
    assert sorted(rows) == [4, 8] and all(METRICS <= set(r[0]) for r in rows.values())


def test_savings_callback_is_idle_with_another_checkpoint_io(tmp_path: Path) -> None:
    t = trainer(tmp_path, logger=CSVLogger(tmp_path), callbacks=[every_epoch(tmp_path / "ckpts")], log_every_n_steps=1)
    assert len(savings_callbacks(t)) == 1
    t.fit(model(), datamodule=TinyData())
    assert not is_compressed(tmp_path / "ckpts" / "epoch=1-step=8.ckpt")
    with open(Path(t.logger.log_dir) / "metrics.csv") as f:
        header = next(csv.reader(f))
    assert "train_loss" in header and not [name for name in header if name.startswith("nvcomp/")]


def test_wrapped_in_lightning_async_checkpoint_io(tmp_path: Path) -> None:
    """Inside Lightning's own AsyncCheckpointIO (a wrapping IO), saves still go through the plugin and the savings
    callback still finds it."""
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4)
    ckdir = tmp_path / "ckpts"
    t = trainer(
        tmp_path, plugins=[AsyncCheckpointIO(plugin)], callbacks=[every_epoch(ckdir)], logger=CSVLogger(tmp_path)
    )
    module = model()
    t.fit(module, datamodule=TinyData())
    assert sorted(os.listdir(ckdir)) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    assert is_compressed(ckdir / "epoch=1-step=8.ckpt") and len(plugin.savings.history) == 2
    assert_matches_training(torch.load(ckdir / "epoch=1-step=8.ckpt", weights_only=True), module, t.optimizers[0])
    assert sorted(metric_rows(Path(t.logger.log_dir) / "metrics.csv")) == [4, 8]


@pytest.mark.parametrize("namespace", ["lightning.fabric", "lightning_fabric"])
def test_fabric_save_load_round_trip(tmp_path: Path, namespace: str) -> None:
    import importlib

    Fabric = importlib.import_module(namespace).Fabric
    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4)
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[plugin])
    assert fabric.strategy.checkpoint_io is plugin

    def setup(seed: int):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        return fabric.setup(net, torch.optim.AdamW(net.parameters(), lr=0.01))

    net, opt = setup(0)
    for _ in range(3):
        fabric.backward(net(torch.randn(4, 8)).square().mean())
        opt.step()
        opt.zero_grad()
    path = tmp_path / "fabric.ckpt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fabric.save(path, {"model": net, "optimizer": opt, "step": 3, "note": "x"})
        fabric.strategy.checkpoint_io.writer.wait()  # durable (flushed behind the save) and its metrics recorded
    # no Trainer, so no savings callback: the plugin says where its metrics went (the console only)
    assert any("no savings callback" in str(w.message) for w in caught)
    assert is_compressed(path) and hidden_files(tmp_path) == []

    net2, opt2 = setup(1)
    state = {"model": net2, "optimizer": opt2, "step": 0}
    remainder = fabric.load(path, state)
    assert remainder == {"note": "x"} and state["step"] == 3
    assert_tree_bit_exact(net.state_dict(), net2.state_dict())
    assert_tree_bit_exact(opt.state_dict(), opt2.state_dict())
    raw = torch.load(path, weights_only=True)
    assert_tree_bit_exact(net.state_dict(), raw["model"])


# ----------------------------------------------------------------------------------------------------------------
# 6. async saves
# ----------------------------------------------------------------------------------------------------------------


def test_async_fit_leaves_complete_files(tmp_path: Path) -> None:
    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=True)
    ckdir = tmp_path / "ckpts"
    t = trainer(
        tmp_path,
        plugins=[plugin],
        logger=CSVLogger(tmp_path),
        max_epochs=4,
        callbacks=[every_epoch(ckdir, save_top_k=2, monitor="step", mode="max", save_last=True)],
    )
    module = model()
    t.fit(module, datamodule=TinyData())

    assert sorted(os.listdir(ckdir)) == ["epoch=2-step=12.ckpt", "epoch=3-step=16.ckpt", "last.ckpt"]
    assert hidden_files(ckdir) == []
    for name in ("epoch=3-step=16.ckpt", "last.ckpt"):
        ckpt = torch.load(ckdir / name, weights_only=True)
        assert ckpt["global_step"] == 16
        assert_matches_training(ckpt, module, t.optimizers[0])
    assert torch.load(ckdir / "epoch=2-step=12.ckpt", weights_only=True)["global_step"] == 12
    # every save's metrics reached the logger, the last one's too (written after training returned)
    rows = metric_rows(Path(t.logger.log_dir) / "metrics.csv")
    assert {step: len(r) for step, r in rows.items()} == {4: 2, 8: 2, 12: 2, 16: 2}


def _block_path(path: Path) -> None:
    """Make ``path`` a non-empty directory: a checkpoint write there fails for real when it renames its temp file."""
    path.mkdir(parents=True)
    (path / "keep").write_bytes(b"occupied")


@pytest.mark.parametrize("failing_epoch", [0, 1], ids=["next-save-raises", "teardown-raises"])
def test_async_background_failure_fails_fit(tmp_path: Path, failing_epoch: int) -> None:
    """A background write that fails is raised by the next save (epoch 0 fails: at epoch 1's save), or by the
    Trainer's teardown (the last save fails), as a RuntimeError that names the checkpoint."""
    ckdir = tmp_path / "ckpts"
    blocked = ckdir / f"epoch={failing_epoch}.ckpt"
    _block_path(blocked)
    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=True)
    checkpoint = ModelCheckpoint(
        dirpath=ckdir, filename="{epoch}", every_n_epochs=1, save_top_k=-1, enable_version_counter=False
    )
    t = trainer(tmp_path, plugins=[plugin], callbacks=[checkpoint], max_epochs=2)
    with pytest.raises(RuntimeError, match="background save") as info:
        t.fit(model(), datamodule=TinyData())
    assert str(blocked) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert (blocked / "keep").read_bytes() == b"occupied"
    assert hidden_files(ckdir) == []
    if failing_epoch == 1:  # the first save went through
        assert torch.load(ckdir / "epoch=0.ckpt", weights_only=True)["global_step"] == STEPS_PER_EPOCH


def _until_written(plugin: NvcompCheckpointIO) -> None:
    """Wait, without surfacing their errors, until the plugin's background writes are done."""
    while plugin.writer.pending():
        time.sleep(0.01)


def test_async_failure_raised_once_by_plugin(tmp_path: Path) -> None:
    """The plugin API directly: a failed background write raises at the next save and only once; the plugin goes
    on working, and teardown raises a failure not yet reported."""
    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=True)
    state = {"w": torch.randn(64, 64), "global_step": 7}
    blocked = tmp_path / "blocked.ckpt"
    _block_path(blocked)

    def again(call, *args) -> None:
        try:
            call(*args)
        except RuntimeError as err:
            pytest.fail(f"one failed background save was reported a second time: {err}")

    plugin.save_checkpoint(state, blocked)  # returns: the write runs in the background
    _until_written(plugin)
    with pytest.raises(RuntimeError, match="blocked.ckpt"):  # the next save does not wait: it raises a failure done
        plugin.save_checkpoint(state, tmp_path / "good.ckpt")
    again(plugin.save_checkpoint, state, tmp_path / "good.ckpt")
    plugin.teardown()
    assert_tree_bit_exact(state, torch.load(tmp_path / "good.ckpt", weights_only=True))

    plugin.save_checkpoint(state, blocked)
    with pytest.raises(RuntimeError, match="blocked.ckpt"):
        plugin.teardown()
    again(plugin.teardown)
    assert hidden_files(tmp_path) == []

    # a synchronous save fails where it happens, with the OS error naming the file: with durable="sync", and with
    # "background" durability too (its rename runs in the save, so that the file is readable when the save returns)
    for durable in ("sync", "background"):
        sync = NvcompCheckpointIO(codec="zstd", probe_mb=4, durable=durable)
        with pytest.raises(OSError, match="blocked.ckpt"):
            sync.save_checkpoint(state, blocked)
        sync.teardown()
    assert hidden_files(tmp_path) == []


def test_async_failure_file_size_limit_in_child(tmp_path: Path) -> None:
    """A write that runs out of space (RLIMIT_FSIZE: EFBIG part-way through the file) in the background: raised at
    teardown naming the path, the temp file removed, the previous checkpoint at that path intact."""
    code = """
        import json, os, resource, signal, sys, torch
        from lightning_nvcomp import NvcompCheckpointIO
        directory = sys.argv[1]
        path = os.path.join(directory, "model.ckpt")
        plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=True)
        small = {"w": torch.arange(10.0), "global_step": 1}
        plugin.save_checkpoint(small, path)
        plugin.teardown()
        good = open(path, "rb").read()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
        big = {"w": torch.randint(0, 256, (1 << 20,), dtype=torch.uint8), "global_step": 2}  # incompressible 1 MB
        plugin.save_checkpoint(big, path)
        try:
            plugin.teardown()
            error = None
        except RuntimeError as err:
            error = [str(err), type(err.__cause__).__name__]
        same = open(path, "rb").read() == good
        print(json.dumps({"error": error, "same": same, "files": sorted(os.listdir(directory))}))
    """
    out = child_json(python_child(code, str(tmp_path), check=True))
    assert out["error"] is not None, "the failed background write was not reported"
    message, cause = out["error"]
    assert str(tmp_path / "model.ckpt") in message and "File too large" in message and cause == "OSError"
    assert out["same"] and out["files"] == ["model.ckpt"]
    assert torch.load(tmp_path / "model.ckpt", weights_only=True)["global_step"] == 1


def test_async_remove_and_load_wait_for_the_write(tmp_path: Path) -> None:
    plugin = NvcompCheckpointIO(codec="none", probe_mb=4, async_save=True)
    state = {"w": torch.randn(8 << 20), "global_step": 3}  # 32 MB: the background write takes a while
    path = tmp_path / "model.ckpt"

    plugin.save_checkpoint(state, path)
    loaded = plugin.load_checkpoint(path)  # waits for the write of this very file
    assert_tree_bit_exact(state, loaded)

    plugin.save_checkpoint(state, path)
    plugin.remove_checkpoint(path)  # returns at once: the file is removed after its write
    assert plugin.writer.pending()
    plugin.teardown()
    time.sleep(0.2)
    assert os.listdir(tmp_path) == []  # not re-created by a write still running, no temp file

    # pruning another file waits for (and never disturbs) the write in flight: the older checkpoint is deleted
    # once the newer one is durable, and kept if that save fails
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"x")
    plugin.save_checkpoint(state, path)
    plugin.remove_checkpoint(other)
    assert other.exists() and plugin.writer.pending()
    plugin.teardown()
    assert not other.exists()
    assert_tree_bit_exact(state, torch.load(path, weights_only=True))

    blocked = tmp_path / "blocked.ckpt"
    _block_path(blocked)
    other.write_bytes(b"x")
    plugin.save_checkpoint(state, blocked)
    plugin.remove_checkpoint(other)
    with pytest.raises(RuntimeError, match="blocked.ckpt"):
        plugin.teardown()
    assert other.read_bytes() == b"x"  # the newer save failed: the older checkpoint stays


class _BigModule(TinyModule):
    """The tiny model plus 32 MB of incompressible bytes: each async save writes for a while in the background."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.register_buffer("noise", torch.randint(0, 256, (32 << 20,), dtype=torch.uint8, generator=gen))


def test_async_checkpoint_holds_the_state_at_save_time_trainer(tmp_path: Path) -> None:
    """Each async checkpoint's ModelCheckpoint state is the one of its own step, like a synchronous save's (at
    b9d8c77 the writer thread pickled the live ``best_k_models`` dict after the next step had changed it)."""
    ckdir = tmp_path / "ckpts"
    checkpoint = ModelCheckpoint(
        dirpath=ckdir, filename="{step}", every_n_train_steps=1, save_top_k=3, monitor="step", mode="max"
    )
    t = trainer(
        tmp_path,
        plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=True)],
        callbacks=[checkpoint],
        max_steps=3,
    )
    torch.manual_seed(0)
    t.fit(_BigModule(), datamodule=TinyData())
    for step in (1, 2, 3):
        ckpt = torch.load(ckdir / f"step={step}.ckpt", weights_only=True)
        (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("ModelCheckpoint")]
        assert state["best_model_path"] == str(ckdir / f"step={step}.ckpt")
        assert sorted(state["best_k_models"]) == [str(ckdir / f"step={s}.ckpt") for s in range(1, step + 1)], (
            f"step={step}.ckpt records later checkpoints"
        )


def test_async_checkpoint_holds_the_state_at_save_time_plugin(tmp_path: Path) -> None:
    """Changes to the saved object after save_checkpoint returned do not reach the file written in the background."""
    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=True)
    gen = torch.Generator().manual_seed(0)
    state = {
        "noise": torch.randint(0, 256, (32 << 20,), dtype=torch.uint8, generator=gen),
        "global_step": 1,
        "callbacks": {"best_k_models": {"a.ckpt": 1.0}},
    }
    plugin.save_checkpoint(state, tmp_path / "model.ckpt")
    state["callbacks"]["best_k_models"]["b.ckpt"] = 2.0  # training went on
    plugin.teardown()
    loaded = torch.load(tmp_path / "model.ckpt", weights_only=True)
    assert loaded["callbacks"] == {"best_k_models": {"a.ckpt": 1.0}}


# ----------------------------------------------------------------------------------------------------------------
# 7. telemetry: TensorBoard, CSV, offline W&B, console
# ----------------------------------------------------------------------------------------------------------------


def _wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file."""
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in history.item}
        for history in wandb_records(run_file, "history")
    ]


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory):
    """One fit (2 epochs, zstd, price 2.5 $/GPU-hour) logging to TensorBoard, CSV and an offline W&B run."""
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    root = tmp_path_factory.mktemp("logged")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in dict(
            WANDB_MODE="offline",
            WANDB_DIR=str(root),
            WANDB_SILENT="true",
            WANDB_CONSOLE="off",
            WANDB_DISABLE_GIT="true",
            WANDB_DISABLE_CODE="true",
        ).items():
            mp.setenv(key, value)
        plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4, gpu_hour_usd=2.5)
        loggers = [
            TensorBoardLogger(root, name="tb"),
            CSVLogger(root, name="csv"),
            WandbLogger(save_dir=str(root), offline=True, project="nvcomp-test"),
        ]
        t = trainer(root, plugins=[plugin], logger=loggers, callbacks=[every_epoch(root / "ckpts")])
        t.fit(model(), datamodule=TinyData())
        run = loggers[2].experiment
        summary = {k: v for k, v in dict(run.summary).items() if k.startswith("nvcomp/")}
        run.finish()
        wandb.teardown()
    (run_file,) = glob.glob(str(root / "wandb" / "offline-run-*" / "run-*.wandb"))
    sizes = {
        4: os.path.getsize(root / "ckpts" / "epoch=0-step=4.ckpt"),
        8: os.path.getsize(root / "ckpts" / "epoch=1-step=8.ckpt"),
    }
    return dict(
        root=root,
        history=list(plugin.savings.history),
        tb_dir=loggers[0].log_dir,
        csv=Path(loggers[1].log_dir) / "metrics.csv",
        wandb_file=Path(run_file),
        summary=summary,
        sizes=sizes,
    )


EXPECTED = METRICS | {"nvcomp/saved_usd_total"}


def test_telemetry_values_are_consistent(logged_run) -> None:
    first, second = logged_run["history"]
    for metrics, step in ((first, 4), (second, 8)):
        assert set(metrics) == EXPECTED  # codec given: no prediction
        assert metrics["nvcomp/codec_id"] == 1.0
        assert round(metrics["nvcomp/stored_gb"] * 1e9) == logged_run["sizes"][step]  # the real file size
        assert metrics["nvcomp/ratio"] == pytest.approx(metrics["nvcomp/raw_gb"] / metrics["nvcomp/stored_gb"])
        assert metrics["nvcomp/blocked_s"] > 0 and metrics["nvcomp/write_s"] > 0 and metrics["nvcomp/baseline_s"] > 0
        assert metrics["nvcomp/slowed_s"] == 0 and metrics["nvcomp/lost_s"] == metrics["nvcomp/blocked_s"]
        assert metrics["nvcomp/saved_s"] == pytest.approx(metrics["nvcomp/baseline_s"] - metrics["nvcomp/lost_s"])
        assert metrics["nvcomp/saved_usd_total"] == pytest.approx(metrics["nvcomp/saved_gpu_hours_total"] * 2.5)
        assert metrics["nvcomp/saved_gpu_hours_total"] == pytest.approx(metrics["nvcomp/saved_s_total"] / 3600)
    assert second["nvcomp/saved_s_total"] == pytest.approx(first["nvcomp/saved_s"] + second["nvcomp/saved_s"])


def test_telemetry_in_tensorboard(logged_run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logged_run["tb_dir"])
    acc.Reload()
    assert EXPECTED <= set(acc.Tags()["scalars"])
    for name in EXPECTED:
        events = acc.Scalars(name)
        assert [e.step for e in events] == [4, 8], name
        for event, metrics in zip(events, logged_run["history"]):
            assert event.value == pytest.approx(metrics[name], rel=1e-6, abs=1e-12), name  # stored as float32


def test_telemetry_in_csv(logged_run) -> None:
    rows = metric_rows(logged_run["csv"])
    assert sorted(rows) == [4, 8]
    for step, metrics in zip((4, 8), logged_run["history"]):
        (row,) = rows[step]
        assert set(row) == EXPECTED
        assert row == pytest.approx(metrics, rel=1e-12)


def test_telemetry_in_offline_wandb(logged_run) -> None:
    rows = [r for r in _wandb_history(logged_run["wandb_file"]) if any(k.startswith("nvcomp/") for k in r)]
    assert [r["trainer/global_step"] for r in rows] == [4, 8]
    for row, metrics in zip(rows, logged_run["history"]):
        assert {k for k in row if k.startswith("nvcomp/")} == EXPECTED
        assert {k: row[k] for k in EXPECTED} == pytest.approx(metrics, rel=1e-12)
    assert set(logged_run["summary"]) == EXPECTED
    assert logged_run["summary"] == pytest.approx(logged_run["history"][-1], rel=1e-12)


def test_console_summary_line(tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    ckdir = tmp_path / "ckpts"
    t = trainer(tmp_path, plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4)], callbacks=[every_epoch(ckdir)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(model(), datamodule=TinyData())
    captured = capfd.readouterr()
    text = caplog.text + captured.out + captured.err
    for name in ("epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"):
        lines = [line for line in text.splitlines() if f"lightning_nvcomp: {ckdir / name}: zstd " in line]
        assert len(lines) == 1, text
        assert "training blocked" in lines[0] and "(torch.save: " in lines[0] and "saved" in lines[0]
    # the callback is attached, so no warning that the metrics reach no logger
    assert not [w for w in caught if "no savings callback" in str(w.message)]


# ----------------------------------------------------------------------------------------------------------------
# 8. DDP on 2 CPU processes (gloo)
# ----------------------------------------------------------------------------------------------------------------

DDP_SCRIPT = """
import json, sys
from datetime import timedelta
import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from lightning_nvcomp import NvcompCheckpointIO
from tests.helpers.lightning_models import TinyData, TinyModule
exec(sys.argv[4])  # tensor_digest

out, epochs, async_save = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "async"
plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=async_save)
torch.manual_seed(0)
trainer = L.Trainer(
    accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=20)), plugins=[plugin],
    callbacks=[ModelCheckpoint(dirpath=out, filename="{epoch}-{step}", save_top_k=-1, every_n_epochs=1)],
    max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    limit_val_batches=0,
)
model = TinyModule()
trainer.fit(model, datamodule=TinyData())
opt = trainer.optimizers[0].state_dict()["state"]
result = json.dumps({
    "rank": trainer.global_rank, "world_size": trainer.world_size, "global_step": trainer.global_step,
    "state": {k: tensor_digest(v) for k, v in model.state_dict().items()},
    "opt": {f"{i}.{k}": tensor_digest(v) for i, s in opt.items() for k, v in s.items()},
    "saves": len(plugin.savings.history), "savings_world_size": plugin.savings.world_size,
    "last": plugin.savings.history[-1] if plugin.savings.history else None,
})
with open(f"{out}.rank{trainer.global_rank}.json", "w") as f:  # both ranks share stdout: one file each
    f.write(result)
"""


def _run_ddp(tmp_path: Path, epochs: int, mode: str) -> tuple[dict[int, dict], Path]:
    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP_SCRIPT)
    ckdir = tmp_path / "ckpts"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        PYTHONDONTWRITEBYTECODE="1",
    )
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)
    proc = run_killable(
        [sys.executable, str(script), str(ckdir), str(epochs), mode, CHILD_DIGEST_SRC], env, tmp_path, 150, "DDP"
    )
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == 0, f"DDP run failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-12000:]}"
    results = {rank: json.loads(Path(f"{ckdir}.rank{rank}.json").read_text()) for rank in (0, 1)}
    assert [results[rank]["rank"] for rank in (0, 1)] == [0, 1]
    return results, ckdir


def _check_ddp(results: dict[int, dict], ckdir: Path, epochs: int) -> None:
    steps = 2  # 32 samples over 2 ranks in batches of 8
    names = [f"epoch={e}-step={steps * (e + 1)}.ckpt" for e in range(epochs)]
    assert sorted(os.listdir(ckdir)) == names  # written once (by rank 0), nothing left over
    final = torch.load(ckdir / names[-1], weights_only=True)
    assert is_compressed(ckdir / names[-1])
    assert final["global_step"] == steps * epochs
    state = {k: tensor_digest(v) for k, v in final["state_dict"].items()}
    opt = {f"{i}.{k}": tensor_digest(v) for i, s in final["optimizer_states"][0]["state"].items() for k, v in s.items()}
    for rank, result in results.items():
        assert result["world_size"] == 2 and result["global_step"] == steps * epochs
        assert result["state"] == state, f"rank {rank}'s final weights differ from the checkpoint"
        assert result["opt"] == opt, f"rank {rank}'s optimizer state differs from the checkpoint"
    # only rank 0 saved; its savings count both GPUs
    assert results[0]["saves"] == epochs and results[1]["saves"] == 0
    assert results[0]["savings_world_size"] == 2
    last = results[0]["last"]
    assert last["nvcomp/saved_gpu_hours_total"] == pytest.approx(last["nvcomp/saved_s_total"] * 2 / 3600)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ddp_gloo_rank_zero_writes_bit_exact_checkpoints(tmp_path: Path, mode: str) -> None:
    """Two CPU ranks, the default plugin (storage probe included): only rank 0 writes, and runs no collective the
    other rank does not (at b9d8c77 the probe's barrier + all_reduce on rank 0 alone crashed or deadlocked DDP)."""
    results, ckdir = _run_ddp(tmp_path, 2, mode)
    _check_ddp(results, ckdir, 2)


# ----------------------------------------------------------------------------------------------------------------
# 9. bad arguments
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, option",
    [
        (dict(codec="gzip"), "codec"),
        (dict(codec="ZSTD"), "codec"),
        (dict(staging_mb=0), "staging_mb"),
        (dict(staging_mb=-1), "staging_mb"),
        (dict(probe_mb=0), "probe_mb"),
    ],
)
def test_bad_arguments(kwargs: dict, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        NvcompCheckpointIO(**kwargs)


def test_storage_options_refused(tmp_path: Path) -> None:
    plugin = NvcompCheckpointIO(codec="zstd", probe_mb=4)
    with pytest.raises(TypeError, match="storage_options"):
        plugin.save_checkpoint({"w": torch.ones(2)}, tmp_path / "x.ckpt", storage_options={"a": 1})
    assert os.listdir(tmp_path) == []


def test_gpu_state_nbytes_counts_parameters_buffers_and_optimizer_state_once() -> None:
    """What the savings callback pins ahead for: every parameter, buffer and optimizer tensor on the device, a
    tensor reached twice (a tied weight) counted once."""
    from lightning_nvcomp.integrations.lightning.checkpoint_io import gpu_state_nbytes

    module = model()
    module.tied = module.net[0].weight  # the same Parameter under a second name
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values()]
    assert len(state) == 3 * 4  # step, exp_avg, exp_avg_sq of each of the 4 parameters
    expected = sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers(), *state])
    assert gpu_state_nbytes(module, [optimizer], "cpu") == expected
    assert gpu_state_nbytes(module, [optimizer], "cuda") == 0
