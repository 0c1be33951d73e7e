"""Tensor bytes <-> compressed chunks: byte planes, chunk engines (nvCOMP on the GPU, zstd on the CPU), records."""

from lightning_nvcomp.codec.gpu import gpu_available, nvcomp_version
from lightning_nvcomp.codec.record import decode, encode
from lightning_nvcomp.codec.schema import CODECS, FORMAT_VERSION, validate

__all__ = ["CODECS", "FORMAT_VERSION", "decode", "encode", "gpu_available", "nvcomp_version", "validate"]
