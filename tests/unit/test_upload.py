"""The ring that host blobs pass through on their way to a GPU (``codec.upload``): every byte arrives, the CRC is the
blob's, a failed copy leaves the ring usable. On the CPU the ring's buffers are unpinned and the "device" is the CPU
(the same pieces, copies and checksums); the GPU test sends them to a GPU."""

from __future__ import annotations

import zlib

import crc32c
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.codec.upload import UploadRing, checked_upload

PIECE = 4096


def _pattern(n: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 7 * PIECE + 3), size=st.integers(1, 4), seed=st.integers(0, 1 << 16))
def test_every_byte_arrives_and_the_crc_is_the_blobs(n, size, seed):
    """Any length (empty, within a piece, across pieces, more pieces than buffers: each buffer reused)."""
    ring = UploadRing(piece_nbytes=PIECE, size=size, pin=False)
    blob = _pattern(n, seed)
    for algorithm, function in (("crc32c", crc32c.crc32c), ("crc32", zlib.crc32)):
        out, crc = ring.upload(blob, torch.device("cpu"), algorithm)
        assert torch.equal(out, blob)
        assert crc == function(blob.numpy().tobytes())


def test_a_view_into_a_larger_buffer_sends_only_its_bytes():
    data = _pattern(5 * PIECE, 1)
    blob = data[PIECE + 7 : 4 * PIECE - 9]
    out, crc = UploadRing(piece_nbytes=PIECE, size=2, pin=False).upload(blob, torch.device("cpu"), "crc32c")
    assert torch.equal(out, blob) and crc == crc32c.crc32c(blob.numpy().tobytes())


def test_a_failed_copy_raises_and_leaves_the_ring_usable():
    ring = UploadRing(piece_nbytes=PIECE, size=2, pin=False)
    blob = _pattern(6 * PIECE, 2)
    with pytest.raises(KeyError):
        ring.upload(blob, torch.device("cpu"), "no-such-checksum")
    out, crc = ring.upload(blob, torch.device("cpu"), "crc32c")
    assert torch.equal(out, blob) and crc == crc32c.crc32c(blob.numpy().tobytes())


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
def test_a_blob_reaches_the_gpu_bit_exactly_through_the_pinned_ring():
    """More pieces than the process ring has buffers, a length that is no whole number of pieces."""
    blob = _pattern(3 * (16 << 20) * 4 + 12345, 3)
    out, crc = checked_upload(blob, torch.device("cuda", torch.cuda.current_device()), "crc32c")
    assert out.is_cuda and torch.equal(out.cpu(), blob)
    assert crc == crc32c.crc32c(blob.numpy().tobytes())


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
@pytest.mark.parametrize("codec", ["none", "ans"])
def test_a_file_loads_onto_the_gpu_bit_exactly_and_a_damaged_one_is_named(tmp_path, codec):
    """Its segments go through the ring (a file's mapping is pageable memory): bit-exact, and a flipped byte in them is
    a checksum mismatch naming the file and the tensor, before any decoding."""
    import lightning_nvcomp

    w = torch.randn(3 << 20, generator=torch.Generator().manual_seed(0))
    state = {"w": w.cuda(), "b": torch.arange(7, device="cuda")}  # GPU state, as gANS codes it
    path = tmp_path / "x.ckpt"
    lightning_nvcomp.save(state, path, codec=codec)
    back = lightning_nvcomp.load(path, map_location="cuda")
    assert back["w"].is_cuda and torch.equal(back["w"].cpu().view(torch.uint8), w.view(torch.uint8))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the big record's one segment
    path.write_bytes(bytes(data))
    with pytest.raises(lightning_nvcomp.CorruptCheckpointError, match="checksum mismatch") as caught:
        lightning_nvcomp.load(path, map_location="cuda")
    assert str(path) in str(caught.value) and "'w'" in str(caught.value)
