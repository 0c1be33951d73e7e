"""Record format 3 (issue 35): a float's exponent whole in one plane (the top two planes rotated), every chunk coded
or kept raw by itself, literals-only zstd frames, CRC-32C checksums, and loads that decode each storage straight into
its own memory."""

from __future__ import annotations

import contextlib
import dataclasses
import zipfile
from collections.abc import Iterator

import crc32c
import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_nvcomp
from lightning_nvcomp.codec import checksum, delta, layouts, planes, record, schema, segment
from lightning_nvcomp.codec.cpu import CpuZstdEngine
from lightning_nvcomp.errors import CorruptCheckpointError

from tests.helpers.processes import CHILD_DIGEST_SRC, child_json, python_child, tensor_digest
from tests.helpers.states import special_floats, tensor_bytes, trained_like

SETTINGS = dict(max_examples=60, deadline=None)


@given(st.binary(min_size=0, max_size=512), st.sampled_from([2, 4, 8]))
def test_rotation_is_undone_bit_exactly(data, width):
    data = data[: len(data) // width * width]
    if not data:
        return
    before = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = planes.split(before, width)
    planes.rotate(rows)
    rotated = rows.clone()
    out = torch.empty_like(before)
    planes.join(list(rows), out, rotated=True)
    assert torch.equal(out, before) and torch.equal(rows, rotated)  # the planes are left as they are
    # out of place, from rows that stay as they are (a plane read where it lies in a read-only blob): the GPU's way
    top = torch.empty(2, rows.shape[1], dtype=torch.uint8)
    planes.unrotate(rows[-1], rows[-2], top[0], top[1])
    assert torch.equal(top[0], planes.split(before, width)[-1]) and torch.equal(top[1], planes.split(before, width)[-2])


@pytest.mark.parametrize("width", [2, 4, 8])
def test_rotated_planes_join_across_the_pair_slices(width):
    n = planes._PAIR_COLUMNS * 2 + 7
    before = torch.randint(0, 256, (n * width,), dtype=torch.uint8, generator=torch.Generator().manual_seed(width))
    rows = planes.split(before, width)
    planes.rotate(rows)
    out = torch.empty_like(before)
    planes.join(list(rows), out, rotated=True)
    assert torch.equal(out, before)


def test_the_byte_planes_c_module_is_built():
    """The package's own builds (an editable install, the wheel) carry the C passes: without them it runs numpy's,
    2-4x slower, and nothing else would tell."""
    assert planes._native is not None


@contextlib.contextmanager
def numpy_passes() -> Iterator[None]:
    native, planes._native = planes._native, None
    try:
        yield
    finally:
        planes._native = native


def test_without_the_c_module_the_same_files_are_written_and_read(tmp_path):
    """Where no C compiler built the module, numpy's passes write the files the C passes write, byte for byte, and
    read them back bit-exactly (a child process in which importing the module fails)."""
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64, torch.int64]
    state = {str(d): torch.cat([trained_like(50_000, d, seed=i), special_floats(d)]) for i, d in enumerate(dtypes[:4])}
    state["complex64"] = torch.complex(trained_like(20_000, torch.float32), trained_like(20_000, torch.float32, 1))
    state["int64"] = torch.arange(-30_000, 30_000, 7, dtype=torch.int64)
    torch.save(state, tmp_path / "state.pt")
    lightning_nvcomp.save(state, tmp_path / "c.ckpt", codec="zstd")
    code = (
        'import sys\nsys.modules["lightning_nvcomp.codec._planes"] = None  # importing it fails, as where it was not built\n'
        + CHILD_DIGEST_SRC
        + """
import json, lightning_nvcomp
from lightning_nvcomp.codec import planes
state = torch.load(sys.argv[1], weights_only=True)
lightning_nvcomp.save(state, sys.argv[2], codec="zstd")
back = lightning_nvcomp.load(sys.argv[3])
print(json.dumps({"native": planes._native is not None, "read": {k: tensor_digest(t) for k, t in back.items()}}))
"""
    )
    result = child_json(
        python_child(code, str(tmp_path / "state.pt"), str(tmp_path / "numpy.ckpt"), str(tmp_path / "c.ckpt"))
    )
    assert result["native"] is False
    assert result["read"] == {k: tensor_digest(t) for k, t in state.items()}
    with zipfile.ZipFile(tmp_path / "c.ckpt") as c, zipfile.ZipFile(tmp_path / "numpy.ckpt") as n:
        names = [name for name in c.namelist() if not name.endswith("serialization_id")]
        assert names == [name for name in n.namelist() if not name.endswith("serialization_id")]
        assert all(c.read(name) == n.read(name) for name in names)


@given(st.binary(min_size=0, max_size=600), st.sampled_from([2, 4, 8]), st.booleans(), st.integers(0, 5))
@settings(**SETTINGS)
def test_the_c_passes_split_and_join_as_numpy_s_do(data, width, rotated, margin):
    data = torch.frombuffer(bytearray(data[: len(data) // width * width]) or bytearray(1), dtype=torch.uint8)
    data = data[: data.numel() // width * width]
    n = data.numel() // width
    wide = torch.zeros(width, n + 2 * margin, dtype=torch.uint8)  # rows a column slice of a wider buffer
    planes.split_into(data.numpy(), wide[:, margin : margin + n].numpy(), rotated)
    with numpy_passes():
        expected = planes.split(data, width, rotated)
        joined = torch.empty_like(data)
        planes.join(list(expected), joined, rotated)
    assert torch.equal(wide[:, margin : margin + n], expected) and torch.equal(joined, data)
    assert not wide[:, :margin].any() and not wide[:, margin + n :].any()  # nothing written beside the rows
    out = torch.zeros(data.numel() + 2 * margin, dtype=torch.uint8)
    planes.join(list(wide[:, margin : margin + n]), out[margin : margin + data.numel()], rotated)
    assert (
        torch.equal(out[margin : margin + data.numel()], data)
        and not out[:margin].any()
        and not out[margin + data.numel() :].any()
    )


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 3)), min_size=1, max_size=6),
    st.sampled_from([1, 2, 4, 8]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
@settings(**SETTINGS)
def test_windows_split_together_as_each_splits_alone(runs, width, rotated, rng):
    """split_many's torch path (a GPU's: runs of one length in one copy) and its CPU path give each window's planes as
    split gives them, one window after the other; a window of bytes that are not whole numbers gets one plane."""
    lengths = [length * 8 + (3 if rng.random() < 0.2 else 0) for length, repeat in runs for _ in range(repeat)]
    data = torch.frombuffer(bytearray(rng.randbytes(sum(lengths) + 16)), dtype=torch.uint8)
    windows = list(data[16:].split(lengths))
    expected = torch.cat(
        [planes.split(w, width if w.numel() % width == 0 else 1, rotated).reshape(-1) for w in windows]
    )
    flat, widths = planes.split_many(windows, width, rotated)
    torched = torch.empty_like(flat)
    planes._split_runs(windows, widths, rotated, torched)
    assert torch.equal(flat, expected) and torch.equal(torched, expected)
    assert widths == [width if n % width == 0 else 1 for n in lengths]


@given(
    st.binary(min_size=0, max_size=400),
    st.binary(min_size=400, max_size=400),
    st.sampled_from([(2, 2), (4, 4), (8, 8), (4, 2), (8, 4)]),
    st.sampled_from(["xor", "sub"]),
    st.booleans(),
)
@settings(**SETTINGS)
def test_a_join_that_undoes_a_transform_gives_the_bytes_it_was_made_from(data, base, sizes, transform, rotated):
    """``join(..., undoing=)`` turns bytes a delta transform made against the joined numbers back into the bytes they
    were made from, in the C pass (the transform's numbers as wide as the planes' or, for XOR, any) and in numpy's,
    for every byte, NaN payloads and wrapping sums included."""
    width, itemsize = sizes
    n = len(data) // width * width
    original = torch.frombuffer(bytearray(data[:n]) or bytearray(width), dtype=torch.uint8)[:n]
    base_bytes = torch.frombuffer(bytearray(base[:n]) or bytearray(width), dtype=torch.uint8)[:n]
    rows = planes.split(base_bytes, width, rotated) if n else torch.zeros(width, 0, dtype=torch.uint8)
    for passes in (contextlib.nullcontext, numpy_passes):
        made = torch.empty_like(original)
        delta.apply(transform, original, base_bytes, itemsize, made)
        with passes():
            planes.join(list(rows), made, rotated, undoing=(transform, itemsize))
        assert made.numpy().tobytes() == original.numpy().tobytes()


def test_planes_that_are_not_contiguous_join_through_numpy():
    data = torch.arange(64, dtype=torch.uint8).repeat(4)
    rows = planes.split(data, 4, rotated=True)
    strided = torch.zeros(4, 2 * rows.shape[1], dtype=torch.uint8)
    strided[:, ::2] = rows
    out = torch.empty_like(data)
    planes.join([row[::2] for row in strided], out, rotated=True)
    assert torch.equal(out, data)


def test_the_c_join_refuses_planes_that_do_not_fill_the_buffer():
    rows = torch.zeros(4, 10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="4 planes of 10 bytes do not join into 44 bytes"):
        planes.join(list(rows), torch.empty(44, dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not join"):
        planes.join([*rows[:3], rows[3, :9]], torch.empty(40, dtype=torch.uint8))
    with pytest.raises(ValueError, match="39 bytes do not split into 4 rows of 10"):
        planes.split_into(np.zeros(39, np.uint8), rows.numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_top_plane_is_the_exponent_and_the_sign_sits_below_it(dtype):
    x = torch.cat([trained_like(4096, dtype), special_floats(dtype)])
    rows = planes.split(tensor_bytes(x), x.element_size())
    planes.rotate(rows)
    bits = x.view(torch.int32 if dtype == torch.float32 else torch.int16).to(torch.int64)
    top = (bits >> (23 if dtype == torch.float32 else 7)) & 0xFF
    sign = (bits < 0).to(torch.uint8)
    assert torch.equal(rows[-1].to(torch.int64), top) and torch.equal(rows[-2] & 1, sign)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64, torch.float8_e5m2]
)
def test_floats_code_rotated_and_round_trip_with_their_specials(dtype):
    base = torch.float32 if dtype.is_complex else dtype
    if dtype.is_complex:
        x = torch.complex(trained_like(20000, torch.float32, 1), trained_like(20000, torch.float32, 2))
    elif dtype.itemsize == 1:
        x = (trained_like(20000, torch.float32, 1) * 400).to(dtype)
    else:
        x = torch.cat([trained_like(20000, base, 1), special_floats(base)])
    data = tensor_bytes(x)
    blobs, meta = record.encode(data, dtype, "zstd")
    assert meta["format"] == 3 and meta["rotate"] is (planes.plane_width(dtype) > 1)
    assert meta["crc32c"] == [crc32c.crc32c(b.numpy()) for b in blobs] and "crc32" not in meta
    assert torch.equal(record.decode(blobs, meta), data)


def test_the_exponent_plane_codes_smaller_rotated():
    x = tensor_bytes(trained_like(1 << 18, torch.bfloat16, 3))
    rotated = sum(b.numel() for b in record.encode(x, torch.bfloat16, "zstd")[0])
    plain_layout = schema.Layout(2, ("zstd", "zstd"), "|u1", 1 << 20, False)
    plain = sum(b.numel() for b in record.encode(x, torch.bfloat16, "zstd", layout=plain_layout)[0])
    assert rotated < plain * 0.99, (rotated, plain)


def test_literal_frames_are_standard_zstd_frames_that_declare_their_size():
    engine = CpuZstdEngine(threads=1)
    exponents = planes.split(tensor_bytes(trained_like(1 << 18, torch.float32)), 4)
    planes.rotate(exponents)
    chunk = exponents[3].contiguous()
    frame = engine._literal_coders()[0].compress(chunk.numpy())
    assert frame.numel() < chunk.numel() // 3
    raw = frame.numpy().tobytes()
    assert zstandard.frame_content_size(raw) == chunk.numel()
    assert zstandard.ZstdDecompressor().decompress(raw) == chunk.numpy().tobytes()


def test_a_chunk_with_repeats_keeps_the_match_finder_s_frame():
    """Literals alone cannot code a repeated row below ~1 bit per byte; matches can, and the smaller frame is kept."""
    engine = CpuZstdEngine(threads=1)
    row = np.frombuffer(np.random.default_rng(0).bytes(4096), dtype=np.uint8) % 16
    chunk = np.tile(row, 256)
    coded = engine._encode_one(chunk)
    assert coded.numel() < chunk.size // 50
    assert zstandard.ZstdDecompressor().decompress(coded.numpy().tobytes()) == chunk.tobytes()


@pytest.mark.parametrize("layout", ["planes", "raw"])
def test_decode_into_fills_each_target_with_exactly_its_bytes(layout):
    data = tensor_bytes(trained_like(300_000, torch.float32, 4))
    chosen = None if layout == "planes" else layouts.raw_layout()
    blobs, meta = record.encode(data, torch.float32, "zstd" if layout == "planes" else "raw", 1 << 19, chosen)
    spans = [(0, 4096), (4096 + 64, 700_000), (800_000, 400_000)]  # across segments, with bytes between
    targets = [(start, torch.full((n,), 0xAB, dtype=torch.uint8)) for start, n in spans]
    record.decode_into(blobs, meta, targets)
    for (start, n), (_, out) in zip(spans, targets):
        assert torch.equal(out, data[start : start + n])


@pytest.mark.parametrize("parallel", [True, False])
def test_a_damaged_segment_is_named_whether_checked_on_its_thread_or_before(parallel):
    """On the CPU's segment threads each segment is checked right before it is decoded, else all first: either way a
    flipped bit in a raw plane of a later segment (which would decode without complaint) fails naming that segment."""
    data = tensor_bytes(trained_like(600_000, torch.float32, 5))
    blobs, meta = record.encode(data, torch.float32, "zstd", 1 << 19)
    assert len(blobs) >= 4
    blobs = [b.clone() for b in blobs]
    blobs[2][40] ^= 1  # the segment's lowest plane, first in its blob: noise, stored raw
    out = torch.empty_like(data)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch in segment 2 of the record"):
        record.decode_into(blobs, meta, [(0, out)], parallel=parallel)
    record.decode_into(blobs, meta, [(0, out[: 1 << 19])], parallel=parallel)  # segment 0 alone: intact
    assert torch.equal(out[: 1 << 19], data[: 1 << 19])


@settings(**SETTINGS)
@given(st.integers(0, 700_000), st.lists(st.integers(0, 700_000), max_size=8), st.integers(0, 2**32 - 1))
def test_copy_checked_copies_the_pieces_and_checksums_all_the_bytes(nbytes, cuts, seed):
    """The pieces get their bytes and the CRC is that of every stored byte, those between and after the pieces
    included, over windows of any alignment, pieces that overlap included."""
    stored = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8))
    bounds = sorted({min(c, nbytes) for c in cuts})
    spans = [(a, b - a) for a, b in zip(bounds[::2], bounds[1::2])]  # every other gap is left out
    spans += [(a + (b - a) // 3, (b - a) // 3) for a, b in zip(bounds, bounds[1:])]  # and pieces that overlap them
    pieces = [(at, torch.full((n,), 0xAB, dtype=torch.uint8)) for at, n in reversed(spans)]  # any order
    assert checksum.copy_checked(stored, pieces, "crc32c") == crc32c.crc32c(stored.numpy().tobytes())
    for at, out in pieces:
        assert torch.equal(out, stored[at : at + out.numel()])


@pytest.mark.parametrize("where", ["copied", "between pieces", "padding"])
def test_bytes_stored_as_they_are_are_checked_as_they_are_copied(where):
    """A raw record's segments are checked as they are copied on the segment threads: a flipped bit in bytes a piece
    receives, in bytes between pieces, or in a blob's padding fails naming the segment."""
    data = tensor_bytes(trained_like(300_001, torch.float32, 5))
    blobs, meta = record.encode(data, torch.uint8, "raw", 1 << 19)
    assert len(blobs) >= 3 and blobs[-1].numel() > data.numel() - 2 * (1 << 19)  # the last blob is padded
    segment, pos = {"copied": (1, 100), "between pieces": (1, 5000), "padding": (len(blobs) - 1, -1)}[where]
    blobs = [b.clone() for b in blobs]
    blobs[segment][pos] ^= 1
    spans = [(0, 4096), ((1 << 19) + 8192, 1 << 19)]  # leaves out segment 1's first 8192 bytes (its byte 5000)
    targets = [(at, torch.empty(n, dtype=torch.uint8)) for at, n in spans]
    if where == "padding":
        targets.append((data.numel() - 64, torch.empty(64, dtype=torch.uint8)))
    with pytest.raises(CorruptCheckpointError, match=f"checksum mismatch in segment {segment} of the record"):
        record.decode_into(blobs, meta, targets)


def test_decode_into_refuses_a_target_that_splits_a_number():
    data = tensor_bytes(trained_like(4096, torch.float32))
    blobs, meta = record.encode(data, torch.float32, "zstd")
    with pytest.raises(CorruptCheckpointError, match="4-byte numbers"):
        record.decode_into(blobs, meta, [(2, torch.empty(64, dtype=torch.uint8))])


def test_decode_segment_reads_raw_planes_where_they_lie():
    """A plane stored raw whole is joined from the blob itself: the blob is never written to."""
    data = tensor_bytes(trained_like(1 << 16, torch.float32, 5))
    blobs, meta = record.encode(data, torch.float32, "zstd")
    blob = blobs[0].clone()
    blob.requires_grad_(False)
    frozen = blob.clone()
    out = torch.empty_like(data)
    engine = CpuZstdEngine(threads=1)
    segment.decode_segment(engine, blob, meta["sizes"], [(0, out)], out.numel(), schema.Layout.of(meta))
    assert torch.equal(out, data) and torch.equal(blob, frozen)


def test_decode_segment_decodes_only_the_chunks_its_pieces_lie_in():
    """A piece of a segment costs the chunks it lies in (a delta's base needs only its transformed storages): the
    chunks past it are not decoded, so their damage does not show, while a decode that needs them fails on it."""
    data = tensor_bytes(trained_like(1 << 18, torch.float32, 7))  # 1 MiB: 4 planes of 256 Ki columns
    layout = layouts.plane_layout(CpuZstdEngine(threads=1), data.numel(), torch.float32, "zstd")
    layout = dataclasses.replace(layout, chunk=64 << 10)  # 4 chunks a plane
    blobs, meta = record.encode(data, torch.float32, "zstd", layout=layout)
    blob, sizes = blobs[0].clone(), meta["sizes"]
    starts = [sum(schema._padded(n) for n in sizes[:i]) for i in range(len(sizes))]
    for plane in range(4):  # the last chunk of every plane damaged
        at = starts[plane * 4 + 3]
        blob[at : at + sizes[plane * 4 + 3]] = 0x5A
    engine = CpuZstdEngine(threads=1)
    first = torch.empty(1 << 18, dtype=torch.uint8)  # the first quarter: columns [0, 64 Ki), chunk 0 of each plane
    segment.decode_segment(engine, blob, sizes, [(0, first)], data.numel(), layout)
    assert torch.equal(first, data[: 1 << 18])
    with pytest.raises(ValueError):
        segment.decode_segment(engine, blob, sizes, [(0, torch.empty_like(data))], data.numel(), layout)


def test_loaded_tensors_of_one_record_have_memory_of_their_own(tmp_path, monkeypatch):
    """Tensors of a record of many storages come back each in memory of its own, exactly its bytes (a kept tensor must
    not hold the others alive), decoded there without a second copy."""
    monkeypatch.chdir(tmp_path)
    state = {f"t{i}": trained_like(1000 + 64 * i, torch.float32, i) for i in range(6)}
    lightning_nvcomp.save(state, "group.ckpt")
    loaded = lightning_nvcomp.load("group.ckpt")
    for name, tensor in state.items():
        assert loaded[name].untyped_storage().nbytes() == tensor.nbytes
        assert torch.equal(tensor_bytes(loaded[name]), tensor_bytes(tensor))
    pointers = {t.untyped_storage().data_ptr() for t in loaded.values()}
    assert len(pointers) == len(state)


@pytest.mark.parametrize(
    ("map_location", "expected"),
    [
        ("cuda", "cuda"),
        ("cuda:1", "cuda:1"),
        (torch.device("cuda", 0), "cuda:0"),
        ("cpu", None),
        (None, None),
        ({"cuda:0": "cpu"}, None),
        (lambda storage, location: storage, None),
        ("not a device", None),
    ],
)
def test_a_load_onto_one_gpu_keeps_the_blobs_in_host_memory(map_location, expected):
    from lightning_nvcomp.format.reader import _one_device

    device = _one_device(map_location)
    assert (None if device is None else str(device)) == expected


@pytest.mark.parametrize("codec", ["zstd", "raw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_a_buffer_given_in_parts_codes_as_its_concatenation(codec, dtype):
    """A record's storages are coded without joining them first: the same blobs and record as the joined buffer's,
    across segment boundaries that fall inside a part and between parts."""
    parts = [
        tensor_bytes(
            trained_like(n, torch.float32, seed).to(dtype) if dtype.is_floating_point else torch.arange(n).to(dtype)
        )
        for seed, n in enumerate([70_000, 64, 3_000, 131_072])
    ]
    parts.insert(1, torch.zeros(64, dtype=torch.uint8))
    joined = torch.cat(parts)
    blobs, meta = record.encode(joined, dtype, codec, segment=1 << 17)
    parted_blobs, parted_meta = record.encode(parts, dtype, codec, segment=1 << 17)
    assert len(blobs) >= 2 and parted_meta == meta
    assert all(torch.equal(a, b) for a, b in zip(blobs, parted_blobs))
    assert torch.equal(record.decode(parted_blobs, parted_meta), joined)


def test_parts_slice_crosses_parts_and_skips_empty_ones():
    parts = segment.Parts(
        [torch.arange(5, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8), torch.arange(5, 9, dtype=torch.uint8)]
    )
    assert parts.nbytes == 9
    assert [p.tolist() for p in parts.slice(3, 4)] == [[3, 4], [5, 6]]
    assert [p.tolist() for p in parts.slice(5, 4)] == [[5, 6, 7, 8]]
    assert parts.slice(9, 0) == []
