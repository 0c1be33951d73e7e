"""Training's slowdown while writes run behind it: real optimizer steps timed by their step hooks, the policy's
objective counting it, and a real Trainer reporting it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from lightning_nvcomp import NvcompCheckpointIO
from lightning_nvcomp.auto.calibration import CodecProfile
from lightning_nvcomp.auto.policy import CodecPolicy
from lightning_nvcomp.auto.prediction import predict, slowed_seconds
from lightning_nvcomp.auto.steps import MIN_STEPS, StepTimer

from tests.helpers.lightning_models import TinyData, TinyModule, quiet_trainer


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(4))], lr=0.1)


def _steps(optimizer: torch.optim.Optimizer, n: int, seconds: float, between=None) -> None:
    """``n`` optimizer steps, each after ``seconds`` of "forward and backward" (and ``between()``, if given)."""
    for _ in range(n):
        time.sleep(seconds)
        if between is not None:
            between()
        optimizer.step()


def test_steps_with_a_write_behind_them_are_timed_apart_from_the_others():
    """Steps run while a write is in progress take twice as long here: the slowdown is measured as about 1.0 (one
    more step time each); steps in which the write began or ended count as neither kind."""
    writing = [False]
    timer = StepTimer(lambda: writing[0])
    opt = _optimizer()
    timer.watch([opt])
    timer.start()
    try:
        _steps(opt, MIN_STEPS + 1, 0.01)
        assert timer.slowdown() is None  # no step with a write behind it yet
        for _ in range(3):
            writing[0] = True
            _steps(opt, 4, 0.02)
            writing[0] = False
            _steps(opt, 4, 0.01)
        slowdown = timer.slowdown()
        assert slowdown is not None and 0.6 < slowdown < 1.4, slowdown
    finally:
        timer.stop()


def test_a_step_a_save_started_in_is_not_timed_and_stop_removes_the_hook():
    writing = [False]
    timer = StepTimer(lambda: writing[0])
    opt = _optimizer()
    timer.watch([opt])
    timer.start()
    _steps(opt, MIN_STEPS + 1, 0.005)
    writing[0] = True
    _steps(opt, MIN_STEPS + 1, 0.05, between=timer.save_started)  # each of these steps holds a save
    assert timer.slowdown() is None
    _steps(opt, MIN_STEPS + 1, 0.005)
    assert timer.slowdown() == pytest.approx(0.0, abs=0.5)  # the steps after the last save are like the others
    timer.stop()
    before = timer.slowdown()
    _steps(opt, MIN_STEPS + 1, 0.05)  # no longer timed
    assert timer.slowdown() == before


def test_slowed_seconds_are_the_steps_not_run():
    assert slowed_seconds(0.0, 10.0) == 0.0
    assert slowed_seconds(1.0, 10.0) == pytest.approx(5.0)  # at half speed for 10 s: 5 s of training lost
    assert slowed_seconds(0.25, 10.0) == pytest.approx(2.0)


def test_the_async_prediction_counts_training_slowed_by_the_write():
    zstd = CodecProfile("zstd", 1.5, 10.0)
    base = predict(int(4e9), zstd, 1.0, "async", interval_s=60.0)
    slowed = predict(int(4e9), zstd, 1.0, "async", interval_s=60.0, slowdown=0.5)
    assert slowed.blocked_s == pytest.approx(base.blocked_s + slowed.write_s / 3)
    long_write = predict(int(4e9), zstd, 1.0, "async", interval_s=1.0, slowdown=0.5)  # slowed for 1 s, then waits
    assert long_write.blocked_s == pytest.approx(0.4 + (long_write.write_s - 1.0) + 1.0 / 3)
    sync = predict(int(4e9), zstd, 1.0, "sync", slowdown=0.5)
    assert sync.blocked_s == predict(int(4e9), zstd, 1.0, "sync").blocked_s  # training waits: nothing runs behind


def test_a_measured_slowdown_moves_auto_to_the_smaller_file_in_async_mode(tmp_path):
    """Storing raw costs nothing to code but writes 1.5x the bytes behind training: once training is measured to
    run at half speed meanwhile, zstd's shorter write loses less."""
    profiles = [CodecProfile("none", 1.0, float("inf")), CodecProfile("zstd", 1.5, 10.0)]
    policy = CodecPolicy("async", interval_s=60.0, write_gbps=1.0, profiles=profiles)
    state = [torch.empty(1_000_000_000, dtype=torch.float32, device="meta")]  # 4 GB as the model sees it
    assert policy.decide(state, str(tmp_path))[0].codec == "none"
    policy.observe_slowdown(None)  # not measured: nothing changes
    assert policy.decide(state, str(tmp_path))[0].codec == "none"
    policy.observe_slowdown(1.0)
    chosen, predictions = policy.decide(state, str(tmp_path))
    assert chosen.codec == "zstd", predictions
    assert policy.in_mode("async").slowdown == 1.0


class _SlowedWhileWriting(TinyModule):
    """The tiny model with a large buffer (written for a while behind training), whose steps take twice as long
    while its checkpoint IO has a write in progress: a known slowdown for the run to measure."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bulk", torch.arange(16 << 20, dtype=torch.float32))

    def training_step(self, batch, batch_idx):
        writer = self.trainer.strategy.checkpoint_io.writer
        time.sleep(0.008 if writer.pending() else 0.004)
        return super().training_step(batch, batch_idx)


def test_a_fit_reports_the_slowdown_and_what_it_cost(tmp_path: Path):
    """A real fit with async saves whose writes run behind training: once steps of both kinds are timed, each
    save's metrics carry the slowdown (the model's 4 ms more per step while a write runs: up to 1.0, less by the
    step's own time), its cost while that checkpoint was written, and the lost time (blocked + slowed) the savings
    are counted from."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    # Page-cache durability: each write takes a memory copy's time, far less than the 48 steps between saves, so
    # steps of both kinds occur whatever the disk.
    plugin = NvcompCheckpointIO(codec="none", async_save=True, durable="os", probe_mb=4)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=48, save_top_k=-1)
    trainer = quiet_trainer(tmp_path, plugins=[plugin], callbacks=[checkpoints], max_epochs=30)
    torch.manual_seed(0)
    trainer.fit(_SlowedWhileWriting(), datamodule=TinyData(n=64))
    history = plugin.savings.history
    measured = [m for m in history if "nvcomp/slowdown" in m]
    assert len(history) == 5 and measured, history
    for m in measured:
        # 4 ms more per step of about 4: 1.0 on an idle machine; less where every step takes longer (a loaded
        # machine: 0.10 seen on 2 shared cores), more where the write takes the cores the steps need (1.96 seen)
        assert 0 < m["nvcomp/slowdown"] < 3, m
        assert m["nvcomp/slowed_s"] > 0
        assert m["nvcomp/lost_s"] == pytest.approx(m["nvcomp/blocked_s"] + m["nvcomp/slowed_s"])
        assert m["nvcomp/saved_s"] == pytest.approx(m["nvcomp/baseline_s"] - m["nvcomp/lost_s"])
    before = plugin.writer.steps.slowdown()
    _steps(_optimizer(), 100, 0.0)  # instant steps: they would fill the window if still timed
    assert plugin.writer.steps.slowdown() == before  # the fit's end removed the step hook
