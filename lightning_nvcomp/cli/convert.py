"""``lightning-nvcomp convert IN OUT --codec C``: rewrite a checkpoint with another codec, or as plain torch.save."""

from __future__ import annotations

import argparse
import os
import time

import torch

from lightning_nvcomp.cli.checkpoint import Survey, load, survey
from lightning_nvcomp.cli.common import EXIT_BAD_FILE, EXIT_UNAVAILABLE, add_command, fail
from lightning_nvcomp.cli.table import size
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.options import CONCRETE_CODECS, Codec
from lightning_nvcomp.saving import single_file as saving
from lightning_nvcomp.storage import is_url, storage_for
from lightning_nvcomp.telemetry.stats import ratio

#: What ``--codec`` accepts: every codec ``save`` writes by name, and ``torch`` for a plain torch.save file.
CODECS = [c.value for c in CONCRETE_CODECS] + ["torch"]


#: The command's line in the top-level help, and its own help's description.
SUMMARY = "rewrite a checkpoint with another codec"
DESCRIPTION = (
    "Load a checkpoint (verified: a damaged one is refused, nothing is written) and save it with another codec, "
    "e.g. gANS -> zstd on a GPU machine so that it loads anywhere, or -> torch for a plain torch.save file that "
    "needs no lightning_nvcomp."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``convert`` command to the top-level parser's ``subparsers``."""
    parser = add_command(subparsers, "convert", run, SUMMARY, DESCRIPTION, progress=True)
    parser.add_argument("input", metavar="IN", help="checkpoint to read (a path or a URL)")
    parser.add_argument(
        "output", metavar="OUT", help="file to write, a path or a URL (replaced atomically; must differ from IN)"
    )
    parser.add_argument(
        "--codec",
        required=True,
        choices=CODECS,
        help="zstd: loads anywhere, GPU or CPU; ans: nvCOMP gANS, fastest, needs a GPU to write and to read; "
        "none: uncompressed, checksummed; torch: a plain torch.save file that loads without lightning_nvcomp "
        "(and without checksums on its tensors)",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="where tensors are decoded and re-encoded (default: cuda if IN holds gANS records, a GPU is "
        "available and --codec is not none or torch, else cpu; a torch file records this device)",
    )


def _same_file(a: str, b: str) -> bool:
    """Whether the paths (or URLs) ``a`` and ``b`` name one file."""
    if is_url(a) or is_url(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _device(args: argparse.Namespace, surveyed: Survey) -> str:
    """``--device``, or by default cuda when gANS records are re-encoded on a machine that can decode them."""
    if args.device:
        return args.device
    compressing = args.codec not in ("none", "torch")
    return "cuda" if surveyed.gans_writers and compressing and gpu_available() else "cpu"


def _save(obj: object, args: argparse.Namespace) -> tuple[int, str]:
    """Write ``obj`` to ``args.output`` with ``args.codec``: (file size, what wrote it)."""
    if args.codec == "torch":
        return storage_for(args.output).write(args.output, lambda f: torch.save(obj, f)), "plain torch.save"
    stats = saving.save(obj, args.output, codec=args.codec)
    return stats.file_nbytes, stats.codec


def run(args: argparse.Namespace) -> int:
    """Load a checkpoint (verified: damaged input is refused) and save it again with another codec."""
    if _same_file(args.input, args.output):
        return fail(f"{args.input} and {args.output} are the same file: convert to a new path", EXIT_BAD_FILE)
    if args.codec == "ans":
        Codec.ANS.require_available("--codec ans")
    if args.device == "cuda" and not torch.cuda.is_available():
        return fail("--device cuda: no CUDA GPU is available here", EXIT_UNAVAILABLE)
    begin = time.perf_counter()
    surveyed = survey(args.input)
    obj = load(surveyed, _device(args, surveyed), args.quiet)
    after, codec = _save(obj, args)
    before = storage_for(args.input).size(args.input)
    needs = surveyed.chain()
    alone = f"; it stands alone (the input needed {', '.join(needs)})" if needs else ""
    print(
        f"converted {args.input} -> {args.output} ({codec}): {size(before)} -> {size(after)} "
        f"({ratio(before, after):.2f}x), {time.perf_counter() - begin:.1f} s{alone}"
    )
    return 0
