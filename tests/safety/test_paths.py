"""Local paths as users write them, temporary files never wider than their checkpoint, and a full disk that leaves
nothing behind (issue 32, part A).

Real files, a real Trainer, the real command line, a real 16 MiB tmpfs (where root may mount one):

* a bare file name, a relative path, a ``pathlib`` path and the working directory itself save and load, through
  ``save``, the Lightning plugin with every durability, ``trainer.save_checkpoint`` and ``lightning-nvcomp convert``;
  work finished on the writer thread goes where the save was asked to go, even after a ``chdir``;
* every file a save creates in the checkpoint's directory (its temporary file, the storage probe, the savings
  baseline's copy of the checkpoint) is created no more readable than the checkpoint it becomes;
* a write that runs out of space removes its temporary file even when closing it fails too, says so naming the path
  and that the previous file is intact, and the next save there works.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import threading
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_nvcomp
from lightning_nvcomp import NvcompCheckpointIO
from lightning_nvcomp.cli import main
from lightning_nvcomp.options import SaveOptions
from lightning_nvcomp.saving.writer import CheckpointWriter
from lightning_nvcomp.storage import local as storage

from tests.helpers.lightning_models import TinyData, TinyModule, quiet_trainer
from tests.helpers.states import assert_tree_bit_exact
from tests.safety.test_storage_safety import small_fs  # noqa: F401  (the real 16 MiB tmpfs fixture)

PAGE = 4096


def state(seed: int = 0, n: int = 1000) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=gen), "global_step": seed}


def listing(directory: Path) -> list[str]:
    storage.wait_for_discards()  # a replaced file's second name is freed on a background thread
    return sorted(os.listdir(directory))


# -- 1. paths as users write them ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling", ["x.ckpt", Path("x.ckpt"), "./x.ckpt", "sub/x.ckpt", Path("sub") / "x.ckpt"], ids=str
)
def test_save_and_resave_a_bare_or_relative_name(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    lightning_nvcomp.save(state(1), spelling, codec="zstd")  # today: FileNotFoundError: '' for a bare name
    lightning_nvcomp.save(state(2), spelling, codec="zstd")  # a replacement
    assert_tree_bit_exact(torch.load(spelling, weights_only=True), state(2))
    where = tmp_path / os.path.dirname(spelling)
    assert listing(where) == (["sub", "x.ckpt"] if where == tmp_path else ["x.ckpt"])


@pytest.mark.parametrize("durable", ["background", "sync", "os", "async"])
def test_the_plugin_saves_a_bare_name_with_every_durability(tmp_path, monkeypatch, durable):
    monkeypatch.chdir(tmp_path)
    async_save = durable == "async"
    io = NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=async_save, durable="sync" if async_save else durable)
    io.save_checkpoint(state(1), "final.ckpt")  # today: FileNotFoundError: '' here (sync) ...
    io.save_checkpoint(state(2), "final.ckpt")
    io.teardown()  # ... or here (the flush or write behind training)
    assert_tree_bit_exact(io.load_checkpoint("final.ckpt"), state(2))
    assert listing(tmp_path) == ["final.ckpt"]


@pytest.mark.parametrize("durable", ["background", "sync"])
def test_trainer_saves_into_the_working_directory(tmp_path, monkeypatch, durable):
    monkeypatch.chdir(tmp_path)

    class SaveAtTheEnd(L.Callback):
        def on_train_end(self, trainer, pl_module):
            trainer.save_checkpoint("final.ckpt")

    io = NvcompCheckpointIO(codec="zstd", probe_mb=4, durable=durable)
    every_epoch = ModelCheckpoint(dirpath=".", filename="{epoch}", save_top_k=-1)  # the working directory itself
    trainer = quiet_trainer(".", plugins=[io], callbacks=[every_epoch, SaveAtTheEnd()])
    module = TinyModule()
    trainer.fit(module, datamodule=TinyData())  # today: FileNotFoundError: '' (sync: at once; else at teardown)
    final = torch.load("final.ckpt", weights_only=True)
    assert_tree_bit_exact(final["state_dict"], module.state_dict())
    assert torch.load("epoch=1.ckpt", weights_only=True)["global_step"] == final["global_step"]
    assert [n for n in listing(tmp_path) if n.endswith(".ckpt")] == ["epoch=0.ckpt", "epoch=1.ckpt", "final.ckpt"]
    assert not [n for n in listing(tmp_path) if n.startswith(".")]


@pytest.mark.parametrize("codec", ["zstd", "torch"])
def test_convert_between_bare_names(tmp_path, monkeypatch, capsys, codec):
    monkeypatch.chdir(tmp_path)
    lightning_nvcomp.save(state(3), "in.ckpt", codec="none")
    assert main(["convert", "in.ckpt", "out.ckpt", "--codec", codec]) == 0  # today: 1, "missing or damaged"
    assert "converted in.ckpt -> out.ckpt" in capsys.readouterr().out
    assert_tree_bit_exact(torch.load("out.ckpt", weights_only=True), state(3))
    assert listing(tmp_path) == ["in.ckpt", "out.ckpt"]


def hold_writer_thread_fsyncs(monkeypatch) -> threading.Event:
    """Make every ``os.fsync`` on the checkpoint writer thread wait until the returned event is set (a disk that is
    slow to make data durable); the real fsync runs then."""
    release, real = threading.Event(), os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread().name.startswith("lightning-nvcomp-write"):
            assert release.wait(60), "the test never released the writer thread"
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return release


@pytest.mark.parametrize("async_save", [False, True], ids=["background-flush", "async-write"])
def test_work_behind_training_goes_where_the_save_was_asked_after_a_chdir(tmp_path, monkeypatch, async_save):
    """Saves under relative names whose flush (``background`` durability) or write (async) runs on the writer thread
    after the program changed its working directory, and a deletion (pruning) queued behind them: all happen where
    the working directory was, not in the new one (which has a directory of the same name)."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "out").mkdir(parents=True)
    (elsewhere / "out").mkdir(parents=True)
    monkeypatch.chdir(run)
    writer = CheckpointWriter(SaveOptions(codec="zstd", probe_mb=1, async_save=async_save))
    writer.save(state(0), "out/first.ckpt")  # the probe and the baseline, before the writer thread is held
    writer.wait()
    release = hold_writer_thread_fsyncs(monkeypatch)
    try:
        writer.save(state(1), "out/held.ckpt")  # its flush (or write) waits on the writer thread ...
        writer.save(state(2), "out/x.ckpt")  # ... and this one's work is queued behind it
        writer.commit(2, "out/x.ckpt")
        writer.discard("out/first.ckpt")  # after the saves queued before it
        monkeypatch.chdir(elsewhere)
    finally:
        release.set()
    writer.close()
    assert listing(elsewhere / "out") == []  # today: held.ckpt (background) or both (async) land here
    assert listing(run / "out") == ["held.ckpt", "x.ckpt"]  # today: first.ckpt is kept, the others missing
    assert_tree_bit_exact(torch.load(run / "out" / "x.ckpt", weights_only=True), state(2))


# -- 2. temporary files never wider than the checkpoint they become ------------------------------------------------


class CreatedFiles:
    """Records the permission bits of every file ``os.open`` creates in ``directory`` at the moment it is created
    (the real ``os.open`` runs; its new file is looked at through its descriptor before anyone can change it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
        self.modes: dict[str, int] = {}
        real = os.open

        def spy(path, flags, mode=0o777, *args, **kwargs):
            fd = real(path, flags, mode, *args, **kwargs)
            if flags & os.O_CREAT and Path(os.fsdecode(path)).parent == directory:
                self.modes[os.path.basename(os.fsdecode(path))] = stat.S_IMODE(os.fstat(fd).st_mode)
            return fd

        monkeypatch.setattr(os, "open", spy)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("via", ["save", "plugin"])
def test_a_resaved_private_checkpoint_is_never_readable_by_others(tmp_path, monkeypatch, umask_022, via):
    path = tmp_path / "private.ckpt"
    lightning_nvcomp.save(state(1), path, codec="zstd")
    os.chmod(path, 0o600)
    created = CreatedFiles(monkeypatch, tmp_path)
    if via == "save":
        lightning_nvcomp.save(state(2), path, codec="zstd")
    else:  # a new plugin: its storage probe and savings baseline (a torch.save of the state) write here first
        io = NvcompCheckpointIO(codec="zstd", probe_mb=4)
        io.save_checkpoint(state(2), path)
        io.teardown()
        assert io.writer.baseline.measured
        assert any("probe" in name for name in created.modes) and any("baseline" in name for name in created.modes)
    wider = {name: oct(mode) for name, mode in created.modes.items() if mode & 0o077}
    assert created.modes and not wider  # today: the temporary file is created 0o644, chmodded later
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert_tree_bit_exact(torch.load(path, weights_only=True), state(2))
    assert listing(tmp_path) == ["private.ckpt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_resave_of_another_users_checkpoint_gets_its_owner_before_its_group_bits(tmp_path, monkeypatch, umask_022):
    path = tmp_path / "shared.ckpt"
    lightning_nvcomp.save(state(1), path, codec="zstd")
    os.chown(path, 65534, 65534)
    os.chmod(path, 0o640)
    created = CreatedFiles(monkeypatch, tmp_path)
    lightning_nvcomp.save(state(2), path, codec="zstd")
    (temporary,) = created.modes.values()
    assert temporary == 0o600  # owner-only while its group is still root's; today: 0o644
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)


def test_a_new_checkpoint_gets_the_umask_mode_from_its_creation_on(tmp_path, monkeypatch, umask_022):
    created = CreatedFiles(monkeypatch, tmp_path)
    lightning_nvcomp.save(state(1), tmp_path / "new.ckpt", codec="zstd")
    assert list(created.modes.values()) == [0o644]
    assert stat.S_IMODE(os.stat(tmp_path / "new.ckpt").st_mode) == 0o644


# -- 3. a full disk -------------------------------------------------------------------------------------------------


def _leave_one_page_too_few(directory: Path, nbytes: int) -> None:
    """Fill ``directory``'s file system (a tmpfs: space in pages) so that a file of ``nbytes`` misses its last page:
    the write runs out of space at the end, where the zip's small central-directory records are still in the file
    object's buffer (so closing the file after the failure fails too)."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    (directory / "filler").write_bytes(b"\0" * (free - (math.ceil(nbytes / PAGE) - 1) * PAGE))


def _file_nbytes(tmp_path: Path, obj: dict, codec: str) -> int:
    sized = tmp_path / "sized.ckpt"
    lightning_nvcomp.save(obj, sized, codec=codec)
    nbytes = sized.stat().st_size
    sized.unlink()
    return nbytes


@pytest.mark.parametrize("via", ["save", "plugin", "plugin-async"])
def test_a_full_disk_leaves_nothing_and_the_next_save_works(tmp_path, small_fs, via):  # noqa: F811
    path = small_fs / "last.ckpt"
    big = {"w": torch.randn(1 << 18, generator=torch.Generator().manual_seed(5)), "global_step": 2}  # 1 MiB
    io = NvcompCheckpointIO(codec="none", probe_mb=4, async_save=via == "plugin-async")

    def save(obj: dict) -> None:
        if via == "save":
            lightning_nvcomp.save(obj, path, codec="none")
        else:
            io.save_checkpoint(obj, path)
            io.wait()

    save(state(1))  # the previous checkpoint (and the plugin's probe and baseline, while there is space)
    before = path.read_bytes()
    _leave_one_page_too_few(small_fs, _file_nbytes(tmp_path, big, "none"))
    with pytest.raises((OSError, RuntimeError)) as raised:
        save(big)
    cause = raised.value if isinstance(raised.value, OSError) else raised.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, repr(raised.value)
    assert listing(small_fs) == ["filler", "last.ckpt"]  # today: the partial .last.ckpt.lnv-...tmp stays
    message = str(raised.value)
    assert str(path) in message and "previous file there is intact" in message  # today: no path, no word
    assert "temporary file was removed" in message and "Free space in" in message
    assert path.read_bytes() == before
    save(state(3))  # today: ENOSPC again, and at every later save (the leftover holds the space)
    io.teardown()
    assert_tree_bit_exact(torch.load(path, weights_only=True), state(3))
    assert listing(small_fs) == ["filler", "last.ckpt"]
