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

from lightning_nvcomp.codec.engine import ChunkEngine

_ALGORITHM = {"ans": "ANS", "zstd": "Zstd"}


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

    def _capacity(self, nv_codec, codec: str, data_type: str, chunk: torch.Tensor) -> int:
        key = (codec, data_type, chunk.numel())
        caps = self._local.__dict__.setdefault("capacity", {})
        if key not in caps:
            caps[key] = nv_codec.get_max_comp_buffer_size(self._nvcomp.as_array(chunk))
        return caps[key]

    def encode(self, chunks: list[torch.Tensor], codec: str, data_type: str) -> list[torch.Tensor]:
        if not chunks:
            return []
        device = chunks[0].device
        with torch.cuda.device(device):
            nv_codec, stream = self._codec(codec, data_type, device)
            # Compress into one buffer torch owns (views of nvCOMP-owned outputs must not outlive them).
            align = nv_codec.get_required_compression_alignment()
            # nvCOMP sizes every output slot for the batch's largest chunk.
            capacity = self._capacity(nv_codec, codec, data_type, max(chunks, key=torch.Tensor.numel))
            stride = -(-capacity // align) * align
            offsets = [i * stride for i in range(len(chunks))]
            capacities = [capacity] * len(chunks)
            total = stride * len(chunks)
            packed = torch.empty(total, dtype=torch.uint8, device=device)
            src = self._nvcomp.as_arrays(chunks, cuda_stream=stream)
            dst = self._nvcomp.as_arrays(packed, offsets, capacities, cuda_stream=stream)
            sizes = nv_codec.encode(src, out=dst).buffer_sizes  # waits for the encode
        return [packed[off : off + n] for off, n in zip(offsets, sizes)]

    def decode(self, stored: list[torch.Tensor], out: list[torch.Tensor], codec: str, data_type: str) -> None:
        if not stored:
            return
        device = out[0].device
        with torch.cuda.device(device):
            nv_codec, stream = self._codec(codec, data_type, device)
            src = self._nvcomp.as_arrays(stored, cuda_stream=stream)
            dst = self._nvcomp.as_arrays(out, cuda_stream=stream)
            try:
                decoded = nv_codec.decode(src, out=dst)
                sizes = decoded.buffer_sizes
            except Exception as err:  # nvCOMP reports bad bitstreams as RuntimeError/ValueError
                raise ValueError(f"nvCOMP {codec} decode failed: {err}") from None
        for i, (got, want) in enumerate(zip(sizes, out)):
            if got != want.numel():
                raise ValueError(f"{codec} chunk {i} decodes to {got} bytes, expected {want.numel()}")
