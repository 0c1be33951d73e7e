"""torch.distributed.checkpoint integration (lightning_nvcomp.dcp) on the CPU: real processes (spawn), gloo, real
files. DTensor (Shard(0) and Replicate on a "cpu" device mesh), ShardedTensor, plain tensors and non-tensor values;
every comparison is of bits. The multi-rank scenarios live in tests/helpers/dcp_workers.py; one job per world size runs
them all (each process start costs seconds) and each test below asserts on its scenarios.
"""

from __future__ import annotations

import gc
import inspect
import io
import os
import pickle
import struct
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter, NvcompStorageInfo

from tests.helpers import dcp_workers as W
from tests.helpers.collector import collections_within
from tests.helpers.processes import python_child
from tests.helpers.states import assert_bit_exact, assert_state_equal, trained_like, zeros_like_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


def _ok(results: list[dict], *names: str) -> None:
    """Every rank ran each scenario in ``names`` to the end ("ok"), else show its traceback (or the job's)."""
    for rank, res in enumerate(results):
        for name in names:
            assert res.get(name) == "ok", (
                f"rank {rank}, scenario {name}: {res.get(name) or res.get('<job>', 'did not run')}"
            )


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("dcp2")
    return W.spawn("two", 2, root, str(root))


def _state(seed: int = 0) -> dict:
    return {
        "w": trained_like(64 * 1024, torch.bfloat16, seed).reshape(256, 256),
        "m": trained_like(32 * 1024, torch.float32, seed + 1).reshape(128, 256),
        "v": trained_like(32 * 1024, torch.float32, seed + 2).abs().square(),
        "idx": torch.arange(100),
        "step": 12,
    }


def _assert_loads_back(path: Path, expected: dict) -> None:
    """Our reader loads the checkpoint at ``path`` into a zeroed copy of ``expected``, bit for bit."""
    loaded = zeros_like_state(expected)
    dcp.load(loaded, storage_reader=NvcompFileSystemReader(path))
    assert_state_equal(loaded, expected)


# -- multi-process ----------------------------------------------------------------------------------------------


def test_one_rank_roundtrip(tmp_path):
    """World size 1 (gloo): sync save with zstd and none, default and our reader, async_save (both staging modes)."""
    _ok(
        W.spawn("roundtrip", 1, tmp_path, str(tmp_path)), "zstd", "plain_reader", "none", "async_gpu", "async_stage_all"
    )


def test_two_ranks_roundtrip(two_ranks):
    """2 ranks save and load sharded state bit-exactly; the files are DCP's layout; metadata records the codec."""
    _ok(two_ranks, "zstd", "plain_reader")


def test_two_ranks_codec_none(two_ranks):
    _ok(two_ranks, "none")


def test_two_ranks_async_save(two_ranks):
    """dcp.async_save then wait: the checkpoint holds the state as it was at the call (the state is changed
    meanwhile), with DCP's staging and with shards compressed while staging."""
    _ok(two_ranks, "async_gpu", "async_stage_all")


def test_auto_codec_decided_on_rank0_and_broadcast(two_ranks):
    """codec='auto': the ranks probe the storage together; rank 0's choice (zstd) wins over rank 1's (none)."""
    _ok(two_ranks, "auto")


def test_failed_save_keeps_previous_checkpoint(two_ranks):
    """Rank 1 raises after writing part of its shards: the save fails on every rank, the previous checkpoint (same
    directory, overwritten in place, or another one) still loads bit-exactly, and the failed directory does not load."""
    _ok(two_ranks, "same_dir", "new_dir")


@pytest.mark.slow
def test_four_ranks_then_reshard_to_two(tmp_path):
    """4 ranks save and load back; then 2 ranks load the same checkpoint (DTensor Shard(0) resharded 4 -> 2)."""
    ckpt = str(tmp_path / "ckpt")
    (tmp_path / "four").mkdir()
    _ok(W.spawn("save", 4, tmp_path / "four", ckpt), "save")
    names = sorted(os.listdir(ckpt))
    assert [n.split(".")[0] for n in names] == ["", "__0_0", "__1_0", "__2_0", "__3_0"], names  # <name>.<id>.distcp
    (tmp_path / "two").mkdir()
    _ok(W.spawn("reshard_load", 2, tmp_path / "two", ckpt), "reshard")


@pytest.mark.slow
def test_deltas_per_rank_and_a_keyframe_when_the_world_size_changes(tmp_path):
    """Ranks save deltas against their own previous save; the same writers saving with another world size store a
    keyframe; every checkpoint loads bit-exactly on three gloo ranks (see ``job_delta``)."""
    (tmp_path / "out").mkdir()
    _ok(W.spawn("delta", 3, tmp_path / "out", str(tmp_path / "run")), "pair_saves", "world_saves", "loads")


# -- one process (no process group) -----------------------------------------------------------------------------


def test_smaller_than_plain_filesystem_writer(tmp_path):
    """On trained-like data (randn * 0.02, bf16 and fp32) the .distcp file is smaller than FileSystemWriter's; the
    stats report it; both readers load it bit-exactly."""
    state = _state()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "plain"))
    writer = NvcompFileSystemWriter(tmp_path / "ours", codec="zstd")
    dcp.save(state, storage_writer=writer)
    plain = (tmp_path / "plain" / "__0_0.distcp").stat().st_size
    (ours_file,) = (tmp_path / "ours").glob("__0_0.*.distcp")  # its name carries the checkpoint id
    ours = ours_file.stat().st_size
    assert ours < 0.9 * plain, (ours, plain)
    stats = writer.stats
    assert stats.codec == "zstd" and stats.items == 4
    assert stats.raw_nbytes == sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    assert stats.file_nbytes < ours and stats.ratio > 1.1 and stats.path == str(tmp_path / "ours")
    assert stats.write_s > 0 and stats.stage_s == 0
    gathered = writer.gather_stats()
    assert gathered.ranks == (stats,) and gathered.metrics()["nvcomp/dcp_ratio"] == stats.ratio
    assert writer.totals == {"raw_nbytes": stats.raw_nbytes, "stored_nbytes": stats.file_nbytes, "items": 4}
    for reader in (NvcompFileSystemReader, dcp.FileSystemReader):
        loaded = zeros_like_state(state)
        dcp.load(loaded, storage_reader=reader(tmp_path / "ours"))
        assert_state_equal(loaded, state)


def test_codec_none_roundtrip_one_process(tmp_path):
    state = _state(5)
    writer = NvcompFileSystemWriter(tmp_path, codec="none")
    dcp.save(state, storage_writer=writer)
    assert writer.stats.codec == "none" and writer.stats.ratio < 1.0  # the zip headers, nothing compressed
    with open(tmp_path / ".metadata", "rb") as f:
        infos = [i for i in pickle.load(f).storage_data.values() if isinstance(i, NvcompStorageInfo) and i.codec]
    assert len(infos) == 4 and {i.codec for i in infos} == {"none"}
    _assert_loads_back(tmp_path, state)


def test_tiny_items_are_written_after_the_others_and_read_by_every_reader(tmp_path):
    """Tiny items' archives are built off the disk thread while it writes the larger items, and written after them:
    the tiny items lie at the end of the data file, and both readers load every item back bit-exactly."""
    state = _state(6)
    state.update({f"small.v{i}": trained_like(64, torch.float32, 100 + i) for i in range(40)})
    state.update({f"scalar.s{i}": torch.tensor(float(i)) for i in range(5)})
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    with open(tmp_path / ".metadata", "rb") as f:
        infos = {
            k.fqn: i for k, i in pickle.load(f).storage_data.items() if isinstance(i, NvcompStorageInfo) and i.codec
        }
    tiny = [i.offset for i in infos.values() if i.raw_nbytes < 4096]
    larger = [i.offset + i.length for i in infos.values() if i.raw_nbytes >= 4096]
    assert len(tiny) == 46 and len(larger) == 3 and min(tiny) >= max(larger)
    _assert_loads_back(tmp_path, state)
    loaded = zeros_like_state(state)
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(tmp_path))
    assert_state_equal(loaded, state)


def test_a_tensor_larger_than_a_segment_is_written_as_it_is_coded_and_read_by_every_reader(tmp_path):
    """``write_data`` streams a CPU tensor larger than a segment (each segment written as it is coded, beside the
    other items' coding): it is stored in several segments, and both readers load every item back bit-exactly."""
    state = _state(8)
    state["big"] = trained_like(5_000_000, torch.float32, 9)  # 20 MB: two CPU segments
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    with open(tmp_path / ".metadata", "rb") as f:
        info = next(i for k, i in pickle.load(f).storage_data.items() if k.fqn == "big")
    with open(tmp_path / info.relative_path, "rb") as f:
        f.seek(info.offset)
        names = zipfile.ZipFile(io.BytesIO(f.read(info.length))).namelist()
    assert sorted(n for n in names if "/data/" in n) == ["archive/data/0", "archive/data/1"]
    _assert_loads_back(tmp_path, state)
    loaded = zeros_like_state(state)
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(tmp_path))
    assert_state_equal(loaded, state)


class _RecordsCollector(dcp.DefaultSavePlanner):
    """DCP's planner, noting whether the garbage collector was on each time the writer resolved an item; with
    ``fail``, raising at the second item (a save failing part way through its write)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.collector_on: list[bool] = []
        self.fail = fail

    def resolve_data(self, write_item):
        self.collector_on.append(gc.isenabled())
        if self.fail and len(self.collector_on) == 2:
            raise OSError("the planner gave up")
        return super().resolve_data(write_item)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_save_pauses_the_collector_while_writing_and_restores_it(tmp_path, enabled_before):
    """A save on the main thread writes its items with the collector off and leaves it as it found it, also when the
    save fails part way; a save's write on another thread (behind training) leaves the collector alone."""
    state = _state(6)
    (gc.enable if enabled_before else gc.disable)()
    try:
        planner = _RecordsCollector()
        dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path / "main", codec="zstd"), planner=planner)
        assert planner.collector_on and not any(planner.collector_on)
        assert gc.isenabled() is enabled_before
        failing = _RecordsCollector(fail=True)
        with pytest.raises(CheckpointException):
            dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path / "failed", codec="zstd"), planner=failing)
        assert failing.collector_on == [False, False] and gc.isenabled() is enabled_before
        planner = _RecordsCollector()
        saver = threading.Thread(
            target=dcp.save,
            args=(state,),
            kwargs={"storage_writer": NvcompFileSystemWriter(tmp_path / "thread", codec="zstd"), "planner": planner},
        )
        saver.start()
        saver.join()
        assert planner.collector_on == [enabled_before] * len(planner.collector_on) and planner.collector_on
    finally:
        gc.enable()
    _assert_loads_back(tmp_path / "main", state)


class _LoadRecordsCollector(dcp.DefaultLoadPlanner):
    """DCP's load planner, noting whether the garbage collector was on each time the reader asked for a target."""

    def __init__(self) -> None:
        super().__init__()
        self.collector_on: list[bool] = []

    def resolve_tensor(self, read_item):
        self.collector_on.append(gc.isenabled())
        return super().resolve_tensor(read_item)


def _inside_our_code(frame) -> bool:
    """A frame of lightning_nvcomp below the writer's own ``stage`` (coding, copying, listing the shards: not the
    pause's entry and exit)."""
    path = Path(frame.f_code.co_filename)
    package = Path(NvcompFileSystemWriter.__module__.replace(".", "/")).parts[0]
    return package in path.parts and path.name not in {"writer.py", "_process.py", "contextlib.py"}


def test_async_staging_pauses_the_collector_and_restores_it(tmp_path):
    """dcp.async_save's staging (what training waits for) runs no garbage collection while it codes, even with the
    collector set to run at every allocation, and leaves it on; the checkpoint is the state at the call."""
    state = _state(10)
    expected = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    writer = NvcompFileSystemWriter(tmp_path, codec="zstd", stage_compress="all")
    future, inside = collections_within(_inside_our_code, lambda: dcp.async_save(state, storage_writer=writer))
    assert inside == [] and gc.isenabled()  # the write behind, on a thread of DCP's, may collect
    future.result()
    _assert_loads_back(tmp_path, expected)


def test_metadata_is_written_with_the_collector_paused(tmp_path):
    """The metadata of a save (one entry per item) is built and pickled with no garbage collection: with
    thousands of items, collections there cost a fifth of a save (round9 of benchmarks/results/ in git history); the collector is on
    after it."""
    state = _state(12)
    ours = inspect.getsourcefile(NvcompFileSystemWriter)
    _, collections = collections_within(
        lambda frame: frame.f_code.co_name == "finish" and frame.f_code.co_filename == ours,
        lambda: dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd")),
    )
    assert collections == [] and gc.isenabled()
    _assert_loads_back(tmp_path, state)


def test_load_pauses_the_collector_while_reading_and_restores_it(tmp_path):
    state = _state(7)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    loaded, planner = zeros_like_state(state), _LoadRecordsCollector()
    dcp.load(loaded, storage_reader=NvcompFileSystemReader(tmp_path), planner=planner)
    assert planner.collector_on and not any(planner.collector_on) and gc.isenabled()
    assert_state_equal(loaded, state)


def _in_dcp_planning(frame) -> bool:
    """A frame of DCP's planning: a planner's local or global plan (its deduplication and validation inside)."""
    return (
        frame.f_code.co_name in ("create_local_plan", "create_global_plan") and "checkpoint" in frame.f_code.co_filename
    )


def test_a_save_and_a_load_are_planned_with_the_collector_paused(tmp_path):
    """DCP plans a save (and a load) of thousands of items between our writer's set-up and its ``write_data`` (the
    reader's set-up and ``read_data``); collections there doubled DCP's own cost of a save and cost a load of the
    many-items state 0.6 s (round10 of benchmarks/results/ in git history). None starts there now, and the collector is on after."""
    state = {f"layer{i}.bias": trained_like(64, torch.float32, i) for i in range(50)}
    writer = NvcompFileSystemWriter(tmp_path, codec="zstd")
    _, collections = collections_within(_in_dcp_planning, lambda: dcp.save(state, storage_writer=writer))
    assert collections == [] and gc.isenabled()
    loaded = zeros_like_state(state)
    _, collections = collections_within(
        _in_dcp_planning, lambda: dcp.load(loaded, storage_reader=NvcompFileSystemReader(tmp_path))
    )
    assert collections == [] and gc.isenabled()
    assert_state_equal(loaded, state)


class _FailingPlanner(dcp.DefaultSavePlanner):
    def create_local_plan(self):
        raise RuntimeError("this plan fails")


def _fail_a_save(writer: NvcompFileSystemWriter, state: dict) -> None:
    try:
        dcp.save(state, storage_writer=writer, planner=_FailingPlanner())
    except CheckpointException as err:
        assert "this plan fails" in str(err)
    else:
        pytest.fail("the failing plan did not fail the save")


def test_a_failed_plan_pauses_the_collector_no_longer_than_its_writer_lives(tmp_path):
    """A plan that fails never reaches ``write_data``, which ends the pause: the writer's next save ends it, else
    the writer's end (its error holds it in a reference cycle: an explicit collection frees it), else its
    deadline."""
    state = _state(9)
    writer = NvcompFileSystemWriter(tmp_path, codec="zstd")
    _fail_a_save(writer, state)
    assert not gc.isenabled()
    dcp.save(state, storage_writer=writer)
    assert gc.isenabled()
    _assert_loads_back(tmp_path, state)
    _fail_a_save(writer, state)
    assert not gc.isenabled()
    del writer
    gc.collect()
    assert gc.isenabled()

    writer = NvcompFileSystemWriter(tmp_path, codec="zstd")
    writer._planning.longest_s = 0.2
    _fail_a_save(writer, state)
    deadline = time.monotonic() + 10
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gc.isenabled(), "the pause outlived its deadline"


def test_views_the_coder_does_not_store_whole_sit_among_coded_items(tmp_path):
    """A conjugate or negative view is stored through torch.save's pickling, in the same data file as the items
    coded in batches (each item's offset counted as the file is written): both readers read every item back."""
    state = {
        "w": trained_like(4096, torch.float32, 1),
        "conj": torch.complex(trained_like(40, torch.float32, 2), trained_like(40, torch.float32, 3)).conj(),
        "neg": trained_like(30, torch.float32, 4)._neg_view(),
        "ids": torch.arange(5),
    }
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    expected = {k: v.resolve_conj().resolve_neg() for k, v in state.items()}
    _assert_loads_back(tmp_path, expected)
    loaded = zeros_like_state(expected)
    dcp.load(loaded, checkpoint_id=tmp_path)
    assert_state_equal(loaded, expected)


def test_default_reader_decodes_in_a_fresh_interpreter(tmp_path):
    """DCP's default reader (``dcp.load(state, checkpoint_id=path)``, as Lightning's sharded loads call it), in a
    process that never imports lightning_nvcomp itself: reading .metadata imports it (NvcompStorageInfo), which
    registers the decoder for torch.load(weights_only=True). Bit-exact."""
    state = _state(3)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    torch.save(state, tmp_path.parent / "expected.pt")
    proc = python_child(
        """
        import sys, warnings, torch
        warnings.filterwarnings("ignore")
        import torch.distributed.checkpoint as dcp
        expected = torch.load(sys.argv[2])
        loaded = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in expected.items()}
        assert "lightning_nvcomp" not in sys.modules
        dcp.load(loaded, checkpoint_id=sys.argv[1])  # what Lightning's FSDP/ModelParallel sharded load calls
        for k, v in expected.items():
            assert (torch.equal(loaded[k].view(torch.uint8), v.view(torch.uint8)) if isinstance(v, torch.Tensor)
                    else loaded[k] == v), k
        print("ok", "lightning_nvcomp" in sys.modules)
        """,
        str(tmp_path),
        str(tmp_path.parent / "expected.pt"),
        check=True,
    )
    assert proc.stdout.split() == ["ok", "True"], proc.stdout


def test_default_reader_without_the_package_fails_clearly(tmp_path):
    """Where lightning_nvcomp cannot be imported, DCP's default reader fails naming it: never garbage tensors."""
    state = _state(4)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    proc = python_child(
        """
        import sys, warnings, torch
        warnings.filterwarnings("ignore")

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "lightning_nvcomp":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, Block())
        import torch.distributed.checkpoint as dcp
        loaded = {"w": torch.zeros(256, 256, dtype=torch.bfloat16), "step": 0}
        try:
            dcp.load(loaded, storage_reader=dcp.FileSystemReader(sys.argv[1]))
        except BaseException as err:  # DCP wraps failures in CheckpointException (a BaseException)
            print("error", "lightning_nvcomp" in str(err))
        else:
            print("loaded")
        """,
        str(tmp_path),
        check=True,
    )
    assert proc.stdout.split() == ["error", "True"], proc.stdout + proc.stderr


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_damaged_item_is_detected(tmp_path):
    """A flipped byte in a stored shard fails the load with a CRC error naming the file and item, in our reader and
    in DCP's default reader: never a garbage tensor."""
    state = _state(6)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    with open(tmp_path / ".metadata", "rb") as f:
        meta = pickle.load(f)
    info = next(i for k, i in meta.storage_data.items() if k.fqn == "w")
    _flip(tmp_path / info.relative_path, info.offset + info.length // 2)  # inside the compressed blob
    with pytest.raises(BaseException, match="checksum mismatch") as caught:
        dcp.load(zeros_like_state(state), storage_reader=NvcompFileSystemReader(tmp_path))
    assert f"{info.relative_path}: item 'w'" in str(caught.value)
    with pytest.raises(BaseException, match="checksum mismatch"):
        dcp.load(zeros_like_state(state), storage_reader=dcp.FileSystemReader(tmp_path))


def test_damaged_pickle_is_detected(tmp_path):
    state = _state(7)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    with open(tmp_path / ".metadata", "rb") as f:
        meta = pickle.load(f)
    info = next(i for k, i in meta.storage_data.items() if k.fqn == "idx")
    raw = (tmp_path / info.relative_path).read_bytes()[info.offset : info.offset + info.length]
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        entry = next(i for i in z.infolist() if i.filename.endswith("/data.pkl"))
    header = entry.header_offset
    name_len, extra_len = struct.unpack("<HH", raw[header + 26 : header + 30])
    start = header + 30 + name_len + extra_len  # the pickle's bytes (shapes, strides, record dicts)
    _flip(tmp_path / info.relative_path, info.offset + start + entry.file_size // 2)
    with pytest.raises(BaseException, match="damaged") as caught:
        dcp.load(zeros_like_state(state), storage_reader=NvcompFileSystemReader(tmp_path))
    assert "item 'idx'" in str(caught.value)


@pytest.mark.skipif(gpu_available(), reason="checks the CPU-only error")
def test_ans_needs_a_gpu(tmp_path):
    with pytest.raises(BaseException, match="gANS.* needs a CUDA GPU"):
        dcp.save(_state(), storage_writer=NvcompFileSystemWriter(tmp_path, codec="ans"))


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="codec must be one of"):
        NvcompFileSystemWriter(tmp_path, codec="lz4")
    with pytest.raises(ValueError, match="stage_compress"):
        NvcompFileSystemWriter(tmp_path, stage_compress="cpu")
    try:
        from torch.distributed.checkpoint._extension import ZStandard  # DCP's stream extensions: torch 2.7+
    except ImportError:  # torch 2.4-2.6: none to pass, but the argument is refused all the same
        extension: object = object()
    else:
        extension = ZStandard()
    with pytest.raises(ValueError, match="extensions"):
        NvcompFileSystemWriter(tmp_path, _extensions=[extension])


def test_writer_takes_the_runs_save_options(tmp_path):
    """The options object the plugin, the hook and the strategies share configures the DCP writer too."""
    from lightning_nvcomp.options import SaveOptions

    state = _state()
    writer = NvcompFileSystemWriter(tmp_path, options=SaveOptions(codec="none", staging_mb=1))
    assert (writer.codec, writer.staging_nbytes) == ("none", 1 << 20)
    dcp.save(state, storage_writer=writer)
    assert writer.stats.codec == "none"
    loaded = zeros_like_state(state)
    dcp.load(loaded, checkpoint_id=tmp_path)
    assert_state_equal(loaded, state)
    # a keyword given beside options= overrides its field (tests/unit/test_options.py has the rest)
    assert NvcompFileSystemWriter(tmp_path, codec="zstd", options=SaveOptions(codec="none")).codec == "zstd"


@pytest.mark.parametrize("window", [1, 4096, 1 << 20])
def test_reader_windows_reuse_their_buffers_bit_exactly(tmp_path, monkeypatch, window):
    """Data files are read in windows into two reused buffers (one item alone where it is larger): whatever the
    window, every item loads bit-exactly."""
    from lightning_nvcomp.integrations.dcp import read_windows

    monkeypatch.setattr(read_windows, "WINDOW_NBYTES", window)
    state = {f"t{i}": trained_like(500 * (i + 1), torch.float32, i) for i in range(12)} | _state()
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    for _ in range(2):
        loaded = zeros_like_state(state)
        dcp.load(loaded, storage_reader=NvcompFileSystemReader(tmp_path))
        assert_state_equal(loaded, state)


def test_the_planner_is_told_of_each_cpu_target_once_it_is_filled(tmp_path, monkeypatch):
    """CPU targets are filled on a thread while the next window decodes: the planner's ``commit_tensor`` comes for
    every item, once, after its target holds the stored bytes (a planner that post-processes targets sees them
    whole), the windows many and small so that fills run behind."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from lightning_nvcomp.integrations.dcp import read_windows

    monkeypatch.setattr(read_windows, "WINDOW_NBYTES", 4096)
    state = {f"t{i}": trained_like(3000 + 500 * i, torch.float32, i) for i in range(16)} | _state(3)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    committed: list[str] = []

    class Checking(DefaultLoadPlanner):
        def commit_tensor(self, read_item, tensor):
            name = read_item.dest_index.fqn
            assert_bit_exact(tensor, state[name])
            committed.append(name)
            super().commit_tensor(read_item, tensor)

    loaded = zeros_like_state(state)
    dcp.load(loaded, storage_reader=NvcompFileSystemReader(tmp_path), planner=Checking())
    assert sorted(committed) == sorted(k for k, v in state.items() if isinstance(v, torch.Tensor))
    assert_state_equal(loaded, state)


def test_unknown_codec_in_metadata_is_refused(tmp_path):
    state = _state(8)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    with open(tmp_path / ".metadata", "rb") as f:
        meta = pickle.load(f)
    for info in meta.storage_data.values():
        if isinstance(info, NvcompStorageInfo):
            info.codec = "lz77"
    with open(tmp_path / ".metadata", "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(BaseException, match="unknown codec 'lz77'"):
        dcp.load(zeros_like_state(state), storage_reader=NvcompFileSystemReader(tmp_path))


def test_compat_fallbacks_give_what_torchs_private_names_give(tmp_path, monkeypatch):
    """Where torch lacks one of the private names the storage uses (here: every gate closed, as on a torch older
    than all of them), _compat's fallbacks give the same results, and a save and a load still round-trip."""
    from lightning_nvcomp._compat import dcp as _compat

    assert _compat._release("2.13.0+cpu") == (2, 13) and _compat._release("2.5.0a0+git12ab") == (2, 5)
    state = _state(9)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path / "now", codec="zstd", thread_count=3))
    t = torch.arange(60).reshape(3, 4, 5)
    narrowed = _compat.narrow_tensor_by_index(t, [1, 0, 2], [2, 4, 3])
    where = _compat.metadata_path(NvcompFileSystemReader(tmp_path / "now"), None)
    monkeypatch.setattr(_compat, "TORCH", (1, 13))
    assert torch.equal(_compat.narrow_tensor_by_index(t, [1, 0, 2], [2, 4, 3]), narrowed)
    assert _compat.metadata_path(NvcompFileSystemReader(tmp_path / "now"), None) == where
    assert _compat.torch_zip_reader() is None
    assert _compat.transform_descriptors(NvcompStorageInfo("f", 0, 1, ["zstd"])) == ()
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path / "old", codec="zstd", thread_count=3))
    assert len(list((tmp_path / "old").glob("*.distcp"))) == 3  # the round-robin split, still thread_count files
    for path in ("now", "old"):
        loaded = zeros_like_state(state)
        dcp.load(loaded, storage_reader=NvcompFileSystemReader(tmp_path / path))
        assert_state_equal(loaded, state)


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_async_save_one_process_compresses_while_staging(tmp_path, codec):
    """stage_compress='all' compresses (or, with "none", copies) at staging (stage_s > 0); training may change the
    state right after."""
    state = _state(9)
    expected = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    writer = NvcompFileSystemWriter(tmp_path, codec=codec, stage_compress="all")
    future = dcp.async_save(state, storage_writer=writer)
    for value in state.values():
        if isinstance(value, torch.Tensor):
            value.zero_()
    future.result()
    assert writer.stats.stage_s > 0 and writer.stats.items == 4 and (codec == "none" or writer.stats.ratio > 1.1)
    _assert_loads_back(tmp_path, expected)


# -- GPU --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
def test_a_gpu_checkpoint_loads_into_cpu_tensors(tmp_path):
    """GPU state saved with gANS, loaded by our reader into CPU tensors (as for a conversion or an evaluation on
    the CPU): decoded on the GPU and copied from there into each target (through one pinned buffer per window),
    bit-exact for every dtype, tiny raw, 0-d and empty items included; a target that is a view of a larger tensor
    gets only its own bytes."""
    state = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in _state(20).items()}
    state["bias"] = trained_like(16, torch.float32, 21).cuda()  # stored raw: too small to code
    state["half"] = trained_like(8192, torch.bfloat16, 22).cuda()
    state["steps"] = torch.arange(8192, dtype=torch.int64).cuda() * 3
    state["mask"] = (trained_like(8191, torch.float32, 23) > 0).cuda()
    state["phase"] = torch.complex(trained_like(4096, torch.float32, 24), trained_like(4096, torch.float32, 25)).cuda()
    state["scale"] = torch.tensor(-0.0).cuda()
    state["none"] = torch.empty(0, 3, dtype=torch.float16).cuda()
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="ans"))
    backing = torch.zeros(2, 8192, dtype=torch.bfloat16)
    loaded = {k: torch.zeros_like(v, device="cpu") if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}
    loaded["half"] = backing[1]
    dcp.load(loaded, storage_reader=NvcompFileSystemReader(tmp_path))
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].device.type == "cpu"
            assert_bit_exact(loaded[key], value.cpu())
        else:
            assert loaded[key] == value
    assert not backing[0].any()


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
@pytest.mark.parametrize("codec", ["ans", "zstd", "auto", "none"])
def test_gpu_save_load(tmp_path, codec):
    """One rank, CUDA shards next to a CPU tensor: dcp.save / dcp.async_save compress on the GPU; dcp.load decodes
    on the GPU (our reader) or the CPU (DCP's); all bit-exact. ``auto`` calibrates on the GPU shards."""
    state = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in _state(10).items()}
    state["cpu"] = trained_like(4096, torch.float32, 11)
    expected = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}

    def check(path: Path, reader) -> None:
        loaded = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in expected.items()}
        dcp.load(loaded, storage_reader=reader(path))
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert loaded[key].device == value.device
                assert_bit_exact(loaded[key].cpu(), value.cpu())
            else:
                assert loaded[key] == value

    writer = NvcompFileSystemWriter(tmp_path / "sync", codec=codec)
    dcp.save(state, storage_writer=writer)
    if codec in ("auto", "none"):
        assert writer.stats.codec in (("ans", "zstd", "none") if codec == "auto" else ("none",)), writer.stats
    else:
        assert writer.stats.codec == codec and writer.stats.ratio > 1.1, writer.stats
    check(tmp_path / "sync", NvcompFileSystemReader)
    check(tmp_path / "sync", dcp.FileSystemReader)

    writer = NvcompFileSystemWriter(tmp_path / "async", codec=codec)
    future = dcp.async_save(state, storage_writer=writer)
    for value in state.values():
        if isinstance(value, torch.Tensor):
            value.zero_()  # training goes on: the GPU shards were compressed while staging
    future.result()
    assert writer.stats.stage_s > 0 and (codec in ("auto", "none") or writer.stats.ratio > 1.1), writer.stats
    check(tmp_path / "async", NvcompFileSystemReader)
    plain = tmp_path / "plain"
    dcp.save(expected, storage_writer=dcp.FileSystemWriter(plain))
    if codec not in (
        "auto",
        "none",
    ):  # auto may store raw bytes (fast local disk), in a container a little larger than DCP's
        (ours,) = (tmp_path / "sync").glob("__0_0.*.distcp")  # its name carries the checkpoint id
        assert ours.stat().st_size < (plain / "__0_0.distcp").stat().st_size
