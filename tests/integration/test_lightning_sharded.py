"""Lightning's sharded strategies compressed through lightning_nvcomp.dcp: ModelParallelStrategy (FSDP2) on two CPU
ranks with gloo, and FSDPStrategy(state_dict_type="sharded") / ModelParallelStrategy on a GPU. Each run is compared
bit for bit with the same run under Lightning's own strategy, and the state must reach the writer un-offloaded: on
a GPU as CUDA tensors (on a CPU both ways give CPU tensors, so there the strategy's record of its own collection path
is what is checked)."""

from __future__ import annotations

import copy
import csv
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.utils._pytree as pytree
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from lightning_nvcomp._compat.dcp import TORCH
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.dcp import NvcompStorageInfo

from tests.helpers.paths import HELPERS, REPO_ROOT
from tests.helpers.states import assert_tree_bit_exact

SCRIPT = HELPERS / "lightning_sharded_run.py"


def _run(
    kind: str,
    codec: str,
    root: Path,
    steps: int,
    ckpt: Path | None = None,
    gpus: int = 1,
    state_on_gpu: bool = True,
    **env_vars: str,
) -> list[dict]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        GPUS=str(gpus),
        STATE_ON_GPU="1" if state_on_gpu else "0",
        **env_vars,
    )
    args = [sys.executable, str(SCRIPT), kind, codec, str(root), str(steps)] + ([str(ckpt)] if ckpt else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=str(root.parent))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(p.read_text()) for p in sorted(root.glob("result-*.json"))]


def _full_state(checkpoint: Path, out: Path) -> dict:
    """The whole model and optimizer state of a sharded checkpoint, read by DCP's own reader."""
    dcp_to_torch_save(checkpoint, out)
    return torch.load(out, weights_only=False)


def _check(tmp_path: Path, kind: str, codec: str, gpus: int = 1) -> None:
    plain, ours, resumed = tmp_path / "plain", tmp_path / "ours", tmp_path / "ours_resumed"
    _run(kind, "plain", plain, 8, gpus=gpus)
    results = _run(kind, codec, ours, 8, gpus=gpus)
    names = ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    assert sorted(p.name for p in (ours / "checkpoints").iterdir()) == names
    for name in names:
        want = _full_state(plain / "checkpoints" / name, tmp_path / f"plain-{name}.pt")
        got = _full_state(ours / "checkpoints" / name, tmp_path / f"ours-{name}.pt")
        assert_tree_bit_exact(want, got)
    stored = sum(p.stat().st_size for p in (ours / "checkpoints" / names[1]).glob("*.distcp"))
    assert stored < sum(p.stat().st_size for p in (plain / "checkpoints" / names[1]).glob("*.distcp"))
    # every rank handed the writer its shards where they live: CUDA tensors on a GPU, collected without offload
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert [r["state"] for r in results] == [{"offloaded": False, "devices": [device]}] * len(results), results
    ranks = results[0]["ranks"]
    assert results[0]["global_step"] == 8 and [r[0] for r in ranks] == list(range(len(results)))
    assert all(r[1] == codec for r in ranks) and sum(r[3] for r in ranks) < sum(r[2] for r in ranks), ranks
    # ranks[r] is rank r's: the bytes the metadata records in rank r's data files (__<r>_<n>.distcp)
    with open(ours / "checkpoints" / names[1] / ".metadata", "rb") as f:
        infos = [i for i in pickle.load(f).storage_data.values() if isinstance(i, NvcompStorageInfo) and i.codec]
    per_rank = [0] * len(results)
    for info in infos:
        per_rank[int(re.match(r"__(\d+)_", info.relative_path)[1])] += info.length
    assert per_rank == [r[3] for r in ranks], (per_rank, ranks)

    with open(ours / "csv" / "version_0" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("nvcomp/raw_gb")]
    assert [int(r["step"]) for r in rows] == [4, 8]
    for rank in range(len(results)):
        assert float(rows[-1][f"nvcomp/rank{rank}/stored_gb"]) * 1e9 == pytest.approx(ranks[rank][3])
    assert float(rows[-1]["nvcomp/stored_gb"]) * 1e9 == pytest.approx(sum(r[3] for r in ranks))

    # Resuming from the first compressed checkpoint ends where resuming from Lightning's own does, bit for bit.
    # (Not where the uninterrupted run ends: Lightning's resume of these strategies does not reproduce that.)
    # The resumed run saves with state_on_gpu=False: Lightning's own state collection (its CPU offload; FSDP1's
    # sharded optimizer state still reaches the writer on the GPU), and as bit-exact.
    resumed_results = _run(kind, codec, resumed, 8, ours / "checkpoints" / names[0], gpus, state_on_gpu=False)
    assert resumed_results[0]["global_step"] == 8
    # The resume read the sharded state through the compressed reader: the module state and the optimizer state
    # (FSDP1's through the reader FSDPStrategy makes itself).
    assert [r["sharded_loads"] for r in resumed_results] == [2] * len(results), resumed_results
    assert all(r["state"]["offloaded"] for r in resumed_results), resumed_results
    if kind == "mp":
        assert [r["state"]["devices"] for r in resumed_results] == [["cpu"]] * len(results)
    _run(kind, "plain", tmp_path / "plain_resumed", 8, plain / "checkpoints" / names[0], gpus)
    assert_tree_bit_exact(
        _full_state(tmp_path / "plain_resumed" / "checkpoints" / names[1], tmp_path / "a.pt"),
        _full_state(resumed / "checkpoints" / names[1], tmp_path / "b.pt"),
    )


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run; GPU machines run the gpu test below")
@pytest.mark.skipif(
    TORCH < (2, 7), reason="FSDP2 (fully_shard) runs on CPU ranks from torch 2.7 (before, it needs CUDA streams)"
)
def test_model_parallel_on_two_cpu_ranks(tmp_path):
    _check(tmp_path, "mp", "zstd")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
@pytest.mark.parametrize("kind", ["fsdp", "mp"])
def test_sharded_strategies_on_a_gpu(tmp_path, kind):
    _check(tmp_path, kind, "ans")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs and nvCOMP")
@pytest.mark.parametrize("kind", ["fsdp", "mp"])
def test_sharded_strategies_on_two_gpus(tmp_path, kind):
    _check(tmp_path, kind, "ans", gpus=2)


def _check_deltas(tmp_path: Path, keyframe_every: int, kept: list[int], codec: str) -> None:
    """Sharded saves as deltas, pruned by Lightning's top-k (1): a checkpoint a kept one needs stays (its chain's
    keyframe), and goes once none does; the kept checkpoint holds the plain run's state bit for bit, and a run
    resumes from it."""
    from lightning_nvcomp.dcp import NvcompFileSystemReader

    plain, ours = tmp_path / "plain", tmp_path / "ours"
    _run("mp", "plain", plain, 12)
    _run("mp", codec, ours, 12, DELTA=str(keyframe_every), TOP_K="1")
    names = [f"epoch={step // 4 - 1}-step={step}.ckpt" for step in kept]
    assert sorted(p.name for p in (ours / "checkpoints").iterdir()) == names
    last = ours / "checkpoints" / names[-1]
    with open(last / ".metadata", "rb") as f:
        bases = {i.base for i in pickle.load(f).storage_data.values() if isinstance(i, NvcompStorageInfo) and i.codec}
    assert bases == ({None, "../epoch=0-step=4.ckpt"} if keyframe_every > 2 else {None}), bases
    want = _full_state(plain / "checkpoints" / "epoch=2-step=12.ckpt", tmp_path / "plain.pt")
    got = copy.deepcopy(want)
    zeroed = [t.zero_() for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    assert zeroed and not any(t.is_floating_point() and t.count_nonzero() for t in zeroed)
    dcp.load(got, storage_reader=NvcompFileSystemReader(last), no_dist=True)
    assert_tree_bit_exact(want, got)
    resumed = _run("mp", codec, tmp_path / "resumed", 16, last, DELTA=str(keyframe_every))
    assert resumed[0]["global_step"] == 16 and resumed[0]["sharded_loads"] == 2, resumed


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run; GPU machines run the gpu test below")
@pytest.mark.skipif(TORCH < (2, 7), reason="FSDP2 (fully_shard) runs on CPU ranks from torch 2.7")
@pytest.mark.parametrize(("keyframe_every", "kept"), [(8, [4, 12]), (2, [12])])
def test_deltas_through_top_k_pruning_on_two_cpu_ranks(tmp_path, keyframe_every, kept):
    _check_deltas(tmp_path, keyframe_every, kept, "zstd")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
def test_deltas_through_top_k_pruning_on_a_gpu(tmp_path):
    _check_deltas(tmp_path, 8, [4, 12], "ans")


def test_dcp_file_system_reader_is_ours_only_within_the_block(tmp_path):
    """What FSDPStrategy.load_checkpoint imports as ``torch.distributed.checkpoint.FileSystemReader`` while the swap
    is on is the given reader (here: ours, reading a checkpoint of ours); DCP's own class is back after, also when
    the block fails."""

    from lightning_nvcomp._compat.dcp import filesystem_classes_as
    from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

    own = dcp.FileSystemReader
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    with filesystem_classes_as(reader=NvcompFileSystemReader):
        from torch.distributed.checkpoint import FileSystemReader

        loaded = {"w": torch.zeros(1000)}
        dcp.load(loaded, storage_reader=FileSystemReader(path=tmp_path))
    assert FileSystemReader is NvcompFileSystemReader
    assert torch.equal(loaded["w"].view(torch.uint8), state["w"].view(torch.uint8))
    assert dcp.FileSystemReader is own
    with pytest.raises(OSError), filesystem_classes_as(reader=NvcompFileSystemReader):
        raise OSError("the load failed")
    assert dcp.FileSystemReader is own
