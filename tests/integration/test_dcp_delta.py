"""DCP delta checkpoints in one process, on real files and at a URL: a writer reused for a run's saves codes each item
against the same item of its chain's keyframe; every dtype loads back bit-exactly; a missing or damaged base is named;
DCP's own reader fails naming ours. The multi-rank case (a keyframe on a changed world size) is in test_dcp.py."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from lightning_nvcomp import DeltaOptions
from lightning_nvcomp.cli import main
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter
from lightning_nvcomp.errors import CorruptCheckpointError, MissingBaseError

from tests.helpers.states import assert_tree_bit_exact
from tests.integration.test_delta import drifting_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _failure(error: BaseException) -> BaseException:
    """The error a rank raised, out of DCP's ``CheckpointException``."""
    failures = getattr(error, "failures", None)
    return next(iter(failures.values()))[0] if failures else error


def _bases(path: str) -> dict[str, str | None]:
    md = NvcompFileSystemReader(path).read_metadata()
    return {index.fqn: info.base for index, info in md.storage_data.items() if getattr(info, "codec", None)}


def _load(path: str, like: dict, reader=None) -> dict:
    target = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in like.items()}
    dcp.load(target, storage_reader=reader or NvcompFileSystemReader(path))
    return target


def _saves(root: str, steps: int, keyframe_every: int = 8) -> list[dict]:
    writer = NvcompFileSystemWriter(f"{root}/step-0", "zstd", delta=DeltaOptions(keyframe_every=keyframe_every))
    states = [drifting_state(s) for s in range(steps)]
    for step, state in enumerate(states):
        dcp.save(state, storage_writer=writer, checkpoint_id=f"{root}/step-{step}")
    return states


def _contiguous(state: dict) -> dict:
    """The state as a DCP load fills it: every tensor in its own memory (DCP saves a view's elements)."""
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def test_a_reused_writer_saves_deltas_that_load_bit_exactly_with_bare_names(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    states = _saves("run", 4, keyframe_every=3)
    assert not any(_bases("run/step-0").values())
    for step in (1, 2):
        found = _bases(f"run/step-{step}")
        assert found["w"] == "../step-0" and found["v"] == "../step-0", found  # the keyframe, at any depth
    assert not any(_bases("run/step-3").values())  # keyframe_every=3: saves 0-2 make a chain, 3 starts another
    sizes = [sum(os.path.getsize(p) for p in Path(f"run/step-{s}").iterdir()) for s in range(3)]
    assert sizes[1] < sizes[0] and sizes[2] < sizes[0]
    for step, state in enumerate(states):
        assert_tree_bit_exact(_load(f"run/step-{step}", state), _contiguous(state))
    assert main(["verify", "run/step-2"]) == 0


def test_a_save_into_the_previous_directory_stands_alone(tmp_path: Path) -> None:
    """Its data files are deleted once the new .metadata is written: no item may be coded against them."""
    writer = NvcompFileSystemWriter(tmp_path / "ckpt", "zstd", delta=DeltaOptions())
    states = [drifting_state(s) for s in range(2)]
    for state in states:
        dcp.save(state, storage_writer=writer, checkpoint_id=tmp_path / "ckpt")
    assert not any(_bases(str(tmp_path / "ckpt")).values())
    assert_tree_bit_exact(_load(str(tmp_path / "ckpt"), states[1]), _contiguous(states[1]))


def test_a_missing_or_damaged_base_is_named(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    states = _saves(root, 2)
    shutil.copytree(root, tmp_path / "kept")
    # damaged: a byte of the base item's data flipped
    data = next(p for p in Path(root, "step-0").iterdir() if p.suffix == ".distcp")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(BaseException) as caught:
        _load(f"{root}/step-1", states[1])
    error = _failure(caught.value)
    assert isinstance(error, CorruptCheckpointError) and "step-0" in str(error) and "tensor '" in str(error), error
    # missing
    shutil.rmtree(f"{root}/step-0")
    with pytest.raises(BaseException) as caught:
        _load(f"{root}/step-1", states[1])
    error = _failure(caught.value)
    assert isinstance(error, MissingBaseError) and "step-0" in str(error) and "is missing" in str(error), error
    # DCP's own reader cannot find bases: it fails naming the reader that does
    with pytest.raises(BaseException) as caught:
        _load(str(tmp_path / "kept" / "step-1"), states[1], dcp.FileSystemReader(str(tmp_path / "kept" / "step-1")))
    error = _failure(caught.value)
    assert isinstance(error, MissingBaseError) and "NvcompFileSystemReader" in str(error), error


def test_a_keyframe_damaged_during_a_chain_makes_the_next_save_stand_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the keyframe offers is read once per chain, and its bytes are checked at every save: damaged after the
    first delta, the next save's items are stored alone (with a warning) and load bit-exactly."""
    root = str(tmp_path / "run")
    writer = NvcompFileSystemWriter(f"{root}/step-0", "zstd", delta=DeltaOptions())
    states = [drifting_state(s) for s in range(3)]
    for step in range(2):
        dcp.save(states[step], storage_writer=writer, checkpoint_id=f"{root}/step-{step}")
    assert _bases(f"{root}/step-1")["w"] == "../step-0"
    for data in Path(root, "step-0").glob("*.distcp"):
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 3] ^= 0x10
        data.write_bytes(bytes(raw))
    dcp.save(states[2], storage_writer=writer, checkpoint_id=f"{root}/step-2")
    assert _bases(f"{root}/step-2")["w"] is None and "cannot be a base" in caplog.text
    assert_tree_bit_exact(_load(f"{root}/step-2", states[2]), _contiguous(states[2]))


def test_deltas_at_a_url(tmp_path: Path) -> None:
    root = f"memory://dcp-delta-{os.getpid()}"
    states = _saves(root, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _bases(f"{root}/step-2")["w"] == "../step-0"
        for step, state in enumerate(states):
            assert_tree_bit_exact(_load(f"{root}/step-{step}", state), _contiguous(state))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_gpu_shards_save_deltas_that_load_bit_exactly(tmp_path: Path, codec: str) -> None:
    """CUDA shards are coded against their keyframe's on the GPU, and load back bit for bit onto the GPU and
    onto the CPU."""
    root = str(tmp_path / "run")
    writer = NvcompFileSystemWriter(f"{root}/step-0", codec, delta=DeltaOptions())
    states = [{k: v.cuda() for k, v in drifting_state(s).items()} for s in range(3)]
    for step, state in enumerate(states):
        dcp.save(state, storage_writer=writer, checkpoint_id=f"{root}/step-{step}")
    assert _bases(f"{root}/step-2")["w"] == "../step-0"
    cpu = _contiguous({k: v.cpu() for k, v in states[2].items()})
    assert_tree_bit_exact({k: v.cpu() for k, v in _load(f"{root}/step-2", states[2]).items()}, cpu)
    assert_tree_bit_exact(_load(f"{root}/step-2", cpu), cpu)


def test_a_shard_larger_than_a_segment_is_a_delta_too(tmp_path: Path) -> None:
    """Its base is decoded a range at a time as it is coded; small items beside it are coded in batches."""
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(5_000_000, generator=gen) * 0.02  # 20 MB: two CPU segments
    states = [{"big": big + step * 1e-6, "small": big[:50_000] + step * 1e-5} for step in range(2)]
    root = str(tmp_path / "run")
    writer = NvcompFileSystemWriter(f"{root}/step-0", "zstd", delta=DeltaOptions())
    for step, state in enumerate(states):
        dcp.save(state, storage_writer=writer, checkpoint_id=f"{root}/step-{step}")
    assert _bases(f"{root}/step-1") == {"big": "../step-0", "small": "../step-0"}
    assert_tree_bit_exact(_load(f"{root}/step-1", states[1]), states[1])


def test_async_saves_are_deltas_too(tmp_path: Path) -> None:
    """``dcp.async_save`` copies CPU shards while staging and codes them in the background: against their keyframe's,
    as a sync save does; training may change the state as soon as the call returns."""
    root = str(tmp_path / "run")
    writer = NvcompFileSystemWriter(f"{root}/step-0", "zstd", delta=DeltaOptions())
    states = [drifting_state(s) for s in range(3)]
    for step, state in enumerate(states):
        live = {k: v.clone() for k, v in state.items()}
        future = dcp.async_save(live, storage_writer=writer, checkpoint_id=f"{root}/step-{step}")
        for t in live.values():
            t.zero_()  # training goes on
        future.result()
    assert _bases(f"{root}/step-2")["w"] == "../step-0"
    for step, state in enumerate(states):
        assert_tree_bit_exact(_load(f"{root}/step-{step}", state), _contiguous(state))
