"""One save path (issue 33, item 2): a save finds the state's contents once; the single-file save, async saves,
background durability and the DCP data files drive the same steps, with sync/async and the durabilities as
strategies of them (:mod:`lightning_nvcomp.saving.single_file`).

Real files, real saves, real threads. Flushes are observed through ``os.fsync``, which still runs (a spy records
which file each flush was of, and on which thread); the walks of the state through a pickle are counted by an object
in the state whose reduction counts them."""

from __future__ import annotations

import ast
import os
import threading
import time
from pathlib import Path

import pytest
import torch

import lightning_nvcomp
from lightning_nvcomp.options import Codec, SaveOptions
from lightning_nvcomp.storage import Storage, storage_for

from tests.helpers.states import assert_tree_bit_exact, trained_like

PACKAGE = Path(lightning_nvcomp.__file__).parent


class Walked:
    """An object of the state that counts the pickles (a dry run, a deep copy, a file's own) walking through it, and
    makes each take ``delay_s``."""

    walks = 0
    delay_s = 0.0

    def __reduce__(self):
        type(self).walks += 1
        time.sleep(type(self).delay_s)
        return (Walked, ())


@pytest.fixture
def walked(monkeypatch):
    monkeypatch.setattr(Walked, "walks", 0)
    monkeypatch.setattr(Walked, "delay_s", 0.0)
    return Walked


class FsyncSpy:
    """Records every ``os.fsync``: the file's name (a temporary file's without its leading dot and suffix) and the
    thread it ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            real(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            if not os.path.isdir(path):
                self.calls.append((os.path.basename(path).lstrip("."), threading.current_thread().name))

        monkeypatch.setattr(os, "fsync", fsync)

    def of(self, name: str) -> list[str]:
        """The threads that flushed ``name`` (under its own name or a temporary one)."""
        return [thread for file, thread in self.calls if file.startswith(name)]


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="the spy names files through /proc")


def state(seed: int = 0) -> dict:
    return {"w": trained_like(1 << 16, torch.float32, seed), "b": torch.arange(7), "step": seed}


# -- the contents are found once --------------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_writer_save_walks_the_state_once_to_find_its_contents(tmp_path, monkeypatch, walked, async_save):
    """The first save of a run probes the storage, times the savings baseline's fixed costs (not on this state) and
    calibrates auto's codecs on the contents the save found: every save walks the state by the dry run and the
    file's own pickle (an async save's deep copy of the structure besides), and no more."""
    from lightning_nvcomp.saving.writer import CheckpointWriter

    monkeypatch.chdir(tmp_path)
    w = CheckpointWriter(SaveOptions(codec="auto", async_save=async_save, probe_mb=1))
    copies = 1 if async_save else 0
    counts = []
    for n, name in enumerate(["first.ckpt", "second.ckpt"]):
        before = walked.walks
        w.save({**state(n), "walked": Walked()}, name)
        w.commit(n, name)
        w.wait()
        counts.append(walked.walks - before)
    w.close()
    assert w.baseline.measured and w.policy.calibrated()
    assert counts == [2 + copies, 2 + copies]
    for n, name in enumerate(["first.ckpt", "second.ckpt"]):
        loaded = lightning_nvcomp.load(name, weights_only=False)
        assert isinstance(loaded.pop("walked"), Walked)
        assert_tree_bit_exact(loaded, state(n))


def test_a_sync_save_is_durable_counted_from_its_start(tmp_path, monkeypatch, walked):
    """A sync save's ``durable_s`` counts from the save's start, as an async or background one's: finding the
    contents and deciding the codec are part of it (each pickle of this state takes 0.3 s)."""
    from lightning_nvcomp.saving.writer import CheckpointWriter

    monkeypatch.chdir(tmp_path)
    w = CheckpointWriter(SaveOptions(codec="zstd", durable="sync", probe_mb=1))
    w.save(state(), "first.ckpt")  # the one-off probe and baseline
    w.commit(0, "first.ckpt")
    walked.delay_s = 0.3
    w.save({**state(1), "walked": Walked()}, "second.ckpt")
    w.commit(1, "second.ckpt")
    w.close()
    metrics = w.savings.history[-1]
    assert metrics["nvcomp/blocked_s"] >= 0.6  # the dry run and the file's pickle
    assert metrics["nvcomp/durable_s"] > metrics["nvcomp/blocked_s"] - 0.1


# -- the strategies: where the coded segments land, how the file is finished ------------------------------------


@needs_proc
def test_streamed_in_write_codes_while_writing_and_is_durable_when_written(tmp_path, monkeypatch):
    from lightning_nvcomp.format import find_contents
    from lightning_nvcomp.saving.single_file import IN_WRITE, Streamed, write_file

    monkeypatch.chdir(tmp_path)
    spy = FsyncSpy(monkeypatch)
    obj = state()
    coded = Streamed(obj, find_contents(obj), Codec.ZSTD, 64 << 10)
    assert coded.held_nbytes == 0  # nothing is coded before the file is written
    stats, written = write_file(coded, "ck.pt", Storage(), IN_WRITE)
    assert written.flush is None and spy.of("ck.pt") == [threading.current_thread().name]
    assert stats.file_nbytes == written.size == os.path.getsize("ck.pt") and stats.codec == "zstd"
    assert stats.write_s == pytest.approx(written.seconds - stats.encode_s)  # coding ran during the write
    assert_tree_bit_exact(lightning_nvcomp.load("ck.pt"), obj)


@needs_proc
def test_behind_puts_a_new_file_in_place_and_leaves_its_flush(tmp_path, monkeypatch):
    from lightning_nvcomp.format import find_contents
    from lightning_nvcomp.saving.single_file import BEHIND, Streamed, write_file

    monkeypatch.chdir(tmp_path)
    spy = FsyncSpy(monkeypatch)
    obj = state()
    _, written = write_file(Streamed(obj, find_contents(obj), Codec.NONE, None), "new.ckpt", Storage(), BEHIND)
    assert spy.of("new.ckpt") == [] and written.flush is not None  # in place, not yet flushed
    assert_tree_bit_exact(lightning_nvcomp.load("new.ckpt"), obj)
    done = threading.Thread(target=written.flush, name="behind")
    done.start()
    done.join()
    assert spy.of("new.ckpt") == ["behind"]


@needs_proc
def test_behind_flushes_a_file_that_replaces_another_before_its_rename(tmp_path, monkeypatch):
    from lightning_nvcomp.format import find_contents
    from lightning_nvcomp.saving.single_file import BEHIND, Streamed, write_file

    monkeypatch.chdir(tmp_path)
    lightning_nvcomp.save(state(0), "last.ckpt", codec="zstd")
    spy = FsyncSpy(monkeypatch)
    obj = state(1)
    _, written = write_file(Streamed(obj, find_contents(obj), Codec.ZSTD, None), "last.ckpt", Storage(), BEHIND)
    assert spy.of("last.ckpt") == [threading.current_thread().name]  # a power loss leaves the old or the new
    assert_tree_bit_exact(lightning_nvcomp.load("last.ckpt"), obj)
    assert written.flush is not None
    written.flush()  # the directory's entry


def test_behind_on_remote_storage_is_durable_when_the_upload_completes():
    from lightning_nvcomp.format import find_contents
    from lightning_nvcomp.saving.single_file import BEHIND, Streamed, write_file

    url = "memory://lnv-save-path/run/ck.pt"
    storage = storage_for(url)
    obj = state()
    stats, written = write_file(Streamed(obj, find_contents(obj), Codec.ZSTD, None), url, storage, BEHIND)
    assert written.flush is None and storage.size(url) == stats.file_nbytes
    assert_tree_bit_exact(lightning_nvcomp.load(url), obj)


def test_held_codes_now_and_writes_the_state_as_it_was(tmp_path, monkeypatch):
    from lightning_nvcomp.format import find_contents
    from lightning_nvcomp.saving.single_file import IN_WRITE, Held, write_file

    monkeypatch.chdir(tmp_path)
    obj = state()
    before = {"w": obj["w"].clone(), "b": obj["b"].clone(), "step": 0}
    coded = Held(obj, find_contents(obj), Codec.ZSTD, 64 << 10)
    assert 0 < coded.held_nbytes < obj["w"].numel() * 4 + 64  # the compressed segments, in host memory
    obj["w"].add_(1.0)  # training goes on before the write
    obj["step"] = 1
    stats, written = write_file(coded, "ck.pt", Storage(), IN_WRITE)
    assert stats.write_s == written.seconds  # the coding was done before
    assert_tree_bit_exact(lightning_nvcomp.load("ck.pt"), before)


@needs_proc
@pytest.mark.parametrize(
    ("async_save", "durable", "flushed_by"),
    [
        (False, "sync", "save"),
        (False, "background", "writer"),
        (True, "sync", "writer"),
        (True, "background", "writer"),
        (False, "os", None),
    ],
)
def test_each_strategy_of_the_writer_flushes_where_it_says(tmp_path, monkeypatch, async_save, durable, flushed_by):
    """Sync saves write in the save, async ones on the writer thread; ``background`` durability leaves a sync
    save's flush to the writer thread, an async save's write finishes it there at once; ``os`` never flushes."""
    from lightning_nvcomp.saving.single_file import BEHIND, IN_WRITE, finish_for
    from lightning_nvcomp.saving.writer import CheckpointWriter

    monkeypatch.chdir(tmp_path)
    w = CheckpointWriter(SaveOptions(codec="zstd", async_save=async_save, durable=durable, probe_mb=1))
    w.save(state(), "probe.ckpt")  # the one-off probe and baseline, before the spy
    w.commit(0, "probe.ckpt")
    w.wait()
    assert finish_for(w.options.durable, writes_behind=async_save) is (
        BEHIND if (durable, async_save) == ("background", False) else IN_WRITE
    )
    spy = FsyncSpy(monkeypatch)
    w.save(state(1), "ck.pt")
    w.commit(1, "ck.pt")
    on_return = spy.of("ck.pt")
    w.close()
    threads = spy.of("ck.pt")
    if flushed_by is None:
        assert threads == []
    elif flushed_by == "save":
        assert on_return == threads == [threading.main_thread().name]
    else:
        assert threads == ["lightning-nvcomp-write_0"]
    assert_tree_bit_exact(lightning_nvcomp.load("ck.pt"), state(1))


# -- the codec choice is auto's ---------------------------------------------------------------------------------


def test_the_codec_is_resolved_by_auto_and_the_save_learns_into_its_policy(tmp_path, monkeypatch):
    from lightning_nvcomp.auto.policy import default_policy, resolve_codec

    monkeypatch.chdir(tmp_path)
    assert resolve_codec(Codec.ZSTD, [], ".") == (Codec.ZSTD, None)
    stats = lightning_nvcomp.save(state(), "ck.pt")  # auto, through the process's default policy
    decision = default_policy().last_decision
    assert decision is not None and decision[0].codec == stats.codec == stats.prediction.codec
    assert default_policy().knows_bandwidth(str(tmp_path))


# -- the writer loop: one disk thread, in order -----------------------------------------------------------------


def test_the_disk_thread_writes_in_order_while_the_caller_goes_on_and_raises_the_first_failure():
    from lightning_nvcomp.format.sink import DiskThread

    done: list[int] = []

    def write(n: int) -> int:
        time.sleep(0.01 * (5 - n))  # the first is the slowest
        done.append(n)
        return n

    with DiskThread() as disk:
        futures = [disk.put(write, n) for n in range(5)]
        assert not futures[-1].done()  # queued: the caller is not held
    assert done == list(range(5)) and [f.result() for f in futures] == done

    def fail(n: int) -> None:
        raise OSError(28, f"No space left on device ({n})")

    with pytest.raises(OSError, match=r"\(1\)"):
        with DiskThread() as disk:
            disk.put(done.append, 5)
            disk.put(fail, 1)
            disk.put(fail, 2)
    with pytest.raises(KeyError):  # an error on its way out is not replaced by a write's
        with DiskThread() as disk:
            disk.put(fail, 3)
            raise KeyError("the coder failed")


# -- the shape of the save path ---------------------------------------------------------------------------------

#: The modules of the save path (the owned parts of issue 33, item 2), and their longest allowed function and length.
SAVE_PATH = [
    "saving/single_file.py",
    "saving/writer.py",
    "format/writer.py",
    "format/sink.py",
    "format/contents.py",
    "format/item_batches.py",
    "format/items.py",
    "integrations/dcp/data_files.py",
    "telemetry/baseline.py",
]


@pytest.mark.parametrize("module", SAVE_PATH)
def test_the_save_path_is_made_of_short_functions_in_modules_of_at_most_400_lines(module):
    source = (PACKAGE / module).read_text()
    assert len(source.splitlines()) <= 400
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []
