"""The single-file format's safety holes (issue 32, part D), each through the routes users take: plain
``torch.load`` (Lightning's ``load_from_checkpoint`` among them), ``lightning_nvcomp.load`` and the CLI.

* Errors found while decoding name the file, also when torch.load (which tells the decoders no path) reads it.
* One decode bound per load, from the file's size, whatever the route: crafted overlapping views of one blob do not
  raise it; views of one storage still decode once.
* Python attributes of tensors and parameters are stored as ``torch.save`` stores them.
* Nested tensors and the other tensor kinds ``torch.save`` takes round-trip bit-exactly; one torch cannot pickle is
  refused by its path and kind.
* A flipped bit anywhere in the zip's headers is damage (``verify`` exits 1); a machine error is not (exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import json
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import crc32c
import fsspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing._internal.two_tensor import TwoTensor

import lightning_nvcomp
from lightning_nvcomp import NvcompCheckpointIO
from lightning_nvcomp import format as fileformat
from lightning_nvcomp.cli import main
from lightning_nvcomp.codec import schema
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, DecodeLimitError
from lightning_nvcomp.format.decode import Placement, decode_tensor, tensor_check
from lightning_nvcomp.format.writer import _ArchivePickler, _StorageKey
from lightning_nvcomp.format.zip import ArchiveWriter

from tests.fixtures.make_v0_3_dev import digest
from tests.helpers.files import tensor_data_entries
from tests.helpers.lightning_models import TinyData, TinyModule, quiet_trainer
from tests.helpers.paths import FIXTURES
from tests.helpers.processes import python_child
from tests.helpers.states import random_tensor, tensor_bytes


def flip(path: str | os.PathLike, offset: int, bit: int = 0) -> None:
    """Flip one bit of a file in place."""
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 1 << bit
    Path(path).write_bytes(bytes(data))


def verify(path: str | os.PathLike) -> int:
    """``lightning-nvcomp verify -q PATH``'s exit status, its output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(["verify", "-q", os.fspath(path)])


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """``tmp_path`` as the working directory, with a ``ckpts`` directory in it: tests name files as users do."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("ckpts")
    return tmp_path


def small_state() -> dict:
    torch.manual_seed(0)
    return {"layer.weight": torch.randn(64, 32), "layer.bias": torch.randn(32).bfloat16(), "step": 3}


# -- errors name the file, plain torch.load included --------------------------------------------------------------


def damaged_checkpoint() -> Path:
    """``ckpts/step-1.ckpt`` in the working directory, saved by lightning_nvcomp, a bit of its first blob flipped
    (its tensor ``layer.weight``)."""
    path = Path("ckpts/step-1.ckpt")
    lightning_nvcomp.save(small_state(), path, codec="zstd")
    start, _ = tensor_data_entries(path)["archive/data/0"]
    flip(path, start + 100)
    return path


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("source", ["relative path", "bare name", "open file", "fsspec file"])
def test_damage_found_by_plain_torch_load_names_the_file(workdir, monkeypatch, weights_only, source):
    path = damaged_checkpoint()
    where = os.path.abspath(path)
    with pytest.raises(CorruptCheckpointError) as info, contextlib.ExitStack() as stack:
        if source == "relative path":
            torch.load(path, weights_only=weights_only)
        elif source == "bare name":
            monkeypatch.chdir("ckpts")
            torch.load("step-1.ckpt", weights_only=weights_only)
        elif source == "open file":
            torch.load(stack.enter_context(open(path, "rb")), weights_only=weights_only)
        else:  # as Lightning's load_from_checkpoint opens a local path
            torch.load(stack.enter_context(fsspec.open(str(path), "rb")), weights_only=weights_only)
    message = str(info.value)
    assert message.startswith(f"{where}: tensor 'layer.weight': "), message
    assert "checksum mismatch" in message


def test_damage_in_a_file_torch_load_reads_from_memory_says_so(workdir):
    data = damaged_checkpoint().read_bytes()
    with pytest.raises(CorruptCheckpointError, match=r"^the BytesIO torch.load is reading: tensor 'layer.weight'"):
        torch.load(io.BytesIO(data), weights_only=True)


def test_load_from_checkpoint_of_a_damaged_file_names_it(workdir):
    """A real Trainer saves through NvcompCheckpointIO; ``LightningModule.load_from_checkpoint`` (plain torch.load
    underneath) of the damaged file names it."""
    torch.manual_seed(0)
    trainer = quiet_trainer(".", max_epochs=1, plugins=[NvcompCheckpointIO(codec="zstd", durable="os")])
    trainer.fit(TinyModule(), datamodule=TinyData())
    path = os.path.relpath(trainer.checkpoint_callback.best_model_path)
    assert not os.path.isabs(path) and path.endswith(".ckpt"), path
    start, _ = tensor_data_entries(path)["archive/data/0"]
    flip(path, start + 7)
    with pytest.raises(CorruptCheckpointError) as info:
        TinyModule.load_from_checkpoint(path)
    assert str(info.value).startswith(f"{os.path.abspath(path)}: tensor "), str(info.value)


# -- one decode bound per load ------------------------------------------------------------------------------------


class _View:
    """Pickles as bytes ``[offset, offset + n)`` of the blob entry ``key`` (a view, as torch.load makes it)."""

    def __init__(self, key: _StorageKey, offset: int, n: int) -> None:
        self.key, self.offset, self.n = key, offset, n

    def __reduce__(self) -> tuple:
        return torch._utils._rebuild_tensor_v2, (self.key, self.offset, (self.n,), (1,), False, OrderedDict())


class _Call:
    def __init__(self, *args: object) -> None:
        self.args = args

    def __reduce__(self) -> tuple:
        return decode_tensor, self.args


@settings(max_examples=300, deadline=None)
@given(
    check=st.integers(0, (1 << 32) - 1),
    index=st.integers(0, 1 << 20),
    offset=st.integers(0, (1 << 48) - 1),
    shape=st.lists(st.integers(0, (1 << 48) - 1), max_size=6),
    strides=st.lists(st.integers(0, (1 << 48) - 1), max_size=6),
    flags=st.tuples(st.booleans(), st.booleans()),
    name=st.text(st.characters(exclude_categories=[])),
)
def test_a_tensor_s_check_is_the_crc_of_its_canonical_json(check, index, offset, shape, strides, flags, name):
    """tensor_check writes the JSON out itself (it runs for every tensor of a load): the same CRC-32 as the canonical
    JSON the format specifies, for any name (escapes, non-ASCII, lone surrogates) and any integers."""
    at = (index, offset, tuple(shape), tuple(strides), *flags, name)
    expected = schema.canonical_crc([check, index, offset, shape, strides, *flags, name])
    assert tensor_check({"check": check}, *at) == expected


def _raw_record(data: torch.Tensor) -> dict:
    """A valid raw record of the 1-D uint8 tensor ``data``'s bytes (one storage)."""
    n = data.numel()
    return schema.seal(
        {
            "format": schema.PLAIN_FORMAT,
            "dtype": "uint8",
            "nbytes": n,
            "planes": 1,
            "data_type": "|u1",
            "codecs": ["raw"],
            "chunk": n,
            "segment": n,
            "sizes": [n],
            "rotate": False,
            "crc32c": [crc32c.crc32c(data.numpy())],
            "nvcomp": None,
            "storages": [[0, n]],
            "device": "cpu",
        }
    )


def overlapping_views_file(path: Path, views: int, view_nbytes: int = 1 << 20) -> int:
    """A crafted checkpoint: one blob of ``view_nbytes + 16 * views`` random bytes, and ``views`` records, each a
    valid raw record of ``view_nbytes`` bytes over a view of that blob 16 bytes further on. Returns what decoding
    every record would produce, in bytes."""
    blob = random_tensor((view_nbytes + 16 * views,), torch.uint8, 1)
    key = _StorageKey("0", blob.numel())
    calls = []
    for k in range(views):
        view = blob[16 * k : 16 * k + view_nbytes]
        rec = _raw_record(view)
        at = Placement(0, 0, (view_nbytes,), (1,), False, False, f"t{k}")
        calls.append(_Call([_View(key, 16 * k, view_nbytes)], rec, *at, tensor_check(rec, *at)))
    pickled = io.BytesIO()
    _ArchivePickler(pickled, {}, {}).dump(calls)
    with open(path, "wb") as f:
        writer = ArchiveWriter(f)
        writer.add("data/0", blob.numpy())
        writer.add_torch_metadata()
        writer.add("data.pkl", pickled.getbuffer())
        writer.finish("data.pkl")
    return views * view_nbytes


@pytest.mark.parametrize("route", ["lightning_nvcomp.load", "torch.load", "torch.load(weights_only=False)"])
def test_crafted_overlapping_views_of_one_blob_are_refused_by_every_route(workdir, route):
    """A 1.2 MB file whose records all decode views of one blob: 320 MiB decoded, over the bound every route
    applies (16 x the file's size + 256 MiB = 275 MiB), not a bound that grows with each view."""
    decoded = overlapping_views_file(Path("bomb.ckpt"), views=320)
    size = os.path.getsize("bomb.ckpt")
    bound = fileformat.DECODE_MULTIPLE * size + fileformat.DECODE_ALLOWANCE
    assert size < 1_300_000 and decoded > bound
    with pytest.raises(DecodeLimitError) as info:
        if route == "lightning_nvcomp.load":
            lightning_nvcomp.load("bomb.ckpt")
        else:
            torch.load("bomb.ckpt", weights_only=route == "torch.load")
    message = str(info.value)
    assert f"over its limit of {bound} " in message, message
    assert "bomb.ckpt: tensor 't" in message


def test_the_crafted_file_loads_within_a_raised_bound(workdir):
    """The crafted records are valid: what refuses them is the bound alone."""
    overlapping_views_file(Path("small.ckpt"), views=3, view_nbytes=1 << 16)
    blob = random_tensor(((1 << 16) + 48,), torch.uint8, 1)
    for loaded in (lightning_nvcomp.load("small.ckpt"), torch.load("small.ckpt", weights_only=True)):
        assert [torch.equal(t, blob[16 * k : 16 * k + (1 << 16)]) for k, t in enumerate(loaded)] == [True] * 3


@pytest.mark.parametrize("route", ["lightning_nvcomp.load", "torch.load"])
def test_views_of_one_storage_decode_once_and_keep_sharing(workdir, route):
    w = random_tensor((64, 32), torch.float32, 2)
    state = {"w": torch.nn.Parameter(w), "w_t": w.t(), "row": w[5], "tail": w.view(-1)[100:]}
    lightning_nvcomp.save(state, Path("ckpts/views.ckpt"), codec="zstd")
    decoded: list[int] = []
    with fileformat.decode_progress(decoded.append):
        if route == "lightning_nvcomp.load":
            loaded = lightning_nvcomp.load("ckpts/views.ckpt")
        else:
            loaded = torch.load("ckpts/views.ckpt")
    assert decoded == [w.numel() * 4]
    assert len({t.untyped_storage().data_ptr() for t in loaded.values()}) == 1
    for key, value in state.items():
        assert tensor_bytes(loaded[key].detach()).numpy().tobytes() == tensor_bytes(value.detach()).numpy().tobytes()
        assert (loaded[key].stride(), loaded[key].storage_offset()) == (value.stride(), value.storage_offset())


def _file_whose_pickle_moves_a_blob(path: str, blob: torch.Tensor, move: bool) -> None:
    """Three tensors of 1 KiB: ``a`` from bytes 1-2 KiB of ``blob``, then ``b`` and ``c`` from one record of bytes
    0-1 KiB through one blob list; with ``move``, the pickle moves that list's blob onto bytes 1-2 KiB between ``b``
    and ``c`` (BUILD on a tensor, which torch's weights-only unpickler allows: ``set_``)."""
    key = _StorageKey("0", blob.numel())
    first, other = _View(key, 0, 1 << 10), _View(key, 1 << 10, 1 << 10)
    record, other_record = _raw_record(blob[: 1 << 10]), _raw_record(blob[1 << 10 : 2 << 10])
    at = [Placement(0, 0, (1 << 10,), (1,), False, False, name) for name in ("a", "b", "c")]
    blobs = [first]
    calls = [
        _Call([other], other_record, *at[0], tensor_check(other_record, *at[0])),
        _Call(blobs, record, *at[1], tensor_check(record, *at[1])),
        "move the blob",
        _Call(blobs, record, *at[2], tensor_check(record, *at[2])),
    ]
    out = io.BytesIO()
    pickler = _ArchivePickler(out, {}, {})
    pickler.dump(calls)
    memo = pickler.memo.copy()  # id -> (memo index, object): the tensors the views rebuild
    marker = b"X" + struct.pack("<I", len("move the blob")) + b"move the blob"
    pickled = out.getvalue()
    assert pickled.count(marker) == 1
    if move:  # first.set_(other), the tensor left in the list
        gets = [pickle.LONG_BINGET + struct.pack("<I", memo[id(view)][0]) for view in (first, other)]
        pickled = pickled.replace(marker, b"".join(gets) + pickle.TUPLE1 + pickle.BUILD)
    with open(path, "wb") as f:
        writer = ArchiveWriter(f)
        writer.add("data/0", blob.numpy())
        writer.add_torch_metadata()
        writer.add("data.pkl", pickled)
        writer.finish("data.pkl")


def test_a_blob_list_whose_tensor_the_pickle_moves_between_two_calls_is_checked_again(workdir):
    """Every tensor of a record gets the same blob list, checked once per load; a crafted pickle that moves a blob
    of that list onto other bytes between two calls does not reuse the first check: the record's CRC-32C meets the
    new bytes and the load fails as damaged. Unmoved, the same file loads bit-exactly."""
    blob = random_tensor((3 << 10,), torch.uint8, 3)
    _file_whose_pickle_moves_a_blob("kept.ckpt", blob, move=False)
    a, b, marker, c = lightning_nvcomp.load("kept.ckpt")
    assert marker == "move the blob"
    assert [t.numpy().tobytes() for t in (a, b, c)] == [blob[1 << 10 : 2 << 10].numpy().tobytes()] + [
        blob[: 1 << 10].numpy().tobytes()
    ] * 2
    _file_whose_pickle_moves_a_blob("moved.ckpt", blob, move=True)
    with pytest.raises(CorruptCheckpointError, match=r"moved\.ckpt: tensor 'c'.*checksum mismatch"):
        lightning_nvcomp.load("moved.ckpt")


# -- Python attributes of tensors and parameters ------------------------------------------------------------------


def with_attributes() -> dict:
    p = torch.nn.Parameter(random_tensor((8, 4), torch.bfloat16, 3))
    p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, 0, 1
    t = random_tensor((5,), torch.float32, 4)
    t.note, t.scales = "calibrated", random_tensor((5,), torch.float64, 5)
    return {"p": p, "t": t, "plain": random_tensor((3,), torch.int32, 6)}


def assert_same_attributes(loaded: dict, expected: dict) -> None:
    for key, value in expected.items():
        got = loaded[key]
        assert type(got) is type(value) and got.requires_grad == value.requires_grad, key
        assert tensor_bytes(got.detach()).numpy().tobytes() == tensor_bytes(value.detach()).numpy().tobytes(), key
        assert sorted(got.__dict__) == sorted(value.__dict__), key
        for name, attribute in value.__dict__.items():
            if isinstance(attribute, torch.Tensor):
                assert tensor_bytes(got.__dict__[name]).numpy().tobytes() == tensor_bytes(attribute).numpy().tobytes()
            else:
                assert got.__dict__[name] == attribute and type(got.__dict__[name]) is type(attribute), (key, name)


@pytest.mark.parametrize("loader", ["torch.load", "torch.load(weights_only=False)", "lightning_nvcomp.load"])
def test_tensor_and_parameter_attributes_are_kept_as_torch_save_keeps_them(workdir, loader):
    state = with_attributes()
    torch.save(state, "torch.pt")
    lightning_nvcomp.save(state, Path("ckpts/ours.ckpt"), codec="zstd")
    for path in ("torch.pt", "ckpts/ours.ckpt"):
        if loader == "lightning_nvcomp.load":
            loaded = lightning_nvcomp.load(path)
        else:
            loaded = torch.load(path, weights_only=loader == "torch.load")
        assert_same_attributes(loaded, state)
    assert verify("ckpts/ours.ckpt") == 0
    assert fileformat.describe("ckpts/ours.ckpt")["p"].name == "p"


def test_attributes_are_those_of_the_snapshot(tmp_path):
    """An async save's snapshot keeps the attributes as they were when it was taken, as it keeps the tensors."""
    state, expected = with_attributes(), with_attributes()
    snap = fileformat.snapshot(state, "zstd", isolate=True)
    state["p"].partition_dim = 1
    state["t"].note = "changed"
    state["t"].scales = torch.zeros(5, dtype=torch.float64)
    with open(tmp_path / "late.ckpt", "wb") as f:
        snap.write_to(ArchiveWriter(f))
    assert_same_attributes(torch.load(tmp_path / "late.ckpt", weights_only=True), expected)


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("loader", ["torch.load", "torch.load(weights_only=False)", "lightning_nvcomp.load"])
def test_the_v0_3_dev_files_with_attributes_and_a_nested_tensor_keep_loading(codec, loader):
    """Files written when attributes and nested tensors were first stored (``fixtures/make_v0_3_dev.py``)."""
    path = FIXTURES / "v0.3-dev" / f"{codec}.pt"
    if loader == "lightning_nvcomp.load":
        loaded = lightning_nvcomp.load(path)
    else:
        loaded = torch.load(path, weights_only=loader == "torch.load")
    assert digest(loaded) == json.loads((FIXTURES / "v0.3-dev" / "state.json").read_text())


# -- tensor kinds -----------------------------------------------------------------------------------------------


def canonical(value: object) -> object:
    """Everything a tensor (or storage) is, its bytes included, in comparable form."""
    if isinstance(value, torch.storage.TypedStorage):
        value = value.untyped()
    if isinstance(value, torch.UntypedStorage):
        return ("storage", torch.empty(0, dtype=torch.uint8).set_(value, 0, (value.nbytes(),), (1,)).numpy().tobytes())
    assert isinstance(value, torch.Tensor), type(value)
    if value.is_nested:  # its shape holds a symbol made afresh by each load (jagged layout): its parts say it
        head = (type(value).__name__, value.layout, value.dtype, value.dim(), value.requires_grad)
        return (*head, [canonical(part) for part in value.unbind()])
    head = (type(value).__name__, value.layout, value.dtype, tuple(value.shape), value.device.type, value.requires_grad)
    if isinstance(value, TwoTensor):
        return (*head, canonical(value.a), canonical(value.b))
    if value.device.type == "meta":
        return (*head, value.stride())
    if value.layout == torch.sparse_coo:
        return (*head, value.is_coalesced(), canonical(value._indices()), canonical(value._values()))
    if value.layout in (torch.sparse_csr, torch.sparse_bsr):
        return (*head, canonical(value.crow_indices()), canonical(value.col_indices()), canonical(value.values()))
    if value.layout in (torch.sparse_csc, torch.sparse_bsc):
        return (*head, canonical(value.ccol_indices()), canonical(value.row_indices()), canonical(value.values()))
    if value.is_quantized:
        if value.qscheme() == torch.per_tensor_affine:
            params: tuple = (value.q_scale(), value.q_zero_point())
        else:
            scales, zero_points = value.q_per_channel_scales(), value.q_per_channel_zero_points()
            params = (value.q_per_channel_axis(), canonical(scales), canonical(zero_points))
        return (*head, value.qscheme(), params, canonical(value.int_repr()))
    flags = (value.is_conj(), value.is_neg(), value.stride(), value.storage_offset())
    plain = value.detach().resolve_conj().resolve_neg()
    return (*head, *flags, tensor_bytes(plain).numpy().tobytes())


def _kinds() -> dict:
    gen = torch.Generator().manual_seed(7)
    dense = torch.randn(6, 5, generator=gen)
    dense[dense.abs() < 0.6] = 0
    complex_values = torch.randn(4, dtype=torch.complex64, generator=gen)
    uncoalesced = torch.sparse_coo_tensor(
        torch.tensor([[0, 2, 0], [1, 1, 1]]), torch.randn(3, 2, generator=gen), (3, 3, 2)
    )
    non_leaf = torch.randn(3, generator=gen, requires_grad=True) * 2
    return {
        "nested": torch.nested.nested_tensor([torch.randn(2, 3, generator=gen), torch.randn(4, 3, generator=gen)]),
        "nested jagged": torch.nested.nested_tensor(
            [torch.randn(2, 3, generator=gen), torch.randn(4, 3, generator=gen)], layout=torch.jagged
        ),
        "sparse coo": dense.to_sparse(),
        "sparse coo hybrid uncoalesced": uncoalesced,
        "sparse csr": dense.to_sparse_csr(),
        "sparse csc": dense.to_sparse_csc(),
        "sparse bsr": dense[:6, :4].to_sparse_bsr((2, 2)),
        "sparse bsc": dense[:6, :4].to_sparse_bsc((2, 2)),
        "quantized per tensor": torch.quantize_per_tensor(torch.randn(7, generator=gen), 0.05, 3, torch.qint8),
        "quantized per channel": torch.quantize_per_channel(
            torch.randn(3, 5, generator=gen),
            torch.rand(3, generator=gen).double() + 0.1,
            torch.tensor([0, 1, 2]),
            0,
            torch.quint8,
        ),
        "complex": complex_values,
        "complex32": random_tensor((5,), torch.complex32, 8),
        "conj view": complex_values.conj(),
        "neg view": complex_values.conj().imag,
        "meta": torch.empty(3, 4, device="meta").t(),
        "wrapper subclass": TwoTensor(torch.randn(3, generator=gen), torch.randn(3, generator=gen)),
        "float4_e2m1fn_x2": random_tensor((6,), torch.uint8, 9).view(torch.float4_e2m1fn_x2),
        "float8_e8m0fnu": random_tensor((6,), torch.float8_e8m0fnu, 10),
        "uint16 strided": random_tensor((4, 6), torch.uint16, 11)[:, ::2],
        "non-leaf requires_grad": non_leaf,
        "untyped storage": random_tensor((10,), torch.uint8, 12).untyped_storage(),
        "typed storage": torch.storage.TypedStorage(
            random_tensor((3,), torch.float64, 13).tolist(), dtype=torch.float64
        ),
    }


KINDS = _kinds()


@pytest.mark.parametrize("kind", list(KINDS))
def test_tensor_kinds_round_trip_bit_exactly_as_with_torch_save(workdir, kind):
    value = KINDS[kind]
    state = {"x": value, "dense": random_tensor((4, 4), torch.float32, 14)}
    torch.save(state, "torch.pt")
    lightning_nvcomp.save(state, Path("ckpts/ours.ckpt"), codec="zstd")
    expected = canonical(value)
    assert canonical(torch.load("torch.pt", weights_only=False)["x"]) == expected  # torch's own round trip
    assert canonical(torch.load("ckpts/ours.ckpt", weights_only=False)["x"]) == expected
    assert canonical(lightning_nvcomp.load("ckpts/ours.ckpt", weights_only=False)["x"]) == expected


def test_a_tensor_torch_cannot_pickle_is_refused_by_its_path_and_kind(workdir):
    state = {"layer": {"x": torch.randn(2, 3).to_mkldnn()}}
    with pytest.raises(NotImplementedError):
        torch.save(state, io.BytesIO())  # torch.save refuses it too
    with pytest.raises(
        CheckpointError, match=r"^tensor 'layer.x' \(Tensor of layout torch._mkldnn, dtype torch.float32"
    ):
        lightning_nvcomp.save(state, Path("ckpts/x.ckpt"), codec="zstd")
    assert not os.listdir("ckpts")


def test_tensors_made_while_pickling_keep_their_records_however_late_the_snapshot_is_written(tmp_path):
    """A sparse tensor's indices and values are new tensors each time it is pickled: those the snapshot planned must
    not lend their ids (and so their records) to those made when it is written, whatever was freed meanwhile."""
    for trial in range(10):
        indices = torch.tensor([[0, 1, 2], [2, 0, 1]]) + trial % 2
        sparse = torch.sparse_coo_tensor(indices, torch.tensor([1.5, -2.0, 3.25]), (4, 4))
        snap = fileformat.snapshot({"s": sparse, "x": torch.arange(10.0)}, "none", isolate=True)
        gc.collect()
        written = io.BytesIO()
        snap.write_to(ArchiveWriter(written))
        written.seek(0)
        assert canonical(torch.load(written, weights_only=True)["s"]) == canonical(sparse), trial


# -- zip headers ------------------------------------------------------------------------------------------------


def header_spans(data: bytes) -> dict[str, tuple[int, int]]:
    """Each header region of a zip: every entry's local header (``local <name>``), its data descriptor, if any,
    and the central directory with the end records: name -> (offset, length)."""
    spans = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            nlen, xlen = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
            spans[f"local {info.filename}"] = (info.header_offset, 30 + nlen + xlen)
            if info.flag_bits & 0x08:
                spans[f"descriptor {info.filename}"] = (info.header_offset + 30 + nlen + xlen + info.compress_size, 16)
        spans["central directory and end records"] = (archive.start_dir, len(data) - archive.start_dir)
    return spans


def assert_damage(path: str, data: bytes, offset: int, bit: int) -> None:
    """The file with one bit flipped fails ``lightning_nvcomp.load`` as damage naming it, and ``verify`` with 1."""
    damaged = bytearray(data)
    damaged[offset] ^= 1 << bit
    Path(path).write_bytes(bytes(damaged))
    with pytest.raises(CorruptCheckpointError) as info:
        lightning_nvcomp.load(path)
    assert str(info.value).startswith(path), (offset, bit, str(info.value))
    assert verify(path) == 1, (offset, bit)


@pytest.mark.parametrize("entry", ["archive/data/0", "archive/data.pkl"])
def test_each_bit_of_a_local_header_flipped_is_damage(workdir, entry):
    lightning_nvcomp.save(small_state(), Path("ckpts/ok.ckpt"), codec="zstd")
    data = Path("ckpts/ok.ckpt").read_bytes()
    start, length = header_spans(data)[f"local {entry}"]
    for offset in range(start, start + length):
        for bit in range(8):
            assert_damage("bad.ckpt", data, offset, bit)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, bytes]]:
    """A small checkpoint of ours and a plain torch.save one: their paths and bytes."""
    directory = tmp_path_factory.mktemp("headers")
    lightning_nvcomp.save(small_state(), directory / "ours.ckpt", codec="zstd")
    torch.save(small_state(), directory / "torch.pt")
    return {
        k: (str(directory / f"bad-{k}"), (directory / name).read_bytes())
        for k, name in (("ours", "ours.ckpt"), ("torch", "torch.pt"))
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_bit_of_any_zip_header_of_our_file_flipped_is_damage(checkpoints, data):
    path, good = checkpoints["ours"]
    offset, length = data.draw(st.sampled_from(sorted(header_spans(good).values())))
    assert_damage(path, good, data.draw(st.integers(offset, offset + length - 1)), data.draw(st.integers(0, 7)))


@pytest.mark.parametrize("region", ["local", "descriptor"])
def test_a_flipped_bit_in_a_plain_torch_save_file_s_local_headers_is_damage(checkpoints, region):
    path, good = checkpoints["torch"]
    for name, (offset, length) in header_spans(good).items():
        if name.startswith(f"{region} ") and name.endswith("data/0"):
            for byte in range(offset, offset + length):
                for bit in range(8):
                    assert_damage(path, good, byte, bit)


def test_a_plain_torch_save_entry_marked_as_a_directory_is_damage_not_other_bytes(checkpoints):
    """torch's reader reads nothing of an entry whose central record marks it as a directory (MS-DOS attribute
    0x10): the tensor came back holding other bytes, silently."""
    path, good = checkpoints["torch"]
    with zipfile.ZipFile(io.BytesIO(good)) as archive:
        records = good[archive.start_dir :]
        position = archive.start_dir
        for info in archive.infolist():
            if info.filename.endswith("/data/0"):
                break
            position += 46 + len(info.orig_filename.encode()) + len(info.extra) + len(info.comment)
    assert records[position - archive.start_dir : position - archive.start_dir + 4] == b"PK\x01\x02"
    assert_damage(path, good, position + 38, 4)


class _FailingFile(io.FileIO):
    """A file whose reads fail as a failing disk's do (EIO) once past its first ``good`` bytes."""

    def __init__(self, path: str, good: int) -> None:
        super().__init__(path, "rb")
        self.good = good

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self.tell() + len(buffer) > self.good:
            raise OSError(errno.EIO, "Input/output error")
        return super().readinto(buffer)


def test_a_read_error_while_the_headers_are_checked_is_not_damage(workdir):
    lightning_nvcomp.save(small_state(), Path("ckpts/ok.ckpt"), codec="zstd")
    size = os.path.getsize("ckpts/ok.ckpt")
    with _FailingFile("ckpts/ok.ckpt", size - 200) as f, pytest.raises(OSError) as info:
        fileformat.read(io.BufferedReader(f), "ckpts/ok.ckpt")
    assert not isinstance(info.value, CheckpointError) and info.value.errno == errno.EIO


@pytest.mark.parametrize("bit", range(16))
def test_a_flipped_bit_in_a_local_header_s_name_length_is_damage(workdir, bit):
    """The field torch's reader trusts to find an entry's data: a blob's bytes read from elsewhere, or none."""
    lightning_nvcomp.save(small_state(), Path("ckpts/ok.ckpt"), codec="zstd")
    data = Path("ckpts/ok.ckpt").read_bytes()
    start, _ = header_spans(data)["local archive/data/0"]
    assert_damage("bad.ckpt", data, start + 26 + bit // 8, bit % 8)


def test_verify_maps_a_machine_error_to_2(workdir):
    """Out of memory while decoding (a real allocation failure, under an address-space limit) is no damage."""
    lightning_nvcomp.save({"z": torch.zeros(50_000_000)}, Path("ckpts/zeros.ckpt"), codec="zstd")  # 200 MB raw
    proc = python_child(
        """
        import resource, sys
        from lightning_nvcomp.cli import main
        vm = int([line for line in open("/proc/self/status") if line.startswith("VmSize")][0].split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (100 << 20), resource.RLIM_INFINITY))
        sys.exit(main(["verify", "-q", sys.argv[1]]))
        """,
        str(workdir / "ckpts" / "zeros.ckpt"),
    )
    assert proc.returncode == 2, proc.stderr
    assert "allocate" in proc.stderr and "zeros.ckpt" in proc.stderr, proc.stderr
