"""Tensors stored one archive each (the items of a DCP checkpoint): coded in batches, written as whole torch.save
zips, read back one by one or a window at once, bit-exactly, with damage named."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_nvcomp.codec import batch, record, schema
from lightning_nvcomp.errors import CorruptCheckpointError
from lightning_nvcomp.format import LoadState, item_batches
from lightning_nvcomp.format import items as tensor_items
from lightning_nvcomp.format.zip import ArchiveWriter

from tests.helpers.states import assert_bit_exact, special_floats, tensor_bytes, trained_like

SETTINGS = settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
CPU = torch.device("cpu")


def archives(tensors: list[tuple[str, torch.Tensor]], codec: str) -> list[torch.Tensor]:
    """Each tensor written as its own archive, as the DCP writer does; the archives' bytes, in input order."""
    out: dict[int, torch.Tensor] = {}
    for coded_batch in item_batches.code_tensors(tensors, codec):
        for index, coded in coded_batch:
            buffer = io.BytesIO()
            tensor_items.write_tensor(ArchiveWriter(buffer), coded)
            out[index] = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    return [out[i] for i in range(len(tensors))]


def state_of_items() -> list[tuple[str, torch.Tensor]]:
    return [
        ("layer.0.weight", trained_like(3000, torch.float32).reshape(30, 100)),
        ("layer.1.weight", trained_like(2000, torch.float32, 1).reshape(20, 100)),
        ("layer.0.bias", trained_like(30, torch.float32, 2)),
        ("optim.exp_avg_sq", trained_like(5000, torch.float32, 3).abs().square()),
        ("embed", trained_like(999, torch.bfloat16, 4)),
        ("big.weight", trained_like(5_000_000, torch.float32, 5)),  # more than a CPU segment: alone
        ("specials", special_floats(torch.float32)),
        ("ids", torch.arange(70, dtype=torch.int64)),
        ("mask", torch.arange(33) % 3 == 0),
        ("complex", torch.complex(trained_like(8, torch.float32), trained_like(8, torch.float32, 1))),
        ("empty", torch.empty(0, 4)),
        ("scalar", torch.tensor(2.5)),
        ("strided", trained_like(600, torch.float32, 6).reshape(20, 30).t()),  # non-contiguous: stored contiguous
    ]


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_items_read_back_bit_exactly_by_every_reader(codec):
    tensors = state_of_items()
    data = archives(tensors, codec)
    state = LoadState("items")
    together = tensor_items.read_tensors([(d, name) for d, (name, _) in zip(data, tensors)], CPU, state)
    for (name, t), d, batch_read in zip(tensors, data, together):
        one = tensor_items.read_tensor(d, name, CPU, LoadState(name))
        plain = torch.load(io.BytesIO(d.numpy().tobytes()), weights_only=True)
        for got in (batch_read, one, plain):
            assert got.shape == t.shape and got.dtype == t.dtype, name
            assert_bit_exact(got.contiguous(), t.contiguous())


@SETTINGS
@given(
    sizes=st.lists(st.integers(0, 4000), min_size=1, max_size=10),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int32, torch.float8_e4m3fn, torch.bool]),
    codec=st.sampled_from(["zstd", "none"]),
)
def test_items_of_any_sizes_round_trip(sizes, dtype, codec):
    tensors = [(f"t{i}.weight", trained_like(n, dtype, i)) for i, n in enumerate(sizes)]
    data = archives(tensors, codec)
    back = tensor_items.read_tensors([(d, n) for d, (n, _) in zip(data, tensors)], CPU, LoadState("x"))
    for (_, t), got in zip(tensors, back):
        assert_bit_exact(got, t)


def test_a_damaged_item_in_a_window_is_named():
    tensors = state_of_items()[:5]
    data = archives(tensors, "zstd")
    damaged = data[3].clone()
    start, size, _ = tensor_items._entries(memoryview(damaged.numpy()))["archive/data/0"]
    damaged[start + size // 2] ^= 0x10  # inside its first blob
    parts = [(d, f"file: item {name!r}") for d, (name, _) in zip(data, tensors)]
    parts[3] = (damaged, parts[3][1])
    with pytest.raises(CorruptCheckpointError, match="optim.exp_avg_sq"):
        tensor_items.read_tensors(parts, CPU, LoadState("x"))


def test_an_archive_of_another_shape_is_read_by_the_general_reader():
    """A plain torch.save zip of a tensor (a DCP item DCP's own writer made) reads through the general path."""
    t = trained_like(1000, torch.float32)
    buffer = io.BytesIO()
    torch.save(t, buffer)
    data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    (got,) = tensor_items.read_tensors([(data, "plain")], CPU, LoadState("x"))
    assert_bit_exact(got, t)


def test_decode_batch_checks_every_segment():
    datas = [tensor_bytes(trained_like(n, torch.float32, n)) for n in (100, 2000, 50_000)]
    recs = []
    for coding, segments in batch.encode_batch(datas, torch.float32, "zstd"):
        meta = record.describe(coding, [n for s in segments for n in s.sizes], [s.crc for s in segments])
        blobs = [s.blob.clone() for s in segments]
        recs.append((blobs, meta, schema.validate(meta, [b.numel() for b in blobs])))
    for data, out in zip(datas, batch.decode_batch(recs, CPU)):
        assert torch.equal(out, data)
    recs[1][0][0][5] ^= 1
    with pytest.raises(CorruptCheckpointError, match="record 1: checksum mismatch"):
        batch.decode_batch(recs, CPU)


@pytest.mark.parametrize("threads", ["1", "2", "16"])
def test_tiny_tensors_come_first(threads, monkeypatch):
    """Tiny tensors' batches are yielded before the coded ones: each costs its writer a record and its coder next
    to nothing, so their writing runs while the large batches are coded (it was the save's tail:
    round10 of benchmarks/results/ in git history). On few cores a pool thread codes them beside the first coded batch; the order is
    the same on any number of cores."""
    monkeypatch.setenv("LIGHTNING_NVCOMP_THREADS", threads)
    tensors = [(f"l{i}.weight", trained_like(4096, torch.float32, i)) for i in range(3)]
    tensors += [(f"l{i}.bias", trained_like(16, torch.float32, i)) for i in range(3)]
    tensors += [(f"l{i}.proj", trained_like(4096, torch.float32, 10 + i)) for i in range(2)]
    tensors += [(f"l{i}.step", torch.tensor(i + 7, dtype=torch.int64)) for i in range(2)]
    order = [[i for i, _ in b] for b in item_batches.code_tensors(tensors, "zstd")]
    assert order == [[3, 4, 5], [8, 9], [0, 1, 2], [6, 7]]


def test_a_large_cpu_tensor_is_streamed_ahead_of_the_other_batches():
    """``streamed`` (the DCP writer's ``write_data``): a CPU tensor larger than a segment is yielded before every
    other batch, as soon as its segments are queued, and its segments come out as each is coded (so that its
    archive is written meanwhile: issue 14's many-items save, round15 of benchmarks/results/ in git history); its archive reads back
    bit-exactly. Unstreamed (``dcp.async_save``'s staging, which must hold the coded bytes before training goes
    on), the same tensor's segments are a list, all coded."""
    big = trained_like(5_000_000, torch.float32, 5)  # 20 MB: more than a CPU segment, two segments
    tensors = [("a.bias", trained_like(30, torch.float32)), ("l.weight", trained_like(3000, torch.float32, 1))]
    tensors.append(("big.weight", big))
    batches = list(item_batches.code_tensors(tensors, "zstd", streamed=True))
    assert [[i for i, _ in b] for b in batches] == [[2], [0], [1]]
    streamed = batches[0][0][1]
    assert not isinstance(streamed.segments, list)
    buffer = io.BytesIO()
    tensor_items.write_tensor(ArchiveWriter(buffer), streamed)
    archive = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    assert_bit_exact(tensor_items.read_tensor(archive, "big.weight", CPU, LoadState("x")), big)
    unstreamed = {i: c for b in item_batches.code_tensors(tensors, "zstd") for i, c in b}
    assert isinstance(unstreamed[2].segments, list) and len(unstreamed[2].segments) == 2


def test_tensors_are_batched_whatever_their_names():
    """Tiny tensors share a batch whatever their names, and so do coded ones whose last name part no other tensor
    has (issue 14's 3,000 small tensors named v0, v1...: each was a batch of its own, a codec call and a record pass
    per tensor, 2.5-2.8x the single-file save on the CPU: round13 of benchmarks/results/ in git history). Tensors sharing a last name
    part keep their own batch."""
    tiny = [(f"small.v{i}", trained_like(128, torch.float32, i)) for i in range(50)]
    coded = [(f"big.m{i}", trained_like(2048, torch.float32, 100 + i)) for i in range(4)]
    alike = [(f"l{i}.weight", trained_like(2048, torch.float32, 200 + i)) for i in range(3)]
    tensors = tiny + coded + alike
    batches = [sorted(i for i, _ in b) for b in item_batches.code_tensors(tensors, "zstd")]
    assert batches == [list(range(50)), list(range(50, 54)), list(range(54, 57))]
    for (_, t), got in zip(
        tensors,
        tensor_items.read_tensors(
            [(d, n) for d, (n, _) in zip(archives(tensors, "zstd"), tensors)], CPU, LoadState("x")
        ),
    ):
        assert_bit_exact(got, t)


def test_tiny_tensors_are_stored_raw_and_the_rest_coded():
    """Under RAW_NBYTES a codec call per plane costs more than it saves: such tensors are raw records (still
    checksummed); from RAW_NBYTES on they are coded."""
    n = item_batches.RAW_NBYTES // 4
    tensors = [("a.bias", trained_like(n - 1, torch.float32)), ("b.bias", trained_like(n, torch.float32, 1))]
    coded = {i: c for b in item_batches.code_tensors(tensors, "zstd") for i, c in b}
    assert coded[0].coding.layout.codecs == ("raw",) and coded[0].segments[0].checksum() is not None
    assert "zstd" in coded[1].coding.layout.codecs
    for (_, t), got in zip(
        tensors,
        tensor_items.read_tensors(
            [(d, n) for d, (n, _) in zip(archives(tensors, "zstd"), tensors)], CPU, LoadState("x")
        ),
    ):
        assert_bit_exact(got, t)
