"""Files written by earlier versions keep loading bit-exactly: fixtures written by v0.1 (commit c5af640), files of
format 2 written before the package was reshaped (commit 327f5fe; the gANS one on the H200) and DCP checkpoints
written by v0.2-dev (commit b45312a, the checked ``.metadata`` naming ``lightning_nvcomp.dcp``); and a
``.metadata`` written now still names only ``lightning_nvcomp.dcp`` (those names are part of the file format)."""

from __future__ import annotations

import hashlib
import inspect
import json
import pickletools

import pytest
import torch
import torch.distributed.checkpoint as dcp

import lightning_nvcomp
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

from tests.helpers.paths import FIXTURES
from tests.helpers.states import tensor_bytes

# dcp.save/load take no_dist= from torch 2.7; torch 2.4-2.6 infer it (no process group: one process), with a warning
NO_DIST = {"no_dist": True} if "no_dist" in inspect.signature(dcp.load).parameters else {}

V01 = FIXTURES / "v0.1"
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
@pytest.mark.parametrize("loader", ["lightning_nvcomp.load", "torch.load"])
def test_format_2_files_from_before_the_reshape_load_bit_exactly(codec, loader):
    """Files of format 2 written by the code before the package was reshaped (commit 327f5fe; the v0.1 fixtures'
    state): the reshaped writer and reader must keep reading them."""
    path = FIXTURES / "v0.2-dev" / f"{codec}.pt"
    obj = lightning_nvcomp.load(path) if loader == "lightning_nvcomp.load" else torch.load(path, weights_only=True)
    assert {k: digest(v) for k, v in obj.items()} == EXPECTED
    assert obj["w_t"].untyped_storage().data_ptr() == obj["w"].untyped_storage().data_ptr()
    record = lightning_nvcomp.format.describe(path)["big"].record
    assert record["format"] == 2 and "check" in record


@pytest.mark.parametrize("version", ["v0.1", "v0.2-dev"])
@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("reader", ["ours", "default"])
def test_dcp_checkpoints_load_bit_exactly(version, codec, reader):
    expected = json.loads((FIXTURES / version / "state.json").read_text())
    names = [k for k, v in expected.items() if isinstance(v, list) and k != "w_t"]
    assert len(names) == 8, names
    state = {}
    for k in names:
        dtype = getattr(torch, expected[k][0].removeprefix("torch."))
        state[k] = torch.zeros(expected[k][1], dtype=dtype)
    path = FIXTURES / version / f"dcp_{codec}"
    if reader == "ours":
        dcp.load(state, storage_reader=NvcompFileSystemReader(path), **NO_DIST)
    else:
        dcp.load(state, checkpoint_id=path, **NO_DIST)
    for k in names:
        assert digest(state[k])[-1] == expected[k][-1], k


def pickle_globals(data: bytes) -> tuple[set[tuple[str, str]], list[bytes]]:
    """The ``(module, name)`` pairs a pickle imports (GLOBAL and STACK_GLOBAL, memo references followed) and the
    bytes objects it holds, read with ``pickletools.genops`` (nothing is unpickled)."""
    found: set[tuple[str, str]] = set()
    blobs: list[bytes] = []
    memo: dict[int, object] = {}
    pushed: list[object] = []  # what each opcode left on top of the stack (None: not a string)
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            module, name = str(arg).split(" ", 1)
            found.add((module, name))
            pushed.append(None)
        elif op.name == "STACK_GLOBAL":
            module, name = pushed[-2], pushed[-1]
            assert isinstance(module, str) and isinstance(name, str), (module, name)
            found.add((module, name))
            pushed.append(None)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = pushed[-1] if pushed else None
        elif op.name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo.get(int(arg)))
        elif op.name != "FRAME":
            if isinstance(arg, bytes):
                blobs.append(arg)
            pushed.append(arg if isinstance(arg, str) and "UNICODE" in op.name else None)
    return found, blobs


def test_new_dcp_metadata_names_only_lightning_nvcomp_dcp(tmp_path):
    """A ``.metadata`` written now pickles ``lightning_nvcomp.dcp._checked_metadata`` (the outer call) and, in its
    payload, ``lightning_nvcomp.dcp.NvcompStorageInfo``: the names files of earlier versions use, whichever module
    defines them now. No other lightning_nvcomp module is named."""
    state = {"w": torch.arange(600, dtype=torch.float32).reshape(20, 30), "b": torch.ones(7, dtype=torch.bfloat16)}
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"), **NO_DIST)
    outer, blobs = pickle_globals((tmp_path / ".metadata").read_bytes())
    assert outer == {("lightning_nvcomp.dcp", "_checked_metadata")}, outer
    assert len(blobs) == 1, len(blobs)
    inner, _ = pickle_globals(blobs[0])
    ours = {(m, n) for m, n in inner if m.partition(".")[0] == "lightning_nvcomp"}
    assert ours == {("lightning_nvcomp.dcp", "NvcompStorageInfo")}, inner
    for version in ("v0.1", "v0.2-dev"):  # and the fixtures, to show what the scan sees
        old, old_blobs = pickle_globals((FIXTURES / version / "dcp_zstd" / ".metadata").read_bytes())
        names = old | (pickle_globals(old_blobs[0])[0] if old_blobs else set())
        assert ("lightning_nvcomp.dcp", "NvcompStorageInfo") in names, (version, names)
    loaded = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(loaded, checkpoint_id=tmp_path, **NO_DIST)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("loader", ["lightning_nvcomp.load", "torch.load"])
def test_v0_2_0_files_load_bit_exactly(codec, loader):
    """Files of release 0.2.0 (record format 2: plain byte planes, zlib CRC-32s) of every float width, the specials
    included, load bit-exactly after the record layout changed (format 3)."""
    from tests.fixtures.make_v0_3_dev import digest as full_digest

    folder = FIXTURES / "v0.2.0"
    path = folder / f"{codec}.pt"
    obj = lightning_nvcomp.load(path) if loader == "lightning_nvcomp.load" else torch.load(path, weights_only=True)
    assert json.loads(json.dumps(full_digest(obj))) == json.loads((folder / "state.json").read_text())


@pytest.mark.parametrize("name", ["none", "zstd", "delta"])
@pytest.mark.parametrize("loader", ["lightning_nvcomp.load", "torch.load"])
def test_v0_3_0_files_load_bit_exactly(name, loader):
    """Files of release 0.3.0: record format 3 of every float width, and a delta checkpoint (record format 4, its
    records transformed by XOR and by integer difference) through its base."""
    from tests.fixtures.make_v0_3_dev import digest as full_digest

    folder = FIXTURES / "v0.3.0"
    path = folder / f"{name}.pt"
    obj = lightning_nvcomp.load(path) if loader == "lightning_nvcomp.load" else torch.load(path, weights_only=True)
    expected = folder / ("delta.json" if name == "delta" else "state.json")
    assert json.loads(json.dumps(full_digest(obj))) == json.loads(expected.read_text())
