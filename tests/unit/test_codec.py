"""Record level: byte planes, entropy estimates, encode/decode round trips, and validation of record dicts."""

from __future__ import annotations

import copy
import math
import zlib

import crc32c
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_nvcomp.codec import batch, checksum, engines, layouts, planes, record, schema, segment
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.errors import (
    CheckpointError,
    CodecUnavailableError,
    CorruptCheckpointError,
    UnsupportedFormatError,
)
from lightning_nvcomp.format import DTYPES

from tests.helpers.states import (
    FLOAT_DTYPES_WITH_SPECIALS,
    assert_bit_exact,
    random_tensor,
    special_floats,
    tensor_bytes,
    trained_like,
)

SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
CPU_CODECS = ("zstd", "raw")
#: Small segment/chunk sizes that keep the validator's rules (segment % (64 * planes), chunk % 64) and make a
#: few hundred bytes span several segments, planes and chunks.
SMALL_LAYOUTS = [(512, 64), (1024, 128), (4096, 64), (512, 512)]

no_gpu = pytest.mark.skipif(gpu_available(), reason="checks the behaviour of a machine without a usable GPU")


def sizes_of(blobs: list[torch.Tensor]) -> list[int]:
    return [b.numel() for b in blobs]


def roundtrip(data: torch.Tensor, dtype: torch.dtype, codec: str) -> tuple[list[torch.Tensor], dict, torch.Tensor]:
    """Encode, validate, decode; assert the bytes come back exactly. Returns (blobs, meta, decoded)."""
    blobs, meta = record.encode(data, dtype, codec)
    assert isinstance(blobs, list) and len(blobs) == len(meta["crc32c"])
    for blob in blobs:
        assert blob.dtype == torch.uint8 and blob.dim() == 1 and blob.device.type == "cpu"
    schema.validate(copy.deepcopy(meta), sizes_of(blobs))  # what encode writes, decode must accept
    out = record.decode(blobs, copy.deepcopy(meta), "cpu")
    assert out.dtype == torch.uint8 and out.dim() == 1 and out.device.type == "cpu"
    assert torch.equal(out, data), "decoded bytes differ from the encoded ones"
    return blobs, meta, out


def stored_nbytes(blobs: list[torch.Tensor]) -> int:
    return sum(sizes_of(blobs))


def small_layout(mp: pytest.MonkeyPatch, segment: int, chunk: int) -> None:
    mp.setattr(engines, "SEGMENT_NBYTES", segment)
    for key in list(layouts.CHUNK_NBYTES):
        mp.setitem(layouts.CHUNK_NBYTES, key, chunk)


def data_bytes(kind: str, nbytes: int, seed: int) -> torch.Tensor:
    """``nbytes`` bytes of one statistical kind: noise, constant, few symbols, or trained-like floats."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        arr = rng.integers(0, 256, nbytes, dtype=np.uint8)
    elif kind == "constant":
        arr = np.full(nbytes, rng.integers(0, 256), dtype=np.uint8)
    elif kind == "few":
        arr = rng.choice(np.array([0, 1, 0x3F, 0xBF, 0xFF], dtype=np.uint8), nbytes)
    else:  # float32 weights with small magnitude: low-entropy exponent planes, noisy mantissas
        floats = (rng.standard_normal(-(-nbytes // 4)) * 0.02).astype(np.float32)
        arr = floats.view(np.uint8)[:nbytes]
    return torch.from_numpy(arr.copy())


# --------------------------------------------------------------------------------------------------- helpers


def test_assert_bit_exact_sees_nan_payload_and_signed_zero():
    a = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    b = torch.tensor([0x7FC00002], dtype=torch.int32).view(torch.float32)
    assert_bit_exact(a, a.clone())
    with pytest.raises(AssertionError, match="bytes differ"):
        assert_bit_exact(a, b)
    with pytest.raises(AssertionError, match="bytes differ"):
        assert_bit_exact(torch.tensor(0.0), torch.tensor(-0.0))


def test_assert_bit_exact_checks_dtype_shape_stride():
    t = torch.arange(6.0).reshape(2, 3)
    with pytest.raises(AssertionError, match="stride"):
        assert_bit_exact(t.t(), t.t().contiguous())
    with pytest.raises(AssertionError, match="shape"):
        assert_bit_exact(t, t.reshape(3, 2))
    with pytest.raises(AssertionError, match="dtype"):
        assert_bit_exact(t, t.double())
    with pytest.raises(AssertionError, match="type"):
        assert_bit_exact(torch.nn.Parameter(t), t, check_type=True)
    # Non-contiguous, 0-d, empty and complex tensors compare by their logical elements.
    assert_bit_exact(t.t(), t.clone().t())
    assert_bit_exact(torch.tensor(1.5), torch.tensor(1.5))
    assert_bit_exact(torch.empty(0, 3), torch.empty(0, 3))
    c = torch.randn(4, dtype=torch.complex128)
    assert_bit_exact(c[::2], c.clone()[::2])


# ---------------------------------------------------------------------------------------------- byte planes


@SETTINGS
@given(width=st.sampled_from([1, 2, 4, 8]), n=st.integers(0, 700), seed=st.integers(0, 2**32 - 1))
def test_planes_split_join_inverse(width, n, seed):
    data = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, width * n, dtype=np.uint8))
    split = planes.split(data, width)
    assert tuple(split.shape) == (width, n)
    for k in range(width):  # plane k holds byte k of every number
        assert torch.equal(split[k], data.view(-1, width)[:, k])
    out = torch.full((width * n,), 0xA5, dtype=torch.uint8)
    planes.join(split, out)
    assert torch.equal(out, data)


def test_plane_width_matches_scalar_size():
    for name, dtype in DTYPES.items():
        width = planes.plane_width(dtype)
        scalar = dtype.itemsize // 2 if dtype.is_complex else dtype.itemsize
        assert width in (1, scalar), name
        assert dtype.itemsize % width == 0, name


def test_sampled_entropy_bits_of_uniform_constant_and_two_symbols():
    uniform = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
    assert 7.98 < planes.sampled_entropy_bits(uniform) <= 8.0
    assert planes.sampled_entropy_bits(uniform) >= planes.RAW_ENTROPY_BITS
    assert planes.sampled_entropy_bits(np.full(4096, 7, dtype=np.uint8)) == 0.0
    assert planes.sampled_entropy_bits(np.empty(0, dtype=np.uint8)) == 0.0
    assert math.isclose(planes.sampled_entropy_bits(np.arange(1 << 16, dtype=np.uint8) % 2), 1.0, abs_tol=1e-9)


# ---------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", CPU_CODECS)
@pytest.mark.parametrize("name", list(DTYPES))
def test_roundtrip_every_dtype(name, codec):
    dtype = DTYPES[name]
    for numel in (0, 1, 3, 1000, 4097):
        t = random_tensor((numel,), dtype, seed=numel)
        roundtrip(tensor_bytes(t), dtype, codec)
    t = trained_like(5000, torch.float32).view(torch.uint8)
    t = t[: t.numel() // dtype.itemsize * dtype.itemsize]
    roundtrip(t.clone(), dtype, codec)


@pytest.mark.parametrize("codec", CPU_CODECS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES_WITH_SPECIALS, ids=str)
def test_roundtrip_special_values(dtype, codec):
    specials = special_floats(dtype)
    # alone, and mixed into trained-like data so that the coded (not the raw) path carries them
    roundtrip(tensor_bytes(specials), dtype, codec)
    body, sp = tensor_bytes(trained_like(3000, dtype)), tensor_bytes(specials)
    cut = 1234 * dtype.itemsize
    mixed = torch.cat([body[:cut], sp, body[cut:], sp]).view(dtype)  # cat on bytes: float8 has no CPU cat
    _, _, out = roundtrip(tensor_bytes(mixed).clone(), dtype, codec)
    assert_bit_exact(out.view(dtype), mixed)


def test_roundtrip_nan_payloads_exact_values():
    nans = torch.tensor([0x7FC00001, 0xFFC12345 - (1 << 32)], dtype=torch.int32)
    data = torch.cat([nans, torch.zeros(2000, dtype=torch.int32), nans]).view(torch.float32)
    for codec in CPU_CODECS:
        _, _, out = roundtrip(data.view(torch.uint8).clone(), torch.float32, codec)
        got = out.view(torch.int32)
        assert got[0].item() == 0x7FC00001 and got[1].item() == 0xFFC12345 - (1 << 32)
        assert got[-2].item() == 0x7FC00001 and got[-1].item() == 0xFFC12345 - (1 << 32)


@SETTINGS
@given(
    name=st.sampled_from(sorted(DTYPES)),
    codec=st.sampled_from(CPU_CODECS),
    numel=st.one_of(st.integers(0, 5), st.integers(0, 3000), st.sampled_from([63, 64, 65, 127, 128, 129, 511, 513])),
    kind=st.sampled_from(["random", "constant", "few", "trained"]),
    layout=st.sampled_from(SMALL_LAYOUTS),
    seed=st.integers(0, 2**32 - 1),
)
def test_roundtrip_multi_segment_multi_chunk(name, codec, numel, kind, layout, seed):
    dtype = DTYPES[name]
    segment, chunk = layout
    data = data_bytes(kind, numel * dtype.itemsize, seed)
    with pytest.MonkeyPatch.context() as mp:
        small_layout(mp, segment, chunk)
        blobs, meta, _ = roundtrip(data, dtype, codec)
    # The record describes what was asked for: its layout and one checksum per segment.
    assert meta["nbytes"] == data.numel() and meta["dtype"] == name
    assert meta["segment"] == segment and meta["chunk"] == chunk
    assert len(meta["crc32c"]) == -(-data.numel() // segment)
    assert len(meta["codecs"]) == meta["planes"]
    if codec == "raw":
        assert set(meta["codecs"]) == {"raw"} and stored_nbytes(blobs) >= data.numel()


@SETTINGS
@given(
    nbytes=st.integers(0, 2000),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_roundtrip_byte_counts_not_a_multiple_of_the_plane_width(nbytes, dtype, seed):
    data = data_bytes("few", nbytes, seed)
    with pytest.MonkeyPatch.context() as mp:
        small_layout(mp, 4096, 64)
        _, meta, _ = roundtrip(data, dtype, "zstd")
    if nbytes % planes.plane_width(dtype):
        assert meta["planes"] == 1


def test_roundtrip_default_layout_large_enough_for_several_chunks():
    data = tensor_bytes(trained_like(1_200_000, torch.float32))  # 4.8 MB: planes of 1.2 MB, 2 chunks of <= 1 MiB
    blobs, meta, _ = roundtrip(data, torch.float32, "zstd")
    assert meta["planes"] == 4 and len(meta["sizes"]) == 4 * 2 and len(blobs) == 1 and len(meta["crc32c"]) == 1


def test_decode_to_torch_device_object():
    data = tensor_bytes(trained_like(1000, torch.bfloat16))
    blobs, meta = record.encode(data, torch.bfloat16, "zstd")
    assert torch.equal(record.decode(blobs, meta, torch.device("cpu")), data)


# --------------------------------------------------------------------------------------------- compression


def raw_chunks(meta: dict, plane: int) -> list[bool]:
    """Whether each chunk of ``plane`` of a one-segment record is stored raw (its stored size is its raw size)."""
    per_plane = len(meta["sizes"]) // meta["planes"]
    n = meta["nbytes"] // meta["planes"]
    lengths = [min(meta["chunk"], n - j) for j in range(0, n, meta["chunk"])]
    return [size == raw for size, raw in zip(meta["sizes"][plane * per_plane : (plane + 1) * per_plane], lengths)]


def test_trained_bfloat16_compresses_and_noise_planes_are_raw():
    data = tensor_bytes(trained_like(1 << 18, torch.bfloat16))
    blobs, meta, _ = roundtrip(data, torch.bfloat16, "zstd")
    assert meta["planes"] == 2 and meta["rotate"] is True
    ratio = data.numel() / stored_nbytes(blobs)
    assert ratio > 1.1, ratio
    # rotated: the low plane (7 mantissa bits + the sign) is noise, stored raw; the exponent plane is coded
    assert all(raw_chunks(meta, 0)) and not any(raw_chunks(meta, 1)), meta["sizes"]


def test_trained_float32_noise_planes_raw_exponent_plane_coded():
    data = tensor_bytes(trained_like(1 << 18, torch.float32))
    blobs, meta, _ = roundtrip(data, torch.float32, "zstd")
    assert meta["planes"] == 4 and meta["rotate"] is True
    # mantissa planes are noise: stored raw; the exponent plane is coded
    assert all(raw_chunks(meta, 0)) and all(raw_chunks(meta, 1)) and not any(raw_chunks(meta, 3)), meta["sizes"]
    assert data.numel() / stored_nbytes(blobs) > 1.1


def test_random_bytes_stored_raw_and_not_expanded_much():
    data = data_bytes("random", 1 << 18, 3)
    blobs, meta, _ = roundtrip(data, torch.float32, "zstd")
    assert all(all(raw_chunks(meta, k)) for k in range(meta["planes"]))
    assert stored_nbytes(blobs) <= data.numel() * 1.01


def test_each_chunk_is_coded_or_raw_by_itself():
    """One record, noise then a low-entropy run in the same plane: the noise chunks stay raw and the others are coded
    (the choice is per chunk, not per plane or record)."""
    noise = data_bytes("random", 4 << 20, 5)  # plane 0's first 1 MiB chunk
    low = tensor_bytes((torch.arange(1 << 20) % 7).to(torch.float32))  # its second
    data = torch.cat([noise, low])
    blobs, meta, _ = roundtrip(data, torch.float32, "zstd")
    flags = raw_chunks(meta, 0)
    assert flags[0] and not flags[-1], meta["sizes"]


def test_constant_data_compresses_enormously():
    data = torch.zeros(1 << 20, dtype=torch.uint8)
    blobs, _, _ = roundtrip(data, torch.float32, "zstd")
    assert stored_nbytes(blobs) * 100 < data.numel()


# ----------------------------------------------------------------------------------------------- validation


@pytest.fixture(scope="module")
def valid_record():
    """A real multi-segment, multi-chunk record with coded and raw planes (small layout), rotated."""
    data = tensor_bytes(trained_like(3000, torch.float32))
    with pytest.MonkeyPatch.context() as mp:
        small_layout(mp, 4096, 512)
        layout = schema.Layout(4, ("raw", "raw", "zstd", "zstd"), "|u1", 512, True)
        blobs, meta = record.encode(data, torch.float32, "zstd", layout=layout)
    assert len(meta["crc32c"]) >= 2 and len(meta["sizes"]) > len(meta["crc32c"]) * 4
    assert "zstd" in meta["codecs"] and "raw" in meta["codecs"]
    return data, blobs, meta


def test_valid_record_validates_and_decodes(valid_record):
    data, blobs, meta = valid_record
    schema.validate(copy.deepcopy(meta), sizes_of(blobs))
    assert torch.equal(record.decode(blobs, copy.deepcopy(meta)), data)


def test_describe_checks_each_record_by_its_own_fields():
    """``describe`` builds the check of fields alike across records once per kind: each record's check is still
    the one its own fields give, for records alike but for their sizes and CRCs, and for added fields that compare
    equal but differ in JSON (``True`` and ``1``)."""
    coding = record.Coding(torch.float32, 512, schema.Layout(1, ("raw",), "|u1", 1 << 20), 1 << 24)
    metas = [
        record.describe(coding, [512], [crc], storages=[[0, 512]], device="cpu", flag=flag)
        for crc in (1, 2)
        for flag in (True, 1, [1], None)
    ]
    for meta in metas:
        assert meta["check"] == schema.record_check({k: v for k, v in meta.items() if k != "check"})
    assert len({meta["check"] for meta in metas}) == len(metas)


def mutated(meta: dict, **changes) -> dict:
    """``meta`` with ``changes``, its own check forged to match (so that validation itself is what is tested)."""
    out = copy.deepcopy(meta)
    for key, value in changes.items():
        if value is KeyError:
            del out[key]
        else:
            out[key] = value(out) if callable(value) else value
    if "check" not in changes:
        try:
            out["check"] = schema.record_check(out)
        except CorruptCheckpointError:  # a field no checkpoint holds: validation refuses it either way
            pass
    return out


def _first_size_index(m: dict, raw: bool) -> int:
    """Index in ``sizes`` of the first chunk of the first plane stored raw (or coded), in segment 0."""
    seg0 = min(m["segment"], m["nbytes"])
    per_plane = -(-(seg0 // m["planes"]) // m["chunk"])
    for k, codec in enumerate(m["codecs"]):
        if (codec == "raw") == raw:
            return k * per_plane
    raise AssertionError(f"no {'raw' if raw else 'coded'} plane in {m['codecs']}")


def _resize(m: dict, raw: bool, delta: int) -> list:
    sizes = list(m["sizes"])
    sizes[_first_size_index(m, raw)] += delta
    return sizes


BAD_RECORDS = {
    "format 0": dict(format=0),
    "format string": dict(format="1"),
    "format missing": dict(format=KeyError),
    "nbytes negative": dict(nbytes=-1),
    "nbytes huge": dict(nbytes=1 << 60),
    "nbytes bool": dict(nbytes=True),
    "nbytes string": dict(nbytes="12000"),
    "nbytes off by a plane": dict(nbytes=lambda m: m["nbytes"] + 4),
    "planes 3": dict(planes=3, codecs=["zstd"] * 3),
    "planes 0": dict(planes=0, codecs=[]),
    "planes 16": dict(planes=16, codecs=["zstd"] * 16),
    "chunk 0": dict(chunk=0),
    "chunk not multiple of 64": dict(chunk=100),
    "chunk huge": dict(chunk=1 << 40),
    "segment not multiple of 64*planes": dict(segment=64 * 4 + 64),
    "segment negative": dict(segment=-4096),
    "codecs unknown": dict(codecs=lambda m: ["lz4"] * m["planes"]),
    "codecs too few": dict(codecs=lambda m: m["codecs"][:-1]),
    "codecs not a list": dict(codecs="zstd"),
    "data_type <f2": dict(data_type="<f2"),
    "data_type unknown": dict(data_type="<u8"),
    "data_type <f4 on planes": dict(data_type="<f4"),
    "sizes negative": dict(sizes=lambda m: [-1] + m["sizes"][1:]),
    "sizes zero": dict(sizes=lambda m: [0] + m["sizes"][1:]),
    "sizes larger than raw chunk": dict(sizes=lambda m: [m["chunk"] + 1] + m["sizes"][1:]),
    "sizes one chunk too many": dict(sizes=lambda m: m["sizes"] + [16]),
    "sizes one chunk too few": dict(sizes=lambda m: m["sizes"][:-1]),
    "sizes not ints": dict(sizes=lambda m: [float(m["sizes"][0])] + m["sizes"][1:]),
    "sizes raw plane chunk smaller than raw": dict(sizes=lambda m: _resize(m, True, -1)),
    "crc32c one too many": dict(crc32c=lambda m: m["crc32c"] + [0]),
    "crc32c one too few": dict(crc32c=lambda m: m["crc32c"][:-1]),
    "crc32c too big": dict(crc32c=lambda m: [1 << 32] + m["crc32c"][1:]),
    "crc32c negative": dict(crc32c=lambda m: [-1] + m["crc32c"][1:]),
    "crc32c replaced by a crc32 field": dict(crc32=lambda m: m.pop("crc32c")),
    "rotate not a bool": dict(rotate=lambda m: 1),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_validate_rejects(valid_record, case):
    _, blobs, meta = valid_record
    bad = mutated(meta, **BAD_RECORDS[case])
    assert repr(bad) != repr(meta)
    with pytest.raises(CorruptCheckpointError):
        schema.validate(bad, sizes_of(blobs))
    with pytest.raises(CorruptCheckpointError):
        record.decode(blobs, bad, "cpu")


@pytest.mark.parametrize("segment", [0, -1])
@pytest.mark.parametrize("delta", [-1, 1, -16, 16, 4096])
def test_validate_rejects_blob_size_that_does_not_match_the_sizes(valid_record, segment, delta):
    _, blobs, meta = valid_record
    sizes = sizes_of(blobs)
    sizes[segment] += delta
    with pytest.raises(CorruptCheckpointError):
        schema.validate(copy.deepcopy(meta), sizes)
    blob = blobs[segment]
    resized = torch.cat([blob, torch.zeros(max(delta, 0), dtype=torch.uint8)])[: blob.numel() + delta]
    bad_blobs = list(blobs)
    bad_blobs[segment] = resized
    with pytest.raises(CorruptCheckpointError):
        record.decode(bad_blobs, copy.deepcopy(meta), "cpu")


def test_validate_rejects_a_wrong_number_of_blobs(valid_record):
    _, blobs, meta = valid_record
    for bad in (blobs[:-1], blobs + [blobs[-1]], [], [torch.cat(blobs)]):
        with pytest.raises(CorruptCheckpointError):
            schema.validate(copy.deepcopy(meta), sizes_of(bad))
        with pytest.raises(CorruptCheckpointError):
            record.decode(bad, copy.deepcopy(meta), "cpu")


def test_swapped_blobs_fail_the_checksum(valid_record):
    _, blobs, meta = valid_record
    same_size = [i for i in range(1, len(blobs)) if blobs[i].numel() == blobs[0].numel()]
    if not same_size:
        pytest.skip("no two segments stored in the same number of bytes")
    swapped = list(blobs)
    swapped[0], swapped[same_size[0]] = blobs[same_size[0]], blobs[0]
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        record.decode(swapped, copy.deepcopy(meta), "cpu")


def test_validate_rejects_a_coded_size_that_sums_wrong(valid_record):
    _, blobs, meta = valid_record
    bad = copy.deepcopy(meta)
    bad["sizes"] = _resize(bad, False, 64)  # still within the chunk, but the blob does not hold it
    with pytest.raises(CorruptCheckpointError):
        schema.validate(bad, sizes_of(blobs))


@pytest.mark.parametrize("meta", [None, [], "record", 3, {"format": 1}])
def test_validate_rejects_non_records(meta):
    with pytest.raises(CorruptCheckpointError):
        schema.validate(meta, 0)


def test_newer_format_asks_for_an_upgrade(valid_record):
    _, blobs, meta = valid_record
    newer = mutated(meta, format=schema.FORMAT_VERSION + 1)
    with pytest.raises(UnsupportedFormatError, match="(?i)upgrade"):
        schema.validate(newer, sizes_of(blobs))
    with pytest.raises(UnsupportedFormatError, match="(?i)upgrade"):
        record.decode(blobs, newer, "cpu")


def test_format_version_is_checked_before_fields(valid_record):
    # a future format may change any field: the upgrade hint must win over field errors
    _, blobs, meta = valid_record
    future = {"format": schema.FORMAT_VERSION + 7, "whatever": [1, 2, 3]}
    with pytest.raises(UnsupportedFormatError, match="(?i)upgrade"):
        schema.validate(future, sizes_of(blobs))


def test_decode_rejects_blobs_that_are_not_1d_uint8_tensors(valid_record):
    _, blobs, meta = valid_record
    first = blobs[0]
    rest = blobs[1:]
    for bad in (
        [first.view(1, -1)] + rest,
        [first.to(torch.int16)] + rest,
        [first.numpy()] + rest,
        [None] + rest,
        torch.cat(blobs),
        tuple(blobs),
        None,
        {0: first},
    ):
        with pytest.raises(CorruptCheckpointError):
            record.decode(bad, copy.deepcopy(meta), "cpu")


# ----------------------------------------------------------------------------------------------- checksums


@pytest.mark.parametrize("segment", [0, 1, -1])
@pytest.mark.parametrize("where", [0, 1, 0.25, 0.5, 0.75, -1])
def test_flipped_blob_byte_fails_the_checksum(valid_record, segment, where):
    data, blobs, meta = valid_record
    damaged = [b.clone() for b in blobs]
    blob = damaged[segment]
    pos = int(where * blob.numel()) if isinstance(where, float) else where
    blob[pos] ^= 0x10
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        record.decode(damaged, copy.deepcopy(meta), "cpu")
    assert torch.equal(record.decode(blobs, copy.deepcopy(meta), "cpu"), data)  # the originals were untouched


def test_wrong_checksum_value_fails(valid_record):
    _, blobs, meta = valid_record
    bad = copy.deepcopy(meta)
    bad["crc32c"][-1] ^= 1
    with pytest.raises(CorruptCheckpointError, match="description is damaged"):
        record.decode(blobs, bad, "cpu")  # the record's own check catches the damaged field
    bad["check"] = schema.record_check(bad)  # forged to match: the blob's CRC-32 still does not
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        record.decode(blobs, bad, "cpu")


def test_checksum_is_crc32c_of_each_blob(valid_record):
    """Pins the documented format: crc32c[s] is the CRC-32C of blob s (segment s's stored bytes)."""
    _, blobs, meta = valid_record
    assert meta["crc32c"] == [crc32c.crc32c(b.numpy()) for b in blobs]


@SETTINGS
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_crc_combine_matches_the_crc_of_the_concatenation(a, b):
    assert checksum.combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert checksum.combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b), "crc32c") == crc32c.crc32c(a + b)


@pytest.mark.parametrize(
    "nbytes", [0, 1, checksum.PIECE_NBYTES - 1, checksum.PIECE_NBYTES, 2 * checksum.PIECE_NBYTES + 7]
)
def test_crc32_in_parallel_pieces_equals_zlib(nbytes):
    data = torch.from_numpy(np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8))
    assert checksum.crc32(data) == zlib.crc32(data.numpy())
    assert checksum.crc32(data[1:]) == zlib.crc32(data[1:].numpy())
    assert checksum.crc32(data[1:], "crc32c") == crc32c.crc32c(data[1:].numpy())


def test_damage_behind_a_recomputed_checksum_never_escapes_as_a_foreign_error():
    """A consistent record (checksum recomputed) whose stored bytes are damaged: decoding either succeeds (the
    damage hit a raw plane or padding) or raises CorruptCheckpointError, never a zstd or torch error."""
    data = tensor_bytes(trained_like(512, torch.float32))
    (blob,), meta = record.encode(data, torch.float32, "zstd")
    assert "zstd" in meta["codecs"]
    failures = 0
    for pos in range(blob.numel()):
        damaged = blob.clone()
        damaged[pos] ^= 0x5A
        bad = copy.deepcopy(meta)
        bad["crc32c"] = [crc32c.crc32c(damaged.numpy())]
        try:
            out = record.decode([damaged], bad, "cpu")
        except CorruptCheckpointError:
            failures += 1
        else:
            assert out.numel() == data.numel()
    assert failures > 0  # zstd frame headers are in there: some damage must be caught


# -------------------------------------------------------------------------------------------------- codecs


def test_unknown_codec_is_refused():
    with pytest.raises(ValueError):
        record.encode(torch.zeros(64, dtype=torch.uint8), torch.uint8, "lz4")


@no_gpu
def test_ans_without_gpu_is_unavailable_for_encoding():
    with pytest.raises(CodecUnavailableError, match="GPU"):
        record.encode(tensor_bytes(trained_like(1000, torch.float32)), torch.float32, "ans")


@no_gpu
def test_ans_record_without_gpu_is_unavailable_for_decoding(valid_record):
    _, blobs, meta = valid_record
    ans = mutated(meta, codecs=lambda m: ["ans" if c == "zstd" else c for c in m["codecs"]])
    schema.validate(ans, sizes_of(blobs))  # a well-formed record, just not decodable here
    with pytest.raises(CodecUnavailableError) as info:
        record.decode(blobs, ans, "cpu")
    assert isinstance(info.value, CheckpointError)
    message = str(info.value)
    assert "GPU" in message and "--codec zstd" in message and "lightning-nvcomp convert" in message


# ------------------------------------------------------------------------------------------ batches of records


def assert_batch_matches_encoder(datas: list[torch.Tensor], dtype: torch.dtype, codec: str) -> None:
    """encode_batch gives every buffer a record of its own that decodes back to its bytes. With zstd and raw
    (chunks coded independently) its blobs and record are exactly what Encoder gives it with the same layout; nvCOMP
    gANS codes a chunk differently inside a batch (its statistics span the batch), so there only the layout and the
    chunk count must match, and the stored size stay within 1% of Encoder's."""
    coded = batch.encode_batch(datas, dtype, codec)
    assert len(coded) == len(datas)
    for data, (coding, segments) in zip(datas, coded):
        blobs, meta = record.encode(data, dtype, codec, layout=coding.layout)
        batch_meta = record.describe(coding, [n for s in segments for n in s.sizes], [s.crc for s in segments])
        schema.validate(copy.deepcopy(batch_meta), [s.blob.numel() for s in segments])
        assert torch.equal(record.decode([s.blob for s in segments], batch_meta), data.cpu())
        if codec != "ans":
            assert batch_meta == meta
            assert [tensor_bytes(b).numpy().tobytes() for b in blobs] == [
                tensor_bytes(s.blob).numpy().tobytes() for s in segments
            ]
        else:
            assert len(batch_meta["sizes"]) == len(meta["sizes"]) and batch_meta["codecs"] == meta["codecs"]
            assert sum(batch_meta["sizes"]) <= 1.01 * sum(meta["sizes"]) + 64


@SETTINGS
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=12),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.complex64]),
    codec=st.sampled_from(CPU_CODECS),
)
def test_encode_batch_gives_each_buffer_its_own_record(sizes, dtype, codec):
    datas = [tensor_bytes(trained_like(n, dtype, seed)) for seed, n in enumerate(sizes)]
    assert_batch_matches_encoder(datas, dtype, codec)


def test_encode_batch_specials_and_typed_layouts():
    datas = [tensor_bytes(special_floats(torch.float32)), tensor_bytes(trained_like(200_000, torch.float32))]
    assert_batch_matches_encoder(datas, torch.float32, "zstd")
    assert batch.encode_batch([], torch.float32, "zstd") == []


def test_packing_joins_only_adjacent_raw_ranges_that_need_no_padding_between():
    flat = torch.arange(100, dtype=torch.uint8)
    coded = torch.full((5,), 7, dtype=torch.uint8)
    pieces = [(0, 16), (16, 5), (21, 16), coded, (40, 16), (56, 16), (80, 3)]
    assert batch._joined(pieces)[:2] == [(0, 21), (21, 16)]  # (16, 5) needs padding: (21, 16) starts a new range
    assert batch._joined(pieces)[3:] == [(40, 32), (80, 3)]
    unjoined = segment.pack([flat[p[0] : p[0] + p[1]] if isinstance(p, tuple) else p for p in pieces])
    assert torch.equal(batch._pack(flat, pieces), unjoined)


@pytest.mark.parametrize("sizes", [[4096], [4096, 0], [100, 4096, 0, 7]])
def test_raw_batches_are_copied_once_and_never_alias_their_buffers(sizes):
    """Buffers stored raw are packed straight from their own memory (no plane buffer in between), yet into memory of
    their own: a buffer changed after it was coded (training goes on) leaves its blob as it was."""
    datas = [tensor_bytes(trained_like(n, torch.uint8, seed)) for seed, n in enumerate(sizes)]
    expected = [d.clone() for d in datas]
    coded = batch.encode_batch(datas, torch.uint8, "raw")
    for d in datas:
        d.fill_(0xAB)
    for want, (coding, segments) in zip(expected, coded):
        meta = record.describe(coding, [n for s in segments for n in s.sizes], [s.crc for s in segments])
        assert torch.equal(record.decode([s.blob for s in segments], meta), want)
    assert_batch_matches_encoder(expected, torch.uint8, "raw")


def test_cpu_batches_share_a_plane_buffer_yet_keep_their_own_bytes():
    """CPU batches split their planes into one buffer per thread, reused: the records of one batch (raw planes
    among them) must still decode to their bytes after later batches of other data and dtypes were coded."""
    first = [tensor_bytes(trained_like(n, torch.float32, seed)) for seed, n in enumerate([50_000, 3, 20_000])]
    coded = batch.encode_batch(first, torch.float32, "zstd")
    for seed in range(3):
        later = [tensor_bytes(trained_like(60_000, dtype, 10 + seed)) for dtype in (torch.float32, torch.bfloat16)]
        batch.encode_batch(later[:1], torch.float32, "zstd")
        batch.encode_batch(later[1:], torch.bfloat16, "zstd")
    raw_sizes = [segment._raw_sizes(coding.nbytes // 4, coding.layout.chunk) for coding, _ in coded]
    # chunks kept raw are packed from the shared planes
    assert any(
        size == raw
        for (_, segments), raws in zip(coded, raw_sizes)
        for s in segments
        for size, raw in zip(s.sizes, raws)
    )
    for data, (coding, segments) in zip(first, coded):
        meta = record.describe(coding, [n for s in segments for n in s.sizes], [s.crc for s in segments])
        assert torch.equal(record.decode([s.blob for s in segments], meta), data)


def test_encode_batch_refuses_buffers_larger_than_a_segment():
    with pytest.raises(ValueError, match="at most"):
        batch.encode_batch([torch.zeros(engines.CPU_SEGMENT_NBYTES + 64, dtype=torch.uint8)], torch.uint8, "zstd")
