"""GPU chunk engine: NVIDIA nvCOMP gANS and Zstd on CUDA tensors, zero-copy through DLPack.

Both codecs use nvCOMP's RAW bitstream, one compressed buffer per chunk, so that the container's chunk table
is the only framing. A RAW Zstd chunk is one standard zstd frame with its content size: the CPU engine reads
it. gANS has no CPU decoder anywhere; its bitstreams are recorded with the nvCOMP version that wrote them.
"""

from __future__ import annotations

import functools
import threading
from types import ModuleType

import torch

from lightning_nvcomp.codec.engine import ChunkEngine, Span

_ALGORITHM = {"ans": "ANS", "zstd": "Zstd"}


class _PinnedBuffer:
    """Pinned host memory nvCOMP borrows (its ``ptr``), from torch's caching host allocator."""

    __slots__ = ("memory", "ptr")

    def __init__(self, nbytes: int, stream: object = None) -> None:
        self.memory = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.ptr = self.memory.data_ptr()


@functools.cache
def nvcomp_module() -> ModuleType | None:
    """``nvidia.nvcomp`` if it is installed and loads, else None."""
    try:
        from nvidia import nvcomp
    except Exception:  # ImportError, or a library that fails to load without a driver
        return None
    return nvcomp


def nvcomp_version() -> str | None:
    """Version of the installed nvCOMP, or None."""
    module = nvcomp_module()
    return None if module is None else str(module.__version__)


def gpu_available() -> bool:
    """True when a CUDA device and nvCOMP are both usable."""
    return torch.cuda.is_available() and nvcomp_module() is not None


class NvcompEngine(ChunkEngine):
    """gANS and Zstd on the current CUDA device and stream. nvCOMP codecs are not shared between threads."""

    device_type = "cuda"
    codecs = ("ans", "zstd")

    def __init__(self) -> None:
        module = nvcomp_module()
        if module is None or not torch.cuda.is_available():
            raise RuntimeError("the nvCOMP engine needs a CUDA GPU and nvidia-nvcomp-cu12 (or -cu13)")
        self._nvcomp = module
        self._local = threading.local()
        # nvCOMP's own pinned allocations (each call's chunk sizes) are a cudaHostAlloc and a cudaFreeHost per call,
        # and a page-locked allocation serializes every stream (a batch's device-to-host copy and the next batch's
        # coding cannot overlap). torch's caching host allocator reuses its blocks instead.
        if hasattr(module, "set_pinned_allocator"):
            module.set_pinned_allocator(_PinnedBuffer)

    def _codec(self, codec: str, data_type: str, device: torch.device):
        stream = torch.cuda.current_stream(device)
        key = (codec, data_type, device.index, stream.cuda_stream)
        cache = self._local.__dict__.setdefault("codecs", {})
        if key not in cache:
            cache[key] = self._nvcomp.Codec(
                algorithm=_ALGORITHM[codec],
                device_id=device.index,
                cuda_stream=stream.cuda_stream,
                bitstream_kind=self._nvcomp.BitstreamKind.RAW,
                data_type=data_type,
            )
        return cache[key], stream.cuda_stream

    def _capacity(self, nv_codec, codec: str, data_type: str, src: torch.Tensor, nbytes: int) -> int:
        key = (codec, data_type, nbytes)
        caps = self._local.__dict__.setdefault("capacity", {})
        if key not in caps:
            caps[key] = nv_codec.get_max_comp_buffer_size(self._nvcomp.as_array(src[:nbytes]))
        return caps[key]

    def encode(self, src: torch.Tensor, spans: list[Span], codec: str, data_type: str) -> list[torch.Tensor]:
        if not spans:
            return []
        device = src.device
        with torch.cuda.device(device):
            nv_codec, stream = self._codec(codec, data_type, device)
            # Compress into one buffer torch owns (views of nvCOMP-owned outputs must not outlive them); nvCOMP
            # sizes every output slot for the batch's largest chunk.
            align = nv_codec.get_required_compression_alignment()
            capacity = self._capacity(nv_codec, codec, data_type, src, max(n for _, n in spans))
            stride = -(-capacity // align) * align
            offsets = [i * stride for i in range(len(spans))]
            packed = torch.empty(stride * len(spans), dtype=torch.uint8, device=device)
            batch = self._nvcomp.as_arrays(src, [o for o, _ in spans], [n for _, n in spans], cuda_stream=stream)
            out = self._nvcomp.as_arrays(packed, offsets, [capacity] * len(spans), cuda_stream=stream)
            sizes = nv_codec.encode(batch, out=out).buffer_sizes  # waits for the encode
        return [packed[off : off + n] for off, n in zip(offsets, sizes)]

    def decode(
        self, src: torch.Tensor, spans: list[Span], dst: torch.Tensor, dst_spans: list[Span], codec: str, data_type: str
    ) -> None:
        if not spans:
            return
        device = dst.device
        with torch.cuda.device(device):
            nv_codec, stream = self._codec(codec, data_type, device)
            batch = self._nvcomp.as_arrays(src, [o for o, _ in spans], [n for _, n in spans], cuda_stream=stream)
            out = self._nvcomp.as_arrays(dst, [o for o, _ in dst_spans], [n for _, n in dst_spans], cuda_stream=stream)
            try:
                sizes = nv_codec.decode(batch, out=out).buffer_sizes
            except Exception as err:  # nvCOMP reports bad bitstreams as RuntimeError/ValueError
                raise ValueError(f"nvCOMP {codec} decode failed: {err}") from None
        for i, (got, (_, want)) in enumerate(zip(sizes, dst_spans)):
            if got != want:
                raise ValueError(f"{codec} chunk {i} decodes to {got} bytes, expected {want}")
