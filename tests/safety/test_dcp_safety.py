"""Issue 32, part C: DCP and sharded saves an attacker cannot get into; options checked at construction.

Real ``torch.distributed.checkpoint`` saves and loads (one process, and two gloo ranks where a case is about ranks),
real files under relative names in the working directory, and DCP's own ``FileSystemReader`` where a case is about
it. Tensors are compared by their bytes.
"""

from __future__ import annotations

import inspect
import math
import multiprocessing
import os
import pickle
import shlex
import shutil
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter, _CheckedMetadata, _load_metadata
from lightning_nvcomp.errors import (
    CheckpointError,
    CodecUnavailableError,
    CorruptCheckpointError,
    DecodeLimitError,
    RefusedObjectsError,
)
from lightning_nvcomp.format import DECODE_ALLOWANCE, DECODE_MULTIPLE

from tests.helpers import dcp_workers as W
from tests.helpers.paths import FIXTURES
from tests.helpers.states import assert_state_equal, trained_like, zeros_like_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

# dcp.save/load take no_dist= from torch 2.7; torch 2.4-2.6 infer it (no process group: one process), with a warning
NO_DIST = {"no_dist": True} if "no_dist" in inspect.signature(dcp.load).parameters else {}
NO_GPU = pytest.mark.skipif(gpu_available(), reason="checks the refusal on a machine without a GPU")


def _error_of(call) -> BaseException:
    """What ``call()`` raised: for DCP's CheckpointException (each rank's error wrapped), the first rank's error."""
    try:
        call()
    except CheckpointException as err:
        return next(iter(err.failures.values()))[0]
    except BaseException as err:  # DCP's own errors are BaseExceptions
        return err
    raise AssertionError("nothing was raised")


def _state(seed: int = 0) -> dict:
    return {
        "w": trained_like(64 * 64, torch.bfloat16, seed).reshape(64, 64),
        "m": trained_like(32 * 48, torch.float32, seed + 1).reshape(32, 48),
        "step": 12 + seed,
    }


def _save(path: str | Path, state: dict, **writer_kwargs) -> None:
    dcp.save(state, storage_writer=NvcompFileSystemWriter(path, codec="zstd", **writer_kwargs), **NO_DIST)


def _load(path: str | Path, like: dict, reader: str = "ours") -> dict:
    """Load the checkpoint at ``path`` into a zeroed copy of ``like`` with our reader or DCP's own."""
    loaded = zeros_like_state(like)
    if reader == "ours":
        dcp.load(loaded, storage_reader=NvcompFileSystemReader(path), **NO_DIST)
    else:
        dcp.load(loaded, checkpoint_id=path, **NO_DIST)
    return loaded


def _checkpoint_ids(path: str | Path) -> set:
    """The checkpoint ids the items of the checkpoint at ``path`` record (None for an item that records none)."""
    data = (Path(path) / ".metadata").read_bytes()
    return {getattr(i, "checkpoint_id", None) for i in _load_metadata(data, ".metadata").storage_data.values()}


# -- options checked where they are given -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param({"codec": "ans"}, CodecUnavailableError, "codec='ans'", marks=NO_GPU, id="ans"),
        pytest.param({"staging_mb": 0}, ValueError, "staging_mb", id="staging_mb=0"),
        pytest.param({"staging_mb": -1}, ValueError, "staging_mb", id="staging_mb<0"),
        pytest.param({"thread_count": 0}, ValueError, "thread_count", id="thread_count=0"),
        pytest.param({"codec": "lz4"}, ValueError, "codec must be one of", id="unknown codec"),
    ],
)
def test_the_dcp_writer_refuses_at_construction_and_writes_nothing(tmp_path, monkeypatch, kwargs, error, match):
    """What this machine cannot do, or a size that is no size, is refused where it is given, before any directory or
    file exists (it used to be accepted: ``dcp.save`` then failed in a long CheckpointException, leaving an empty
    ``__0_0.distcp``)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=match):
        NvcompFileSystemWriter("ckpt", **kwargs)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("strategy", ["NvcompFSDPStrategy", "NvcompModelParallelStrategy"])
@pytest.mark.parametrize(
    ("codec", "error"),
    [pytest.param("ans", CodecUnavailableError, marks=NO_GPU), pytest.param("lz4", ValueError)],
)
def test_the_sharded_strategies_refuse_at_construction_and_write_nothing(tmp_path, monkeypatch, strategy, codec, error):
    from lightning_nvcomp.integrations.lightning import sharded as lightning_sharded

    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match="codec"):
        getattr(lightning_sharded, strategy)(codec=codec)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({"codec": "ans"}, CodecUnavailableError, marks=NO_GPU, id="ans"),
        pytest.param({"staging_mb": 0}, ValueError, id="staging_mb=0"),
        pytest.param({"probe_mb": -1}, ValueError, id="probe_mb<0"),
        pytest.param({"host_buffer_mb": 0}, ValueError, id="host_buffer_mb=0"),
        pytest.param({"durable": "never"}, ValueError, id="unknown durable"),
    ],
)
def test_accelerate_attach_refuses_at_construction_and_writes_nothing(tmp_path, monkeypatch, kwargs, error):
    from lightning_nvcomp.integrations.accelerate.attach import attach

    from tests.helpers import accelerate_runs as R

    monkeypatch.chdir(tmp_path)
    run = R.build(seed=5, project_dir="run")
    with pytest.raises(error):
        attach(run.accelerator, **kwargs)
    assert "save_state" not in vars(run.accelerator)  # the Accelerator is as it was
    assert os.listdir(tmp_path) == []


# -- .metadata read under weights_only rules ----------------------------------------------------------------------


class _RunsCode:
    """What a hostile ``.metadata`` holds: unpickling it runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def _checked(payload: bytes) -> bytes:
    """The checked ``.metadata`` wrapper around ``payload``, its CRC-32 right (anyone can compute it)."""
    wrapper = _CheckedMetadata.__new__(_CheckedMetadata)
    wrapper.payload, wrapper.crc = payload, zlib.crc32(payload)
    return pickle.dumps(wrapper)


def _hostile(kind: str, marker: Path) -> bytes:
    code = pickle.dumps(_RunsCode(f"echo pwned > {shlex.quote(str(marker))}"))
    return code if kind == "plain" else _checked(code)


@pytest.mark.parametrize("kind", ["plain", "checked"])
def test_a_hostile_metadata_runs_nothing_through_our_reader(tmp_path, monkeypatch, kind):
    """A ``.metadata`` whose pickle calls ``os.system`` (plain, or inside the checked wrapper with its CRC right):
    refused with a CheckpointError naming the file; the command never runs."""
    monkeypatch.chdir(tmp_path)
    state = _state()
    _save("ckpt", state)
    marker = tmp_path / "marker"
    Path("ckpt/.metadata").write_bytes(_hostile(kind, marker))
    err = _error_of(lambda: NvcompFileSystemReader("ckpt").read_metadata())
    assert not marker.exists(), "the hostile .metadata ran its command"
    assert isinstance(err, CheckpointError), repr(err)
    assert "ckpt/.metadata" in str(err) and f"{os.system.__module__}.system" in str(err), str(err)
    # through dcp.load (which re-raises the reader's error in an AssertionError of its own)
    assert "ckpt/.metadata" in str(_error_of(lambda: _load("ckpt", state)))
    assert not marker.exists(), "the hostile .metadata ran its command"


def test_a_hostile_payload_in_the_checked_wrapper_runs_nothing_through_dcps_reader(tmp_path, monkeypatch):
    """DCP's own reader unpickles ``.metadata`` plainly, which calls our checked wrapper: its payload is read under
    the same rules, so a crafted one with its CRC right runs nothing there either."""
    monkeypatch.chdir(tmp_path)
    state = _state()
    _save("ckpt", state)
    marker = tmp_path / "marker"
    Path("ckpt/.metadata").write_bytes(_hostile("checked", marker))
    err = _error_of(lambda: dcp.FileSystemReader("ckpt").read_metadata())
    assert not marker.exists(), "the hostile payload ran its command"
    assert isinstance(err, RefusedObjectsError) and f"{os.system.__module__}.system" in err.refused, repr(err)
    assert "refused" in str(_error_of(lambda: _load("ckpt", state, reader="default")))
    assert not marker.exists(), "the hostile payload ran its command"


def _sets_attributes(target: str) -> bytes:
    """A protocol-2 pickle that gives a shared object (a class, an enum member) the state ``{"pwned": 1}``: BUILD with
    a slot state, which sets attributes. It imports only names DCP's metadata pickles."""
    if target == "class":
        obj = b"ctorch.distributed.checkpoint.metadata\nMetadata\n"
    else:  # the member _MEM_FORMAT_ENCODING(0) every contiguous tensor's TensorProperties names
        obj = b"ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\nK\x00\x85R"
    return b"\x80\x02" + obj + b"N}X\x05\x00\x00\x00pwnedK\x01s\x86b."


@pytest.mark.parametrize("target", ["class", "enum member"])
def test_a_metadata_cannot_change_the_classes_it_names(tmp_path, monkeypatch, target):
    """torch's weights_only rule, kept: state only goes to objects the pickle made, never to a class or an enum member
    it imports (that would change them for the whole process: every later save and load)."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    shared = Metadata if target == "class" else _MEM_FORMAT_ENCODING(0)
    monkeypatch.chdir(tmp_path)
    state = _state()
    _save("ckpt", state)
    Path("ckpt/.metadata").write_bytes(_checked(_sets_attributes(target)))
    try:
        err = _error_of(lambda: NvcompFileSystemReader("ckpt").read_metadata())
        assert not hasattr(shared, "pwned"), f"the .metadata changed {shared!r} for the whole process"
    finally:
        if "pwned" in vars(shared):
            delattr(shared, "pwned")
    assert isinstance(err, RefusedObjectsError) and "ckpt/.metadata" in str(err), repr(err)


def test_every_metadata_reads_as_a_plain_unpickling_reads_it(tmp_path, monkeypatch):
    """The restricted reading gives what ``pickle.loads`` gives, for the ``.metadata`` of every earlier version (the
    fixtures), of DCP's own writer and of ours now (a ``Path`` checkpoint id, byte items, both formats)."""
    monkeypatch.chdir(tmp_path)
    state = _state()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(Path("plain")), **NO_DIST)
    _save(Path("ours"), state)
    files = [*sorted(FIXTURES.glob("*/dcp_*/.metadata")), Path("plain/.metadata"), Path("ours/.metadata")]
    assert len(files) == 6, files
    for path in files:
        data = path.read_bytes()
        assert _load_metadata(data, str(path)) == pickle.loads(data), path


# -- a checkpoint id binding every data file to its .metadata ----------------------------------------------------


def _two_rank_saves(rank: int, port: int, root: str) -> None:
    """Rank ``rank`` of two (gloo): steps 1 and 2 of a run, the sharded state of versions 0 and 1."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for version in (0, 1):
            state = W.sharded_state(W._mesh(), version)
            dcp.save(state, storage_writer=NvcompFileSystemWriter(f"{root}/step-{version + 1}", codec="zstd"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory) -> Path:
    """Two checkpoints of a two-rank run, ``step-1`` and ``step-2`` (copy them before changing them)."""
    root = tmp_path_factory.mktemp("run")
    ctx = multiprocessing.get_context("spawn")
    port = W.free_port()
    ranks = [ctx.Process(target=_two_rank_saves, args=(rank, port, str(root))) for rank in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(180)
    assert [p.exitcode for p in ranks] == [0, 0]
    return root


def _target() -> dict:
    """A load target for the two-rank state, in one process: every tensor whole."""
    full = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype, _) in W.FULL.items()}
    return {
        "model": {name: full[name] for name in ("w", "m", "r")},
        "st": full["raw"],
        "plain": full["plain"],
        "idx": full["idx"],
        "step": 0,
        "extra": {"lr": 0.0, "name": ""},
    }


def _assert_version(loaded: dict, version: int) -> None:
    for name in ("w", "m", "r"):
        W.assert_same(loaded["model"][name], W.full_tensor(name, version), f"model.{name}")
    W.assert_same(loaded["st"], W.full_tensor("raw", version), "st")
    for name in ("plain", "idx"):
        W.assert_same(loaded[name], W.full_tensor(name, version), name)
    assert loaded["step"] == 7 + version and loaded["extra"] == {"lr": 0.125, "name": "run"}, loaded


def _rank_file(step: Path, rank: int) -> Path:
    (found,) = step.glob(f"__{rank}_0*.distcp")
    return found


def test_a_ranks_file_replaced_by_the_same_ranks_file_of_another_step_is_refused(tmp_path, two_steps):
    """Rank 1's data file of step 2 replaced by rank 1's file of step 1: our reader refuses it, naming the file, an
    item and both checkpoint ids (it used to load a mixed state that never existed)."""
    shutil.copytree(two_steps, tmp_path / "run")
    step1, step2 = tmp_path / "run" / "step-1", tmp_path / "run" / "step-2"
    _assert_version(_load_into_target(step2), 1)  # intact, it loads
    replaced = _rank_file(step2, 1)
    shutil.copyfile(_rank_file(step1, 1), replaced)
    err = _error_of(lambda: _load_into_target(step2))
    assert isinstance(err, CorruptCheckpointError), repr(err)
    (id1,), (id2,) = _checkpoint_ids(step1), _checkpoint_ids(step2)
    assert id1 and id2 and id1 != id2
    message = str(err)
    assert f"{replaced.name}: item '" in message and id1 in message and id2 in message, message


def test_another_ranks_file_of_the_same_save_is_refused(tmp_path, two_steps):
    """Ranks 0 and 1's files of one save swapped (same checkpoint id, other names): refused, naming the file."""
    shutil.copytree(two_steps, tmp_path / "run")
    step = tmp_path / "run" / "step-2"
    zero, one = _rank_file(step, 0), _rank_file(step, 1)
    data = zero.read_bytes()
    zero.write_bytes(one.read_bytes())
    one.write_bytes(data)
    err = _error_of(lambda: _load_into_target(step))
    assert isinstance(err, CorruptCheckpointError) and "another rank's" in str(err), repr(err)
    assert f"{zero.name}: item '" in str(err) or f"{one.name}: item '" in str(err), str(err)


@pytest.mark.parametrize("reader", ["ours", "default"])
def test_no_reader_opens_a_data_file_of_another_checkpoint(tmp_path, two_steps, reader):
    """Data file names carry the checkpoint id: step 1's files copied into step 2's directory (a sync of the wrong
    directory, a careless ``cp``) replace nothing, and neither our reader nor DCP's ``FileSystemReader`` opens them
    (with the names they had, the copy replaced step 2's files and both readers loaded a mixed state)."""
    shutil.copytree(two_steps, tmp_path / "run")
    step1, step2 = tmp_path / "run" / "step-1", tmp_path / "run" / "step-2"
    for data_file in step1.glob("*.distcp"):
        shutil.copy(data_file, step2)
    _assert_version(_load_into_target(step2, reader), 1)


def _load_into_target(path: Path, reader: str = "ours") -> dict:
    target = _target()
    if reader == "ours":
        dcp.load(target, storage_reader=NvcompFileSystemReader(path), **NO_DIST)
    else:
        dcp.load(target, checkpoint_id=path, **NO_DIST)
    return target


def test_dcp_plan_caching_still_gives_each_save_its_own_checkpoint_id(tmp_path, monkeypatch):
    """With DCP's plan caching the final plan of an earlier save comes back: its checkpoint id is not reused (a new
    one is drawn), so a file of the earlier checkpoint is still refused, and the saves share no file name."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    if "enable_plan_caching" not in inspect.signature(DefaultSavePlanner).parameters:
        pytest.skip("this torch has no DCP plan caching")
    monkeypatch.chdir(tmp_path)
    states = [_state(seed) for seed in range(3)]
    for name, state in zip(("a", "b", "c"), states):
        planner = DefaultSavePlanner(enable_plan_caching=True)
        dcp.save(state, storage_writer=NvcompFileSystemWriter(name, codec="zstd"), planner=planner, **NO_DIST)
    ids = [_checkpoint_ids(name) for name in ("a", "b", "c")]
    assert all(len(i) == 1 and None not in i for i in ids) and len(set.union(*ids)) == 3, ids
    names = [{p.name for p in Path(name).glob("*.distcp")} for name in ("a", "b", "c")]
    assert not (names[0] & names[1] or names[1] & names[2]), names
    assert_state_equal(_load("c", states[2]), states[2])
    (b_file,), (c_file,) = names[1], names[2]
    shutil.copyfile(Path("b", b_file), Path("c", c_file))
    assert isinstance(_error_of(lambda: _load("c", states[2])), CorruptCheckpointError)


# -- one decode bound per load, from the bytes stored ---------------------------------------------------------------


def test_overlapping_items_cannot_decode_more_than_the_stored_bytes_allow(tmp_path, monkeypatch):
    """A crafted ``.metadata`` whose items all point at the same stored bytes (one compressible tensor): the load's
    decode bound comes from the bytes stored, once, not from each item's length, so the load is refused with
    DecodeLimitError naming the checkpoint (it used to grow with the number of items and decode them all)."""
    monkeypatch.chdir(tmp_path)
    gen = torch.Generator().manual_seed(3)
    small_ints = torch.randint(0, 16, (1 << 20,), generator=gen).float()  # 4 MiB that compress ~5x: within 16x
    _save("ckpt", {"a": small_ints})
    metadata = _load_metadata(Path("ckpt/.metadata").read_bytes(), ".metadata")
    ((index, info),) = ((k, v) for k, v in metadata.storage_data.items() if k.fqn == "a")
    raw, stored = small_ints.numel() * 4, info.length
    assert raw < DECODE_MULTIPLE * stored, (raw, stored)  # one item alone is within the bound
    copies = math.ceil((DECODE_MULTIPLE * stored + DECODE_ALLOWANCE) / raw) + 1
    # what the bound used to allow: each copy's length counted, as if the file held them all
    assert copies * raw <= DECODE_MULTIPLE * copies * stored + DECODE_ALLOWANCE
    for k in range(copies):
        fqn = f"a{k}"
        metadata.state_dict_metadata[fqn] = metadata.state_dict_metadata["a"]
        metadata.storage_data[MetadataIndex(fqn, index.offset, index.index)] = info
        metadata.planner_data[fqn] = (fqn,)
    Path("ckpt/.metadata").write_bytes(pickle.dumps(_CheckedMetadata(metadata)))
    target = {f"a{k}": torch.zeros_like(small_ints) for k in range(copies)}
    err = _error_of(lambda: dcp.load(target, storage_reader=NvcompFileSystemReader("ckpt"), **NO_DIST))
    assert isinstance(err, DecodeLimitError), repr(err)
    # the checkpoint named, and its bound from the bytes its items occupy, counted once
    assert "ckpt: " in str(err) and f"{DECODE_MULTIPLE} x the file's {stored} bytes" in str(err), str(err)
