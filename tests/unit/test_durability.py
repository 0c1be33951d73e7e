"""Durability as a stated choice (issue 15, item 1): ``durable="sync"`` flushes before the save returns,
``"background"`` flushes behind training and prunes an older checkpoint only once the newer ones are durable,
``"os"`` never flushes (as ``torch.save``); async saves do not wait for earlier writes while the host buffer holds
the new snapshot, and say so when they must.

Real files and real saves. The flushes are observed through ``os.fsync``, which still runs: a spy records which
file each flush was of and when, and can make flushes slow (a disk that takes its time to make data durable)."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from lightning_nvcomp.options import Durability, SaveOptions
from lightning_nvcomp.saving.writer import CheckpointWriter
from lightning_nvcomp.storage import ThrottledStorage

from tests.helpers.states import assert_tree_bit_exact


class FsyncSpy:
    """Records every ``os.fsync`` (the file's path, the thread, the time) and sleeps ``delay_s`` in each first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.delay_s = delay_s
        real = os.fsync

        def fsync(fd: int) -> None:
            time.sleep(self.delay_s)
            real(fd)
            self.calls.append((os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread().name, time.monotonic()))

        monkeypatch.setattr(os, "fsync", fsync)

    def files(self) -> list[str]:
        """The flushed files' names, a temporary file's without its leading dot (a file may be flushed under its
        temporary name or its own)."""
        return [os.path.basename(path).lstrip(".") for path, _, _ in self.calls if not os.path.isdir(path)]


def state(n: int = 1 << 16, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return {"w": torch.randn(n), "step": seed}


def writer(durable: str, **kwargs) -> CheckpointWriter:
    return CheckpointWriter(SaveOptions(codec="zstd", durable=Durability.parse(durable), probe_mb=1, **kwargs))


def save(w: CheckpointWriter, obj: dict, path: Path) -> float:
    begin = time.monotonic()
    w.save(obj, path)
    w.commit(obj["step"], str(path))
    return time.monotonic() - begin


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="the spy names files through /proc")
def test_each_durability_flushes_when_it_says(tmp_path, monkeypatch):
    w = writer("sync")
    save(w, state(), tmp_path / "probe.ckpt")  # the one-off probe of this file system, before the spy
    w.close()
    spy = FsyncSpy(monkeypatch)
    for durable in ("sync", "background", "os"):
        w = writer(durable)
        save(w, state(seed=1), tmp_path / f"{durable}.ckpt")
        flushed_on_return = [f for f in spy.files() if f.startswith(f"{durable}.ckpt")]
        w.close()
        flushed = [f for f in spy.files() if f.startswith(f"{durable}.ckpt")]
        if durable == "sync":
            assert flushed_on_return, "durable='sync': the file is flushed before the save returns"
        elif durable == "background":
            threads = {thread for path, thread, _ in spy.calls if os.path.basename(path) == "background.ckpt"}
            assert threads == {"lightning-nvcomp-write_0"}, threads  # flushed on the writer thread
        else:
            assert not flushed, "durable='os' never flushes"
        assert_tree_bit_exact(state(seed=1), torch.load(tmp_path / f"{durable}.ckpt", weights_only=True))
    assert [m.get("nvcomp/durable_s") is None for m in w.savings.history] == [True]  # "os": never known durable


def test_background_returns_before_the_flush_with_the_file_in_place(tmp_path, monkeypatch):
    w = writer("background")
    save(w, state(), tmp_path / "first.ckpt")
    w.wait()
    spy = FsyncSpy(monkeypatch, delay_s=0.5)
    path = tmp_path / "second.ckpt"
    seconds = save(w, state(seed=2), path)
    assert seconds < 0.5 and w.pending()  # not yet flushed ...
    assert_tree_bit_exact(state(seed=2), torch.load(path, weights_only=True))  # ... but in place, readable
    w.wait()
    assert spy.calls
    assert_tree_bit_exact(state(seed=2), torch.load(path, weights_only=True))
    metrics = w.savings.history[-1]
    assert metrics["nvcomp/durable_s"] >= 0.5 > metrics["nvcomp/blocked_s"]
    w.close()


def test_background_prunes_an_older_checkpoint_only_once_the_newer_is_durable(tmp_path, monkeypatch):
    w = writer("background")
    old = tmp_path / "old.ckpt"
    save(w, state(seed=1), old)
    w.wait()
    FsyncSpy(monkeypatch, delay_s=0.3)
    save(w, state(seed=2), tmp_path / "new.ckpt")
    w.discard(old)  # what top-k pruning does right after the new save
    assert old.exists()  # the newer checkpoint is not durable yet
    w.wait()
    assert not old.exists() and (tmp_path / "new.ckpt").exists()

    # a newer save that fails (its flush: an I/O error of the disk) keeps the older checkpoint
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    save(w, state(seed=3), tmp_path / "failed.ckpt")
    w.discard(tmp_path / "new.ckpt")
    with pytest.raises(RuntimeError, match="failed.ckpt"):
        w.wait()
    assert_tree_bit_exact(state(seed=2), torch.load(tmp_path / "new.ckpt", weights_only=True))
    w.close()


def test_async_saves_do_not_wait_while_the_host_buffer_holds_them(tmp_path, caplog):
    w = writer("background", async_save=True)
    w.storage = ThrottledStorage(2e6)  # ~1 MB checkpoints: each write takes ~0.5 s
    big = lambda seed: state(1 << 18, seed)  # noqa: E731
    save(w, big(0), tmp_path / "0.ckpt")
    w.wait()
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.saving.writer"):
        blocked = [save(w, big(i), tmp_path / f"{i}.ckpt") for i in (1, 2)]
        assert max(blocked) < 0.3, blocked  # save 2 did not wait for write 1: the buffer holds two checkpoints
        assert not caplog.records
        save(w, big(3), tmp_path / "3.ckpt")  # writes 1 and 2 still running: past the buffer, it waits
    assert any("waited" in r.getMessage() and "slower than the saves" in r.getMessage() for r in caplog.records)
    w.wait()
    waited = [m["nvcomp/waited_s"] for m in w.savings.history]
    assert waited[:3] == [0.0, 0.0, 0.0] and waited[3] > 0.1, waited
    for i in range(4):
        assert_tree_bit_exact(big(i), torch.load(tmp_path / f"{i}.ckpt", weights_only=True))
    w.close()


def test_a_larger_host_buffer_waits_less(tmp_path, caplog):
    w = writer("background", async_save=True, host_buffer_mb=64)
    w.storage = ThrottledStorage(4e6)
    save(w, state(1 << 18, 0), tmp_path / "0.ckpt")
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.saving.writer"):
        blocked = [save(w, state(1 << 18, i), tmp_path / f"{i}.ckpt") for i in (1, 2, 3)]
    assert max(blocked) < 0.3 and not caplog.records, blocked
    w.close()
    assert sorted(os.listdir(tmp_path)) == ["0.ckpt", "1.ckpt", "2.ckpt", "3.ckpt"]


def test_durability_is_an_option_of_the_integrations():
    from lightning_nvcomp import NvcompCheckpointIO

    assert NvcompCheckpointIO(codec="zstd").writer.options.durable is Durability.BACKGROUND
    assert NvcompCheckpointIO(codec="zstd", durable="os").writer.storage.fsync is False
    with pytest.raises(ValueError, match="durable must be one of"):
        NvcompCheckpointIO(codec="zstd", durable="never")


# -- the savings baseline: torch.save's fixed costs, timed with the same durability, plus bytes over bandwidth ------


def test_the_baseline_is_fixed_costs_timed_once_plus_bytes_over_the_bandwidth(tmp_path, monkeypatch):
    w = writer("background")
    spy = FsyncSpy(monkeypatch)
    save(w, state(seed=1), tmp_path / "a.ckpt")
    save(w, state(seed=2), tmp_path / "b.ckpt")
    w.close()
    assert w.baseline.measured
    assert any(".lightning-nvcomp-baseline-" in path for path, _, _ in spy.calls)  # flushed: same durability
    first, second = w.savings.history
    assert first["nvcomp/probe_s"] > 0 and second["nvcomp/probe_s"] == 0  # reported once, as what it is
    gbps = w.policy.write_gbps(str(tmp_path))
    for metrics in (first, second):
        fixed_s = metrics["nvcomp/baseline_s"] - metrics["nvcomp/raw_gb"] / gbps
        assert 0 < fixed_s < first["nvcomp/probe_s"]  # a small save's costs, timed within the probe's time
    assert second["nvcomp/baseline_s"] == pytest.approx(first["nvcomp/baseline_s"])  # same size, same cost
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt", "b.ckpt"]  # the timed saves and the probe are gone


def test_the_baseline_of_os_durability_does_not_flush_and_remote_storage_uses_the_bandwidth(tmp_path, monkeypatch):
    spy = FsyncSpy(monkeypatch)
    w = writer("os")
    save(w, state(seed=1), tmp_path / "a.ckpt")
    w.close()
    assert w.baseline.measured and not any(".lightning-nvcomp-baseline-" in p for p, _, _ in spy.calls)

    remote = CheckpointWriter(SaveOptions(codec="zstd"))
    save(remote, state(seed=1), "memory://baseline/a.ckpt")
    remote.close()
    metrics = remote.savings.history[0]
    assert not remote.baseline.measured  # no torch.save is timed in a bucket: its bytes over its bandwidth
    gbps = remote.policy.write_gbps("memory://baseline")
    assert metrics["nvcomp/baseline_s"] == pytest.approx(metrics["nvcomp/raw_gb"] / gbps)
