"""Accelerate with FSDP sharded state dicts (``state_dict_type="SHARDED_STATE_DICT"``): the model and optimizer parts
of ``save_state`` / ``load_state`` go through lightning_nvcomp's DCP writer and reader once ``attach`` is called.

Accelerate 1.15 runs FSDP only on an accelerator: ``AcceleratorState`` selects ``DistributedType.FSDP`` only inside
its branch for ``MULTI_GPU`` and the other accelerator backends, so ``Accelerator(cpu=True, fsdp_plugin=...)`` on two
gloo ranks runs as ``MULTI_CPU`` DDP with no ``fsdp_plugin`` and ``save_state`` never reaches the FSDP functions. The
CPU test therefore runs those functions themselves (``save_fsdp_model`` & co., Accelerate's own code, as
``save_state`` calls them) on an FSDP2 model inside the attachment's routing; the ``gpu`` tests run the whole
``save_state`` / ``load_state`` with FSDP1 and FSDP2 on one GPU. Every comparison is of bits (SHA-256 of each tensor's
bits, with its dtype, shape and strides).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from lightning_nvcomp._compat.dcp import TORCH
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompStorageInfo

from tests.helpers import accelerate_runs as R
from tests.helpers.paths import HELPERS, REPO_ROOT
from tests.helpers.processes import torchrun

#: Accelerate runs FSDP2 from torch 2.6 ("FSDP2 requires PyTorch >= 2.6.0"); FSDP1 runs on every torch we support.
NEEDS_FSDP2 = pytest.mark.skipif(TORCH < (2, 6), reason="Accelerate's FSDP2 needs torch 2.6")
#: FSDP2 itself runs on CPU ranks from torch 2.7 (2.4-2.5 call torch.cuda's streams, 2.6's CPU stream has no
#: record_event).
NEEDS_FSDP2_ON_CPU = pytest.mark.skipif(TORCH < (2, 7), reason="FSDP2 runs on CPU ranks from torch 2.7")
PARTS = ["pytorch_model_fsdp_0", "optimizer_0"]  # Accelerate's DCP directories for one model and one optimizer


def _launch(mode: str, nproc: int, out: Path, timeout_s: int = 30) -> list[dict]:
    """``accelerate_fsdp_child.py MODE`` on ``nproc`` ranks; each rank's JSON result."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))  # keep where the package is
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    proc = torchrun(
        nproc, HELPERS / "accelerate_fsdp_child.py", [mode, str(out), str(timeout_s)], env, timeout_s * 6 + 60, mode
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def _check_round_trip(run: dict) -> None:
    """The state after ``load`` is, bit for bit, the state at the save (and training had changed it meanwhile)."""
    assert run["changed"]["model"] != run["expected"]["model"]
    assert run["changed"]["optimizer"] != run["expected"]["optimizer"]
    assert run["loaded"] == run["expected"]


def _check_files(ck: Path, codec: str, expected: dict, tmp_path: Path) -> None:
    """Our compressed DCP format (read by our reader: every tensor item an NvcompStorageInfo of ``codec``), and
    DCP's own FileSystemReader reads it back bit-exactly."""
    assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == sorted(PARTS)
    for name in PARTS:
        metadata = NvcompFileSystemReader(ck / name).read_metadata()
        infos = [
            info
            for index, info in metadata.storage_data.items()
            if isinstance(metadata.state_dict_metadata[index.fqn], TensorStorageMetadata)
        ]
        assert infos, name
        assert all(isinstance(i, NvcompStorageInfo) and i.codec == codec and i.raw_nbytes for i in infos), infos
    # DCP's default reader (dcp_to_torch_save reads with FileSystemReader) on the model's and the optimizer's part
    dcp_to_torch_save(ck / PARTS[0], tmp_path / "model.pt")
    assert R.flat_digests(torch.load(tmp_path / "model.pt")["model"]) == expected["model"]
    dcp_to_torch_save(ck / PARTS[1], tmp_path / "optimizer.pt")
    assert R.flat_digests(torch.load(tmp_path / "optimizer.pt")["optimizer"]["state"]) == expected["optimizer"]


@pytest.mark.slow  # ~11 s on 2 cores: torch.distributed.run and two ranks importing torch and accelerate
@NEEDS_FSDP2_ON_CPU
def test_accelerates_fsdp2_functions_write_and_read_through_ours_on_two_cpu_ranks(tmp_path):
    ranks = _launch("cpu", 2, tmp_path)
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["ck"]["expected"] == ranks[1]["ck"]["expected"]  # FSDP: one model, sharded over the ranks
    for run in (r["ck"] for r in ranks):
        _check_round_trip(run)
        assert list(run["saved"]) == PARTS and run["reads"] == PARTS  # our writer made both parts, our reader read them
        for part in run["saved"].values():
            assert part["devices"] == ["cpu"] and part["codecs"] == ["zstd", "zstd"], part
            assert part["stored"] < part["raw"], part
    _check_files(tmp_path / "ck", "zstd", ranks[0]["ck"]["expected"], tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
@pytest.mark.parametrize("fsdp_version", [1, pytest.param(2, marks=NEEDS_FSDP2)])
def test_save_state_and_load_state_with_fsdp_on_a_gpu(tmp_path, fsdp_version):
    (rank,) = _launch(f"gpu{fsdp_version}", 1, tmp_path)
    for name, device in (("ck_gpu", "cuda"), ("ck_offload", "cpu")):  # state_on_gpu=True, then False
        run = rank[name]
        assert run["distributed_type"] == "DistributedType.FSDP"
        _check_round_trip(run)
        assert list(run["saved"]) == PARTS and run["reads"] == PARTS
        for part in run["saved"].values():
            # state_on_gpu: the writer got CUDA shards although the plugin's configs say offload_to_cpu=True. Without
            # it, FSDP1 on one GPU (no sharding there) hands part of its state over on the GPU all the same (seen on
            # the H200): the plugin's own collection, not checked for devices.
            if name == "ck_gpu" or fsdp_version == 2:
                assert part["devices"] == [device], (name, part)
            assert part["codecs"] == ["ans"], (name, part)
            assert part["stored"] < part["raw"], part
        assert run["plugin_offload"] == [True, True]  # the plugin's own configs were put back
        _check_files(tmp_path / name, "ans", run["expected"], tmp_path)
