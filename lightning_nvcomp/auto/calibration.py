"""The codecs measured on the state they will code: a sample of it (:func:`sample_state`), each candidate codec
(:func:`candidate_codecs`) timed on it where the state lives (:func:`calibrate`), as :class:`CodecProfile` s, the
codec figures :mod:`lightning_nvcomp.auto.policy` predicts saves from."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from lightning_nvcomp.codec import pinned, record, schema
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.options import Codec


@dataclass(frozen=True)
class CodecProfile:
    """A codec measured on a sample of the actual state, on the actual device (``codec``: a :class:`Codec` or its
    name)."""

    codec: Codec
    ratio: float
    encode_gbps: float  # raw GB/s through the whole encode (inf for "none")

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", Codec.parse(self.codec))


def candidate_codecs(device: torch.device) -> list[Codec]:
    """Codecs worth calibrating for state on ``device``: gANS needs a GPU and nvCOMP (CPU state is coded there after
    a copy, e.g. Lightning's FSDPStrategy offloads sharded state to the CPU before saving); zstd and none run
    anywhere."""
    if device.type in ("cuda", "cpu") and gpu_available():
        return [Codec.ANS, Codec.ZSTD, Codec.NONE]
    return [Codec.ZSTD, Codec.NONE]


def bulk_device(tensors: list[torch.Tensor]) -> torch.device:
    """The device holding most of the bytes of ``tensors`` (the CPU when there are none)."""
    nbytes: dict[torch.device, int] = {}
    for t in tensors:
        nbytes[t.device] = nbytes.get(t.device, 0) + t.numel() * t.element_size()
    return max(nbytes, key=nbytes.__getitem__) if nbytes else torch.device("cpu")


#: The sample :func:`sample_state` takes of each dtype's bytes: a share of the state, between these bounds. Calibration
#: codes it twice (a warm-up, then timed): taking the whole of a small state cost auto's first save on a 2-core CPU
#: 0.2 s for 58 MB (round 11), four times what coding it takes; real saves refine the figures (see policy).
SAMPLE_SHARE = 1 / 8
SAMPLE_NBYTES = (4 << 20, 64 << 20)


def sample_nbytes(total: int) -> int:
    """How many of ``total`` bytes of one dtype :func:`sample_state` takes by default: :data:`SAMPLE_SHARE` of them,
    within :data:`SAMPLE_NBYTES` (all of a state smaller than the lower bound)."""
    low, high = SAMPLE_NBYTES
    return min(high, max(low, int(total * SAMPLE_SHARE)))


def sample_state(
    tensors: list[torch.Tensor], nbytes: int | None = None, per_tensor: bool = False
) -> dict[torch.dtype, list[torch.Tensor]]:
    """Up to ``nbytes`` (default :func:`sample_nbytes` of its bytes) of the state per dtype, as flat uint8 buffers (on
    the tensors' device, which must be one) for calibration: one buffer taken evenly from all the tensors, or with
    ``per_tensor`` whole tensors picked evenly, one buffer each (for saves that code every tensor by itself, whose
    per-call costs must count)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel() and t.is_contiguous():
            by_dtype.setdefault(t.dtype, []).append(t)
    samples = {}
    for dtype, group in by_dtype.items():
        total = sum(t.numel() * t.element_size() for t in group)
        share = min(1.0, (nbytes if nbytes is not None else sample_nbytes(total)) / total)
        flats = [t.detach().reshape(-1).view(torch.uint8) for t in group]
        if per_tensor:
            step = max(1, round(1 / share))
            samples[dtype] = flats[step // 2 :: step] or flats[:1]
            continue
        parts = []
        for t, flat in zip(group, flats):
            take = int(flat.numel() * share) // t.element_size() * t.element_size()
            start = (flat.numel() - take) // 2 // t.element_size() * t.element_size()
            parts.append(flat[start : start + take])
        samples[dtype] = [torch.cat(parts)]
    return samples


def calibrate(samples: dict[torch.dtype, list[torch.Tensor]], codecs: list[Codec]) -> list[CodecProfile]:
    """Encode the samples with each codec (once to warm up, once timed); return ratio and throughput."""
    profiles = []
    pieces = [(dtype, data) for dtype, datas in samples.items() for data in datas]
    raw = sum(data.numel() for _, data in pieces)
    for codec in codecs:
        if codec == "none" or raw == 0:
            profiles.append(CodecProfile(codec, 1.0, _host_copy_gbps([d for _, d in pieces]) if raw else math.inf))
            continue
        stored = seconds = 0.0
        for dtype, data in pieces:
            _, meta = record.encode(data, dtype, codec)  # warm-up: codec setup, pinned memory, the byte layout
            _sync_gpu()
            begin = time.perf_counter()
            # As a run's saves code it: with the layout already chosen (it is kept between saves), and with the
            # checksums left to CPU threads (saves wait for them only when writing, overlapped with coding).
            segments = list(record.Encoder(data, dtype, codec, layout=schema.Layout.of(meta)))
            _sync_gpu()  # the compressed bytes are in host memory
            seconds += time.perf_counter() - begin
            stored += sum(seg.blob.numel() for seg in segments)
            for seg in segments:
                seg.checksum()  # the pool is free for the next sample
        profiles.append(CodecProfile(codec, raw / stored, raw / seconds / 1e9))
    return profiles


def _sync_gpu() -> None:
    """Wait for the GPU: gANS codes CPU samples there too (after a copy), so the device of the data does not say."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _host_copy_gbps(samples: list[torch.Tensor]) -> float:
    """What an uncompressed save pays before writing: the copy of GPU state to pinned host memory (inf on the CPU)."""
    gpu = [s for s in samples if s.is_cuda]
    if not gpu:
        return math.inf
    seconds = math.inf
    for _ in range(2):  # the first round warms up (the pool's slabs are pinned for the next saves, as for these)
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for s in gpu:
            pinned.pool().copy(s)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - begin
    return sum(s.numel() for s in gpu) / seconds / 1e9
