"""GPU chunk engine: NVIDIA nvCOMP gANS and Zstd on CUDA tensors, zero-copy through DLPack; and whether it can run
here (:func:`gpu_available`), and if not, what is missing and what to install (:func:`gpu_missing`).

Both codecs use nvCOMP's RAW bitstream, one compressed buffer per chunk, so that the container's chunk table
is the only framing. A RAW Zstd chunk is one standard zstd frame with its content size: the CPU engine reads
it. gANS has no CPU decoder anywhere; its bitstreams are recorded with the nvCOMP version that wrote them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import threading
from dataclasses import dataclass
from types import ModuleType

import torch

from lightning_nvcomp.codec.engine import ChunkEngine, Span

_ALGORITHM = {"ans": "ANS", "zstd": "Zstd"}

#: The nvCOMP wheel for each CUDA major version torch is built for; the package's extras ``cu12`` and ``cu13``
#: install them.
NVCOMP_PACKAGES = {"12": "nvidia-nvcomp-cu12", "13": "nvidia-nvcomp-cu13"}


class _PinnedBuffer:
    """Pinned host memory nvCOMP borrows (its ``ptr``), from torch's caching host allocator."""

    __slots__ = ("memory", "ptr")

    def __init__(self, nbytes: int, stream: object = None) -> None:
        self.memory = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.ptr = self.memory.data_ptr()


@functools.cache
def _nvcomp_import() -> tuple[ModuleType | None, str | None]:
    """``(nvidia.nvcomp, None)`` if it is installed and loads; ``(None, why)`` if it is installed and fails to load;
    ``(None, None)`` if it is not installed."""
    try:
        from nvidia import nvcomp
    except ModuleNotFoundError as err:
        if err.name in ("nvidia", "nvidia.nvcomp"):
            return None, None
        return None, f"{type(err).__name__}: {err}"
    except Exception as err:  # a library that fails to load (no driver, a wrong CUDA)
        return None, f"{type(err).__name__}: {err}"
    return nvcomp, None


def nvcomp_module() -> ModuleType | None:
    """``nvidia.nvcomp`` if it is installed and loads, else None."""
    return _nvcomp_import()[0]


def nvcomp_version() -> str | None:
    """Version of the installed nvCOMP, or None."""
    module = nvcomp_module()
    return None if module is None else str(module.__version__)


def gpu_available() -> bool:
    """True when a CUDA device and nvCOMP are both usable."""
    return torch.cuda.is_available() and nvcomp_module() is not None


@dataclass(frozen=True)
class GpuSupport:
    """What nvCOMP on the GPU depends on, as found in a process.

    Attributes:
        torch_version: ``torch.__version__``.
        torch_cuda: the CUDA version torch is built for (``torch.version.cuda``); None for a CPU-only build.
        cuda_available: whether torch sees a CUDA GPU.
        nvcomp_version: the version of the nvCOMP that loads here, or None.
        nvcomp_error: why an installed nvCOMP fails to load (None if it loads or is not installed).
        nvcomp_packages: the nvCOMP wheels installed (``nvidia-nvcomp-cu12``...), whether or not they load.
    """

    torch_version: str
    torch_cuda: str | None
    cuda_available: bool
    nvcomp_version: str | None
    nvcomp_error: str | None = None
    nvcomp_packages: tuple[str, ...] = ()

    @property
    def cuda_major(self) -> str | None:
        return self.torch_cuda.split(".")[0] if self.torch_cuda else None

    def install_line(self) -> str:
        """The one install line that fits this torch (or what to install first where no nvCOMP wheel fits it)."""
        versions = " or ".join(f'"lightning-nvcomp[cu{major}]" (CUDA {major})' for major in NVCOMP_PACKAGES)
        if self.cuda_major is None:
            return f"install a CUDA build of torch, then pip install {versions}"
        package = NVCOMP_PACKAGES.get(self.cuda_major)
        if package is None:
            return (
                f"install a torch built for CUDA {' or '.join(NVCOMP_PACKAGES)}, the versions nvCOMP has wheels for "
                f"(torch {self.torch_version} is built for CUDA {self.torch_cuda})"
            )
        return f'pip install "lightning-nvcomp[cu{self.cuda_major}]" ({package}, for torch\'s CUDA {self.torch_cuda})'

    def missing(self) -> str | None:
        """What keeps nvCOMP from running here, as a clause that follows "on this machine": which of the CUDA GPU and
        nvCOMP is missing (or both) and what to do, with the install line that fits this torch. None when both are
        usable."""
        gpu = None
        if not self.cuda_available:
            gpu = (
                f"there is no CUDA GPU (torch {self.torch_version} is a CPU-only build)"
                if self.torch_cuda is None
                else f"torch {self.torch_version} sees no CUDA GPU (check the driver with nvidia-smi, and "
                "CUDA_VISIBLE_DEVICES)"
            )
        nvcomp = None
        if self.nvcomp_error is not None:
            nvcomp = f"nvCOMP is installed but fails to load ({self.nvcomp_error})"
        elif self.nvcomp_version is None:
            nvcomp = "nvCOMP is not installed"
        if gpu and nvcomp:
            return f"{gpu} and {nvcomp}: {self.install_line()}"
        if nvcomp:
            return f"there is a CUDA GPU but {nvcomp}: {self.install_line()}"
        if gpu:
            fix = f": {self.install_line()}" if self.torch_cuda is None else ""
            return f"{gpu}; nvCOMP {self.nvcomp_version} is installed{fix}"
        return None


def gpu_support() -> GpuSupport:
    """The facts of this process (see :class:`GpuSupport`)."""
    module, error = _nvcomp_import()
    installed = []
    for package in NVCOMP_PACKAGES.values():
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
        installed.append(package)
    return GpuSupport(
        torch.__version__,
        torch.version.cuda,
        torch.cuda.is_available(),
        None if module is None else str(module.__version__),
        error,
        tuple(installed),
    )


def gpu_missing() -> str | None:
    """What keeps nvCOMP from running on this machine, and what to install (see :meth:`GpuSupport.missing`); None
    when a CUDA GPU and nvCOMP are both usable. Every message about a missing GPU or nvCOMP says it through this."""
    return gpu_support().missing()


class NvcompEngine(ChunkEngine):
    """gANS and Zstd on the current CUDA device and stream. nvCOMP codecs are not shared between threads."""

    device_type = "cuda"
    codecs = ("ans", "zstd")

    def __init__(self) -> None:
        module = nvcomp_module()
        if module is None or not torch.cuda.is_available():
            raise RuntimeError(f"the nvCOMP engine needs a CUDA GPU and nvCOMP; on this machine {gpu_missing()}")
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
