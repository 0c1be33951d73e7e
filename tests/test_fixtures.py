"""Files written by earlier versions keep loading bit-exactly (fixtures written by v0.1, commit c5af640)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import lightning_nvcomp
from lightning_nvcomp.dcp import NvcompFileSystemReader

from conftest import tensor_bytes

V01 = Path(__file__).parent / "fixtures" / "v0.1"
EXPECTED = json.loads((V01 / "state.json").read_text())


def digest(value: object) -> object:
    if not isinstance(value, torch.Tensor):
        return value
    t = value.detach()
    return [
        str(t.dtype),
        list(t.shape),
        list(t.stride()),
        type(value).__name__,
        hashlib.sha256(tensor_bytes(t).numpy()).hexdigest(),
    ]


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("loader", ["lightning_nvcomp.load", "torch.load"])
def test_v0_1_files_load_bit_exactly(codec, loader):
    path = V01 / f"{codec}.pt"
    obj = lightning_nvcomp.load(path) if loader == "lightning_nvcomp.load" else torch.load(path, weights_only=True)
    assert {k: digest(v) for k, v in obj.items()} == EXPECTED
    assert obj["w_t"].untyped_storage().data_ptr() == obj["w"].untyped_storage().data_ptr()  # views still share


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("reader", ["ours", "default"])
def test_v0_1_dcp_checkpoints_load_bit_exactly(codec, reader):
    names = [k for k, v in EXPECTED.items() if isinstance(v, list) and k != "w_t"]
    state = {}
    for k in names:
        dtype = getattr(torch, EXPECTED[k][0].removeprefix("torch."))
        state[k] = torch.zeros(EXPECTED[k][1], dtype=dtype)
    path = V01 / f"dcp_{codec}"
    if reader == "ours":
        dcp.load(state, storage_reader=NvcompFileSystemReader(path), no_dist=True)
    else:
        dcp.load(state, checkpoint_id=path, no_dist=True)
    for k in names:
        assert digest(state[k])[-1] == EXPECTED[k][-1], k
