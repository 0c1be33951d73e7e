"""Saves that are never silently wrong about where and how they write (issue 12, "Nothing silently wrong").

Real files, real processes, a real small file system (a 16 MiB tmpfs where root may mount one, else a test double):

* a URL path (``s3://...``) never reaches the OS: the local write refuses it at once, naming it, with nothing
  written (not even a local ``s3:`` folder), and every save and load sends it to its remote storage instead;
* a re-save keeps the file's permission bits and writes through a symbolic link, as ``torch.save`` does;
* temporary and trash names are ``.NAME.lnv-<host>-<pid>-<token>.tmp`` / ``.lnv-old``; a save sweeps only those of
  this host whose process is dead and whose lock is free, never another program's, host's or a live save's;
* the storage probe never makes a save fail: bounded by the checkpoint and the free space, skipped with a warning
  and an assumed bandwidth that the first real write replaces.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lightning_nvcomp
from lightning_nvcomp.auto.calibration import CodecProfile
from lightning_nvcomp.auto.policy import CodecPolicy
from lightning_nvcomp.auto.probe import FALLBACK_GBPS, MIN_PROBE_NBYTES, measure_bandwidth
from lightning_nvcomp.format import find_contents
from lightning_nvcomp.options import SaveOptions
from lightning_nvcomp.saving.writer import CheckpointWriter
from lightning_nvcomp.storage import discards, temp_names
from lightning_nvcomp.storage import local as storage
from lightning_nvcomp.storage.local import Storage
from lightning_nvcomp.storage.temp_names import HOST_ID

from tests.helpers.paths import REPO_ROOT

MiB = 1 << 20
URLS = [
    "s3://bucket/run/x.ckpt",
    "gs://b/x.ckpt",
    "abfs://c@a.dfs.core.windows.net/x",
    "hdfs://nn:8020/x",
    "memory://x/y.ckpt",
    "file:///tmp/x.ckpt",
]


def _payload(f, nbytes: int = 4096) -> None:
    f.write(b"\x5a" * nbytes)


def _own(name: str, suffix: str, pid: int | None = None) -> re.Pattern:
    pid_re = r"[1-9][0-9]*" if pid is None else str(pid)
    return re.compile(rf"^\.{re.escape(name)}\.lnv-{HOST_ID}-{pid_re}-[0-9a-f]{{8}}{re.escape(suffix)}$")


def _dead_pid() -> int:
    """The id of a process that has exited and been reaped (re-checked: ids are reused, rarely this fast)."""
    for _ in range(10):
        proc = subprocess.Popen(["true"])
        proc.wait()
        try:
            os.kill(proc.pid, 0)
        except ProcessLookupError:
            return proc.pid
    pytest.skip("could not find a dead process id")


# -- 1. remote paths -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", URLS)
def test_atomic_write_refuses_a_url_and_writes_nothing(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=re.escape(url)) as info:
        storage.atomic_write(url, _payload)
    assert "remote URL" in str(info.value) and "nothing was written" in str(info.value)
    with pytest.raises(ValueError, match=re.escape(url)):
        Storage().write(url, _payload)
    with pytest.raises(ValueError, match=re.escape(url)):
        storage.target_directory(url)
    with pytest.raises(ValueError, match=re.escape(url)):
        storage.discard(url)
    assert os.listdir(tmp_path) == []


def test_a_pathlib_path_made_from_a_url_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="s3:/bucket/x.ckpt"):
        storage.atomic_write(Path("s3://bucket/x.ckpt"), _payload)  # pathlib reads it as s3:/bucket/x.ckpt
    assert os.listdir(tmp_path) == []
    assert storage.check_local(Path("run:1") / "x") == "run:1/x"  # a colon in a local name is fine
    assert storage.check_local("relative/x.ckpt") == "relative/x.ckpt"


def test_checkpoint_writer_sends_a_url_to_its_remote_storage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    writer = CheckpointWriter(SaveOptions(codec="zstd", probe_mb=4))
    try:
        writer.save({"w": torch.ones(4)}, "memory://lnv-safety/run/epoch=0.ckpt")
    finally:
        writer.close()
    assert os.listdir(tmp_path) == []  # no local folder named "memory:"
    assert torch.equal(lightning_nvcomp.load("memory://lnv-safety/run/epoch=0.ckpt")["w"], torch.ones(4))


def test_lightning_checkpoint_io_at_a_url_writes_nothing_locally(tmp_path, monkeypatch):
    from lightning_nvcomp import NvcompCheckpointIO

    monkeypatch.chdir(tmp_path)
    io = NvcompCheckpointIO(codec="zstd", probe_mb=4)
    url = "memory://lnv-safety-io/run/last.ckpt"
    try:
        io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, url)
        assert torch.equal(io.load_checkpoint(url)["state_dict"]["w"], torch.ones(3))
        io.remove_checkpoint(url)
        with pytest.raises(FileNotFoundError, match=re.escape(url)):
            io.load_checkpoint(url)
        with pytest.raises(ValueError, match="pathlib"):
            io.save_checkpoint({"global_step": 1}, Path("s3://b/run/last.ckpt"))
    finally:
        io.teardown()
    assert os.listdir(tmp_path) == []


def test_accelerate_refuses_automatic_naming_into_a_url_project_dir(tmp_path, monkeypatch):
    from accelerate.utils import ProjectConfiguration

    from lightning_nvcomp.integrations.accelerate.attach import attach

    from tests.helpers import accelerate_runs as R

    monkeypatch.chdir(tmp_path)
    config = ProjectConfiguration(project_dir="s3://bucket/run", automatic_checkpoint_naming=True)
    run = R.build(seed=3, project_config=config)
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4)
    try:
        with pytest.raises(ValueError, match=re.escape("s3://bucket/run")):
            run.accelerator.save_state()
        with pytest.raises(ValueError, match=re.escape("s3://bucket/run")):
            run.accelerator.load_state()
    finally:
        attachment.detach()
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


# -- 2. mode and symbolic links ------------------------------------------------------------------------------------


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604])
def test_a_resave_keeps_the_permission_bits(tmp_path, umask_022, mode):
    path = tmp_path / "model.ckpt"
    storage.atomic_write(path, _payload)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # a new file: 0o666 less the umask, as open() makes it
    path.chmod(mode)
    storage.atomic_write(path, lambda f: f.write(b"new"))
    assert stat.S_IMODE(path.stat().st_mode) == mode  # torch.save keeps it; today it became 0644
    assert path.read_bytes() == b"new"
    storage.wait_for_discards()
    assert os.listdir(tmp_path) == ["model.ckpt"]


def test_a_save_writes_through_a_symlink_to_its_target(tmp_path, umask_022):
    (tmp_path / "real").mkdir()
    (tmp_path / "ckpts").mkdir()
    target = tmp_path / "real" / "model.ckpt"
    target.write_bytes(b"old")
    target.chmod(0o600)
    link = tmp_path / "ckpts" / "last.ckpt"
    link.symlink_to(Path("..") / "real" / "model.ckpt")  # relative, into another directory
    size = storage.atomic_write(link, lambda f: f.write(b"new state"))
    assert size == 9
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "real", "model.ckpt")
    assert target.read_bytes() == b"new state" and not target.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    storage.wait_for_discards()
    assert os.listdir(tmp_path / "real") == ["model.ckpt"]  # no temp, no trash left beside the target
    assert os.listdir(tmp_path / "ckpts") == ["last.ckpt"]


def test_a_save_follows_a_chain_of_symlinks(tmp_path):
    final = tmp_path / "c.ckpt"
    final.write_bytes(b"old")
    (tmp_path / "b.ckpt").symlink_to("c.ckpt")
    (tmp_path / "a.ckpt").symlink_to(tmp_path / "b.ckpt")  # absolute
    storage.atomic_write(tmp_path / "a.ckpt", lambda f: f.write(b"chained"))
    assert (tmp_path / "a.ckpt").is_symlink() and (tmp_path / "b.ckpt").is_symlink()
    assert final.read_bytes() == b"chained"
    storage.wait_for_discards()
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt", "b.ckpt", "c.ckpt"]


def test_a_save_through_a_dangling_symlink_creates_its_target(tmp_path):
    (tmp_path / "store").mkdir()
    link = tmp_path / "last.ckpt"
    link.symlink_to(tmp_path / "store" / "new.ckpt")
    storage.atomic_write(link, lambda f: f.write(b"first"))
    assert link.is_symlink()
    assert (tmp_path / "store" / "new.ckpt").read_bytes() == b"first"
    assert os.listdir(tmp_path / "store") == ["new.ckpt"]


def test_a_symlink_loop_is_an_error_and_writes_nothing(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError) as info:
        storage.atomic_write(tmp_path / "a", _payload)
    assert info.value.errno == errno.ELOOP and "a" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


# -- 3. temporary and trash names; the sweep -----------------------------------------------------------------------


def test_temp_and_trash_names_are_ours_and_the_temp_is_locked_while_written(tmp_path):
    path = tmp_path / "model.ckpt"
    storage.atomic_write(path, _payload)
    seen = {}

    def write(f):
        (name,) = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        seen["tmp"] = name
        with open(tmp_path / name, "rb") as other:  # another open file description: flock conflicts with ours
            with pytest.raises(BlockingIOError):
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write(b"new")

    hold, release = threading.Event(), threading.Event()
    discards._deleter().submit(lambda: (hold.set(), release.wait(10)))  # keep the trash name around to look at it
    hold.wait(10)
    try:
        storage.atomic_write(path, write)
        trash = [n for n in os.listdir(tmp_path) if n != "model.ckpt"]
    finally:
        release.set()
    assert _own("model.ckpt", ".tmp", os.getpid()).match(seen["tmp"]), seen["tmp"]
    assert len(trash) == 1 and _own("model.ckpt", ".lnv-old", os.getpid()).match(trash[0]), trash
    assert re.fullmatch(r"[0-9a-f]{8}", HOST_ID)
    storage.wait_for_discards()
    assert os.listdir(tmp_path) == ["model.ckpt"]
    pruned = tmp_path / "epoch=1.ckpt"
    storage.atomic_write(pruned, _payload)
    storage.discard(pruned)
    storage.wait_for_discards()
    assert os.listdir(tmp_path) == ["model.ckpt"]


def test_a_long_file_name_still_fits(tmp_path):
    path = tmp_path / ("m" * 250 + ".ckpt")  # 255 bytes: a temp name must shorten the name it is for
    storage.atomic_write(path, _payload)
    storage.atomic_write(path, _payload)
    storage.wait_for_discards()
    assert os.listdir(tmp_path) == [path.name]


SLOW_SAVE = """
import sys
from lightning_nvcomp.storage import ThrottledStorage

def write(f):
    for _ in range(400):  # 26 MB at 1 MB/s: far longer than any test waits
        f.write(b"\\x00" * 65536)
        f.flush()

ThrottledStorage(1e6).write(sys.argv[1], write)
"""


def _start_slow_save(path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVE, str(path)],
        cwd=str(REPO_ROOT),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_for_temp(proc: subprocess.Popen, directory: Path, name: str) -> str:
    """The temp file the child ``proc`` is writing in ``directory`` for ``name``, once it holds some bytes."""
    pattern = _own(name, ".tmp", proc.pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for n in os.listdir(directory):
            if pattern.match(n) and (directory / n).stat().st_size > 0:
                return n
        if proc.poll() is not None:
            raise AssertionError(f"the child exited ({proc.returncode}): {proc.stderr.read().decode()}")
        time.sleep(0.02)
    raise AssertionError("the child never started writing")


def test_a_save_killed_mid_write_leaves_a_temp_the_next_save_removes(tmp_path):
    path = tmp_path / "model.ckpt"
    proc = _start_slow_save(path)
    try:
        temp = _wait_for_temp(proc, tmp_path, "model.ckpt")
    finally:
        proc.kill()  # SIGKILL: nothing runs in the child after this
        proc.wait()
        proc.stderr.close()
    assert (tmp_path / temp).exists() and not path.exists()
    dead_trash = tmp_path / f".epoch=3.ckpt.lnv-{HOST_ID}-{proc.pid}-0123abcd.lnv-old"  # died before freeing it
    dead_trash.write_bytes(b"old checkpoint")
    assert sorted(temp_names.stale_files(str(tmp_path))) == sorted([str(tmp_path / temp), str(dead_trash)])
    storage.atomic_write(path, _payload)  # today: never swept (54 partial files, 6.7 GB after 84 kills)
    storage.wait_for_discards()
    assert os.listdir(tmp_path) == ["model.ckpt"]


def test_the_temp_of_a_live_save_is_left_alone(tmp_path):
    live, killed = _start_slow_save(tmp_path / "live.ckpt"), _start_slow_save(tmp_path / "killed.ckpt")
    try:
        live_temp = _wait_for_temp(live, tmp_path, "live.ckpt")
        killed_temp = _wait_for_temp(killed, tmp_path, "killed.ckpt")
        killed.kill()
        killed.wait()
        live.send_signal(signal.SIGSTOP)  # paused mid-write: alive, its temp locked
        storage.atomic_write(tmp_path / "other.ckpt", _payload)
        storage.wait_for_discards()
        names = set(os.listdir(tmp_path))
        assert live_temp in names  # a live process's temp survives
        assert killed_temp not in names  # the dead one's does not (today: both stay forever)
    finally:
        live.kill()
        live.wait()
        for proc in (live, killed):
            proc.stderr.close()
    storage.atomic_write(tmp_path / "other.ckpt", _payload)  # now that its writer is dead, it goes too
    storage.wait_for_discards()
    assert sorted(os.listdir(tmp_path)) == ["other.ckpt"]


HOLD_LOCK = """
import fcntl, sys, time
f = open(sys.argv[1], "wb")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


def test_a_locked_temp_survives_even_if_its_pid_looks_dead(tmp_path):
    """The pid says dead (a writer in another pid namespace of this host, say), but its lock is held: kept."""
    pid = _dead_pid()
    locked = tmp_path / f".model.ckpt.lnv-{HOST_ID}-{pid}-00000001.tmp"
    unlocked = tmp_path / f".model.ckpt.lnv-{HOST_ID}-{pid}-00000002.tmp"
    unlocked.write_bytes(b"partial")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(locked)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        storage.atomic_write(tmp_path / "model.ckpt", _payload)
        storage.wait_for_discards()
        assert sorted(os.listdir(tmp_path)) == sorted(["model.ckpt", locked.name])
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_files_the_sweep_did_not_make_survive(tmp_path):
    pid = _dead_pid()
    other_host = "0123abcd" if HOST_ID != "0123abcd" else "fedcba98"
    foreign = [
        ".foo.lnv-old",  # a user's file that merely ends like ours (today: deleted by any save)
        ".model.ckpt.0123abcd.lnv-old",  # the old naming, or anyone's
        ".model.ckpt.1234.tmp",  # another program's temp
        ".model.ckpt.abc.tmp",
        f".model.ckpt.lnv-{other_host}-{pid}-01234567.lnv-old",  # another host's: its pids mean nothing here
        f".model.ckpt.lnv-{other_host}-{pid}-01234567.tmp",
        f".model.ckpt.lnv-{HOST_ID}-{pid}-0123.tmp",  # not exactly our pattern
        f"model.ckpt.lnv-{HOST_ID}-{pid}-01234567.tmp",  # not hidden
        f".model.ckpt.lnv-{HOST_ID}-{pid}-01234567.tmp.bak",
    ]
    for name in foreign:
        (tmp_path / name).write_bytes(b"keep me")
    (tmp_path / f".dir.lnv-{HOST_ID}-{pid}-01234567.tmp").mkdir()  # a directory of our pattern
    ours = tmp_path / f".model.ckpt.lnv-{HOST_ID}-{pid}-89abcdef.lnv-old"
    ours.write_bytes(b"stale")
    storage.atomic_write(tmp_path / "model.ckpt", _payload)
    storage.atomic_write(tmp_path / "model.ckpt", _payload)
    storage.wait_for_discards()
    left = set(os.listdir(tmp_path))
    assert left == set(foreign) | {"model.ckpt", f".dir.lnv-{HOST_ID}-{pid}-01234567.tmp"}, left
    assert all((tmp_path / n).read_bytes() == b"keep me" for n in foreign)


# -- 4. the storage probe never fails a save -----------------------------------------------------------------------


class CountingStorage(Storage):
    """Storage that records how many bytes each file got (and can fail like a full disk)."""

    def __init__(self, fail: bool = False) -> None:
        self.written: list[int] = []
        self.fail = fail

    def write(self, path, write):
        sink = _Counter()
        try:
            return super().write(path, lambda f: write(sink.attach(f, self.fail)))
        finally:
            self.written.append(sink.n)


class _Counter:
    n = 0

    def attach(self, f, fail):
        self.f, self.fail, self.n = f, fail, 0
        return self

    def write(self, data):
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.n += memoryview(data).nbytes
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


class _Statvfs:
    def __init__(self, free: int) -> None:
        self.f_bavail, self.f_frsize, self.f_bsize = free // 4096, 4096, 4096


def _small_free_space(monkeypatch, free: int) -> None:
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: _Statvfs(free) if os.path.isdir(path) else real(path))


def test_the_probe_is_bounded_by_the_checkpoint_size(tmp_path):
    counting = CountingStorage()
    policy = CodecPolicy(storage=counting)  # probe_nbytes: 256 MiB
    policy.write_gbps(str(tmp_path), raw_nbytes=4096)
    assert counting.written == [MIN_PROBE_NBYTES]  # today: 256 MiB for a 4 KB checkpoint
    counting2 = CountingStorage()
    CodecPolicy(storage=counting2).write_gbps(str(tmp_path), raw_nbytes=6 * MiB)
    CodecPolicy(probe_nbytes=5 * MiB, storage=counting2).write_gbps(str(tmp_path), raw_nbytes=100 * MiB)
    assert counting2.written == [6 * MiB, 5 * MiB]
    # decide() passes the size of the state it decides for
    counting3 = CountingStorage()
    zstd = CodecProfile("zstd", 2.0, 1.0)
    CodecPolicy(storage=counting3, profiles=[zstd]).decide([torch.ones(1024)], str(tmp_path))
    assert counting3.written == [MIN_PROBE_NBYTES]
    assert os.listdir(tmp_path) == []


def test_the_checkpoint_writer_probes_with_the_checkpoint_size(tmp_path):
    writer = CheckpointWriter(SaveOptions(codec="zstd"))  # probe: 256 MiB
    counting = writer.policy.storage = CountingStorage()
    w = torch.randn(3 * MiB // 4)  # 3 MiB of float32 ...
    try:
        writer.save({"w": w, "view": w[10:], "b": torch.zeros(4)}, tmp_path / "a.ckpt")  # ... and a view of it
        writer.commit(1, str(tmp_path / "a.ckpt"))
    finally:
        writer.close()
    assert counting.written == [MIN_PROBE_NBYTES]
    assert find_contents([w, w[10:], torch.zeros(4)]).nbytes == 3 * MiB + 16  # each storage once


def test_a_probe_without_space_is_skipped_with_a_warning_and_the_first_write_replaces_it(tmp_path, monkeypatch, caplog):
    _small_free_space(monkeypatch, 8 * MiB)  # a quarter of it is less than the smallest probe
    policy = CodecPolicy(storage=CountingStorage())
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.auto.probe"):
        gbps = policy.write_gbps(str(tmp_path), raw_nbytes=4096)
    assert gbps == FALLBACK_GBPS and policy.bandwidth_assumed(str(tmp_path))
    assert policy.storage.written == [] and os.listdir(tmp_path) == []  # nothing written at all
    (record,) = [r for r in caplog.records if r.name == "lightning_nvcomp.auto.probe"]
    assert record.levelno == logging.WARNING
    assert str(tmp_path) in record.getMessage() and "8.0 MiB" in record.getMessage()
    assert str(FALLBACK_GBPS) in record.getMessage()
    policy.observe_write(str(tmp_path), 4096, 0.002)  # a tiny real write: still better than an assumption
    assert policy.write_gbps(str(tmp_path)) == pytest.approx(4096 / 0.002 / 1e9)
    assert not policy.bandwidth_assumed(str(tmp_path))
    policy.observe_write(str(tmp_path), 4096, 1.0)  # now measured: small writes are ignored again
    assert policy.write_gbps(str(tmp_path)) == pytest.approx(4096 / 0.002 / 1e9)


def test_a_failing_probe_write_is_skipped_not_raised(tmp_path, caplog):
    policy = CodecPolicy(storage=CountingStorage(fail=True))
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.auto.probe"):
        assert policy.write_gbps(str(tmp_path)) == FALLBACK_GBPS  # today: OSError naming the probe file
    assert policy.bandwidth_assumed(str(tmp_path))
    assert any("No space left" in r.getMessage() and str(tmp_path) in r.getMessage() for r in caplog.records)
    assert os.listdir(tmp_path) == []


def test_an_assumed_bandwidth_is_replaced_by_a_real_save(tmp_path, monkeypatch):
    _small_free_space(monkeypatch, 2 * MiB)
    policy = CodecPolicy()
    stats = lightning_nvcomp.save({"w": torch.randn(1024)}, tmp_path / "ck.pt", codec="auto", policy=policy)
    assert stats.file_nbytes > 0
    assert not policy.bandwidth_assumed(str(tmp_path))
    assert policy.write_gbps(str(tmp_path)) != FALLBACK_GBPS


@pytest.fixture
def small_fs(tmp_path):
    """A real 16 MiB file system (tmpfs), mounted for the test and unmounted after; skipped where not allowed."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 16 MiB tmpfs needs root (the statvfs test double covers the logic)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here ({done.stderr.strip()}); the test double covers it")
    try:
        yield mount_point
    finally:
        storage.wait_for_discards()
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_a_small_auto_save_on_a_16_mib_file_system(small_fs):
    state = {"w": torch.randn(1024)}  # 4 KB
    stats = lightning_nvcomp.save(state, small_fs / "ck.pt", codec="auto", policy=CodecPolicy())
    assert stats.raw_nbytes == 4096  # today: ENOSPC writing the 256 MiB probe
    assert torch.equal(lightning_nvcomp.load(small_fs / "ck.pt")["w"], state["w"])
    storage.wait_for_discards()
    assert os.listdir(small_fs) == ["ck.pt"]


def test_a_4_mb_checkpoint_io_save_on_a_16_mib_file_system(small_fs):
    from lightning_nvcomp import NvcompCheckpointIO

    io = NvcompCheckpointIO(codec="zstd")  # probe_mb: 256
    state = {"state_dict": {"w": torch.randn(MiB)}, "global_step": 1}  # 4 MiB
    try:
        io.save_checkpoint(state, small_fs / "last.ckpt")  # today: ENOSPC naming the probe file
        assert not io.writer.policy.bandwidth_assumed(str(small_fs))  # 16 MiB free: a 4 MiB probe fits
        assert torch.equal(io.load_checkpoint(small_fs / "last.ckpt")["state_dict"]["w"], state["state_dict"]["w"])
    finally:
        io.teardown()
    assert os.listdir(small_fs) == ["last.ckpt"]


def test_a_full_small_file_system_skips_the_probe_and_saves(small_fs, caplog):
    (small_fs / "filler").write_bytes(b"\x00" * (6 * MiB))  # 10 MiB free: a quarter is less than 4 MiB
    writer = CheckpointWriter(SaveOptions(codec="zstd"))
    state = {"w": torch.randn(MiB)}  # 4 MiB
    try:
        with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.auto.probe"):
            writer.save(state, small_fs / "a.ckpt")
            writer.commit(1, str(small_fs / "a.ckpt"))
        warnings = [r.getMessage() for r in caplog.records if r.name == "lightning_nvcomp.auto.probe"]
        assert len(warnings) == 1 and str(small_fs) in warnings[0] and "MiB" in warnings[0], warnings
        assert writer.baseline.measured  # the baseline's fixed costs are timed with a 4 KiB save: it fits
        writer.wait()  # durable: flushed behind the save, and then observed
        assert not writer.policy.bandwidth_assumed(str(small_fs))  # the real write replaced the assumption
        assert writer.policy.write_gbps(str(small_fs)) != FALLBACK_GBPS
        assert torch.equal(lightning_nvcomp.load(small_fs / "a.ckpt")["w"], state["w"])
    finally:
        writer.close()
    assert sorted(os.listdir(small_fs)) == ["a.ckpt", "filler"]


def _collective_worker(rank: int, world: int, directory: str, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        base = Path(directory)
        # 1. ranks with checkpoints of different sizes write the same probe: the smallest any rank needs
        counting = CountingStorage()
        measured = measure_bandwidth(str(base / "sizes"), 256 * MiB, counting, True, (4 + 2 * rank) * MiB)
        results[("sizes", rank)] = (measured, counting.written)
        # 2. one rank short of space: all skip
        real = os.statvfs
        if rank == 0:
            os.statvfs = lambda path: _Statvfs(MiB)
        try:
            counting = CountingStorage()
            policy = CodecPolicy(storage=counting, collective=True)
            results[("space", rank)] = (
                policy.write_gbps(str(base / "space")),
                counting.written,
                policy.bandwidth_assumed(str(base / "space")),
            )
        finally:
            os.statvfs = real
        # 3. one rank's probe write fails: all skip (and nobody hangs)
        counting = CountingStorage(fail=rank == 1)
        results[("fail", rank)] = (measure_bandwidth(str(base / "fail"), 4 * MiB, counting, True), counting.written)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_collective_probes_agree_to_probe_or_skip(tmp_path):
    for sub in ("sizes", "space", "fail"):
        (tmp_path / sub).mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_collective_worker, args=(2, str(tmp_path), port, results), nprocs=2, join=True)
    results = dict(results)
    (g0, w0), (g1, w1) = results[("sizes", 0)], results[("sizes", 1)]
    assert w0 == w1 == [4 * MiB] and g0 == g1 and g0 > 0
    assert results[("space", 0)] == (FALLBACK_GBPS, [], True)
    assert results[("space", 1)] == (FALLBACK_GBPS, [], True)  # rank 1 had room, but skips with rank 0
    assert results[("fail", 0)][0] is None and results[("fail", 1)][0] is None
    assert results[("fail", 0)][1] == [4 * MiB]  # rank 0 wrote its probe; rank 1 failed: both skip
    for sub in ("sizes", "space", "fail"):
        assert os.listdir(tmp_path / sub) == []
