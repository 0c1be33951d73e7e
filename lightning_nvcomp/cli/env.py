"""``lightning-nvcomp env``: what this environment offers the package (torch and the CUDA version it is built for,
the GPU, nvCOMP, zstandard, Lightning and Accelerate), the codecs that run here, and the one install line that fits
it."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform

import torch

from lightning_nvcomp._version import __version__
from lightning_nvcomp.cli.common import PROG, add_command
from lightning_nvcomp.cli.table import table
from lightning_nvcomp.codec.gpu import NVCOMP_PACKAGES, GpuSupport, gpu_support

#: The command's line in the top-level help, and its own help's description.
SUMMARY = "report torch, CUDA, the GPU, nvCOMP and the frameworks here, and the install line that fits"
DESCRIPTION = (
    "Report the versions this package works with here (torch and the CUDA version it is built for, the GPU, nvCOMP, "
    "zstandard, Lightning, Accelerate), the codecs that run on this machine, and the one install line that fits it "
    "(the nvCOMP wheel matching torch's CUDA version)."
)

#: The frameworks reported, by distribution name, if installed.
FRAMEWORKS = ("lightning", "pytorch-lightning", "accelerate", "fsspec")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``env`` command to the top-level parser's ``subparsers``."""
    add_command(subparsers, "env", run, SUMMARY, DESCRIPTION)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu(support: GpuSupport) -> str:
    if support.cuda_available:
        count = torch.cuda.device_count()
        return f"{torch.cuda.get_device_name(0)}" + (f" (and {count - 1} more)" if count > 1 else "")
    return "none (torch is a CPU-only build)" if support.torch_cuda is None else "none visible to torch"


def _nvcomp(support: GpuSupport) -> str:
    packages = f" ({', '.join(support.nvcomp_packages)})" if support.nvcomp_packages else ""
    if support.nvcomp_version is not None:
        return f"{support.nvcomp_version}{packages}"
    if support.nvcomp_error is not None:
        return f"installed{packages} but fails to load: {support.nvcomp_error}"
    return "not installed"


def report(support: GpuSupport) -> list[str]:
    """The report's lines for these facts (the versions of the other packages are this process's)."""
    build = f"built for CUDA {support.torch_cuda}" if support.torch_cuda else "CPU-only build"
    rows = [
        [PROG, __version__],
        ["python", platform.python_version()],
        ["torch", f"{support.torch_version} ({build})"],
        ["CUDA GPU", _gpu(support)],
        ["nvCOMP", _nvcomp(support)],
        ["zstandard", _version("zstandard") or "not installed (the CPU codec needs it)"],
        ["crc32c", _version("crc32c") or "not installed (records' checksums need it)"],
    ]
    rows += [[name, version] for name in FRAMEWORKS if (version := _version(name)) is not None]
    ready = support.missing() is None
    return [
        table(["package", "version"], rows),
        "",
        "codecs here: ans and zstd on the GPU, zstd on the CPU, none"
        if ready
        else "codecs here: zstd on the CPU, none (ans needs a CUDA GPU and nvCOMP)",
        f"install: {install_advice(support)}",
    ]


def install_advice(support: GpuSupport) -> str:
    """The one install line that fits this environment, or why there is nothing to install."""
    fitting = NVCOMP_PACKAGES.get(support.cuda_major or "")
    if support.nvcomp_version is None or support.torch_cuda is None or fitting is None:
        return support.install_line()
    others = [p for p in support.nvcomp_packages if p != fitting]
    if others:
        return f"{support.install_line()}: {', '.join(others)} is installed, built for another CUDA version"
    if not support.cuda_available:
        return f"nothing (nvCOMP fits this torch), but {support.missing()}"
    return "nothing (nvCOMP fits this torch)"


def run(args: argparse.Namespace) -> int:
    """Print the report of this environment."""
    print("\n".join(report(gpu_support())))
    return 0
