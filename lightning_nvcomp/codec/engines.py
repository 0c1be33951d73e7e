"""Which engine codes what, and where: the engine for a codec and a device (:func:`engine_for`), the one that
decodes on a device (:func:`engine_on`), where a record decodes (:func:`work_device`; a GPU whatever its target:
:func:`decodes_on_gpu_only`), and the segment sizes a buffer is coded in (one engine call each)."""

from __future__ import annotations

from collections.abc import Collection

import torch

from lightning_nvcomp._process import shared
from lightning_nvcomp.codec.cpu import CpuZstdEngine
from lightning_nvcomp.codec.engine import ChunkEngine
from lightning_nvcomp.codec.gpu import NvcompEngine, gpu_available, gpu_missing
from lightning_nvcomp.codec.schema import CODECS, Layout
from lightning_nvcomp.errors import CodecUnavailableError

#: Default segment size: the bytes coded by one engine call (nvCOMP calls have a fixed cost, up to ~20 ms for Zstd)
#: and the GPU scratch a save borrows (planes + compressed output, about 2x this).
SEGMENT_NBYTES = 256 << 20
#: On the CPU, segments are coded in parallel on threads: smaller ones keep every core busy.
CPU_SEGMENT_NBYTES = 16 << 20


def segment_nbytes(device: torch.device, codec: str) -> int:
    """The default segment size of a buffer on ``device`` coded with ``codec``: :data:`SEGMENT_NBYTES` where it is
    coded on a GPU, at most :data:`CPU_SEGMENT_NBYTES` on the CPU."""
    return default_segment(codes_on_gpu(engine_for(codec, device), device))


def codes_on_gpu(engine: ChunkEngine | None, device: torch.device) -> bool:
    """Whether data on ``device`` is coded on a GPU (gANS codes CPU data there; raw stays where it is)."""
    return engine.device_type == "cuda" if engine is not None else device.type == "cuda"


def default_segment(on_gpu: bool) -> int:
    return SEGMENT_NBYTES if on_gpu else min(SEGMENT_NBYTES, CPU_SEGMENT_NBYTES)


def engine_for(codec: str, device: torch.device) -> ChunkEngine | None:
    """The engine that codes ``codec`` for data on ``device`` (None for ``"raw"``).

    Raises CodecUnavailableError for gANS without a GPU and nvCOMP.
    """
    if codec == "raw":
        return None
    if codec == "ans":
        if not gpu_available():
            raise CodecUnavailableError(
                f"gANS needs a CUDA GPU and nvCOMP; on this machine {gpu_missing()}. gANS has no CPU coder"
            )
        return _nvcomp_engine()
    if codec == "zstd":
        return _nvcomp_engine() if device.type == "cuda" and gpu_available() else _cpu_engine()
    raise ValueError(f"unknown codec {codec!r}; expected one of {CODECS}")


def engine_on(device: torch.device) -> ChunkEngine:
    """The engine that decodes on ``device``: nvCOMP on a GPU, CPU zstd otherwise."""
    return _nvcomp_engine() if device.type == "cuda" else _cpu_engine()


def _cpu_engine() -> ChunkEngine:
    return shared("cpu-zstd-engine", CpuZstdEngine)


def _nvcomp_engine() -> ChunkEngine:
    return shared("nvcomp-engine", NvcompEngine)


def decodes_on_gpu_only(codecs: Collection[str]) -> bool:
    """Whether a record coded with ``codecs`` (one per byte plane) decodes on a GPU whatever its target: gANS has no
    CPU decoder."""
    return "ans" in codecs


def work_device(layout: Layout, meta: dict, device: torch.device) -> torch.device:
    """Where a record bound for ``device`` decodes: gANS on a GPU (the target's, else the current one), zstd on the
    target's GPU when it is one, anything else on the CPU. CodecUnavailableError for gANS without a GPU."""
    coded = set(layout.codecs) - {"raw"}
    if decodes_on_gpu_only(coded):
        if not gpu_available():
            raise CodecUnavailableError(
                f"data compressed with gANS (nvCOMP {meta.get('nvcomp')}) needs a CUDA GPU and nvCOMP to decode; on "
                f"this machine {gpu_missing()}. gANS has no CPU decoder: load it on a GPU machine, or convert it there once: "
                "lightning-nvcomp convert IN OUT --codec zstd"
            )
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    if coded and device.type == "cuda" and gpu_available():
        return device
    return torch.device("cpu")
