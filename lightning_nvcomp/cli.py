"""The ``lightning-nvcomp`` command line (also ``python -m lightning_nvcomp``).

Commands:

* ``inspect FILE``: what a checkpoint holds (tensors, codecs, compression ratios), without decoding anything.
* ``verify FILE``: decode every record and check every checksum.
* ``convert IN OUT --codec {zstd,ans,none,torch}``: rewrite a checkpoint with another codec (``torch``: a plain
  torch.save file).

Exit status: 0 success; 1 the file is missing or damaged; 2 it cannot be processed on this machine (gANS records
without a CUDA GPU and nvCOMP, refused by ``weights_only``, over the decode limit, out of memory, a device error),
or the command line is wrong.

Each command is one ``cmd_*`` function taking the parsed arguments and returning the exit status; all of them
are registered in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from lightning_nvcomp import __version__, container
from lightning_nvcomp import estimate as costs
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.container import DTYPES, TensorInfo
from lightning_nvcomp.errors import CheckpointError, CodecUnavailableError, CorruptCheckpointError
from lightning_nvcomp.storage import atomic_write

PROG = "lightning-nvcomp"
#: Rows ``inspect`` shows without ``--all``.
DEFAULT_ROWS = 40
#: Exit status when a file cannot be processed on this machine (as opposed to 1: the file is bad).
EXIT_UNAVAILABLE = 2


@dataclass(frozen=True)
class _Entry:
    """One tensor of a checkpoint and the record (or plain storage) that holds it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    codec: str
    holder: tuple[str, int]  # identity of the record or storage, shared by the tensors it holds
    raw_nbytes: int  # of the whole record or storage
    stored_nbytes: int

    @property
    def ratio(self) -> float:
        return self.raw_nbytes / self.stored_nbytes if self.stored_nbytes else 1.0


@dataclass(frozen=True)
class _Survey:
    """What :func:`container.describe` tells about a checkpoint, flattened."""

    entries: list[_Entry]
    gans_writers: list[str]  # nvCOMP versions that wrote the gANS records; empty if there are none

    def holders(self) -> dict[tuple[str, int], _Entry]:
        """One entry per record or storage: the first tensor held by each."""
        first: dict[tuple[str, int], _Entry] = {}
        for entry in self.entries:
            first.setdefault(entry.holder, entry)
        return first

    def raw_nbytes(self, compressed_only: bool = False) -> int:
        return sum(e.raw_nbytes for key, e in self.holders().items() if not compressed_only or key[0] == "record")

    def stored_nbytes(self) -> int:
        return sum(e.stored_nbytes for e in self.holders().values())


def _walk(obj: object) -> Iterator[tuple[str, TensorInfo | torch.Tensor]]:
    """Each TensorInfo and dense tensor reachable through dicts, lists and tuples, once, with its dotted path."""
    seen: set[int] = set()
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        item, path = stack.pop()
        if id(item) in seen:
            continue
        if isinstance(item, TensorInfo) or (isinstance(item, torch.Tensor) and item.layout == torch.strided):
            seen.add(id(item))
            yield path or "<root>", item
        elif isinstance(item, (Mapping, list, tuple)):
            seen.add(id(item))
            pairs = item.items() if isinstance(item, Mapping) else enumerate(item)
            stack.extend(reversed([(value, f"{path}.{key}" if path else str(key)) for key, value in pairs]))


def _codec_label(rec: dict) -> str:
    """``zstd``, ``ans+raw 4 planes``, ``ans <f4``: the record's codecs (``raw`` last) and its layout."""
    label = "+".join(sorted(set(rec["codecs"]), key=lambda codec: (codec == "raw", codec)))
    if rec["data_type"] != "|u1":
        return f"{label} {rec['data_type']}"
    return f"{label} {rec['planes']} planes" if rec["planes"] > 1 else label


def _survey(path: str) -> _Survey:
    """Describe ``path``, decoding nothing."""
    structure = container.describe(path)  # records are validated: their fields can be trusted below
    entries, writers = [], set()
    for name, item in _walk(structure):
        if isinstance(item, torch.Tensor):  # stored by plain torch.save
            storage = item.untyped_storage()
            dtype = str(item.dtype).removeprefix("torch.")
            nbytes = item.numel() * item.element_size()
            holder = ("storage", storage._cdata)
            held = storage.nbytes()
            entries.append(_Entry(name, dtype, tuple(item.shape), nbytes, "torch", holder, held, held))
            continue
        rec = item.record
        codec, raw = _codec_label(rec), rec["nbytes"]
        if "ans" in rec["codecs"]:
            writers.add(str(rec.get("nvcomp") or "unknown"))
        nbytes = math.prod(item.shape) * DTYPES[item.dtype].itemsize
        holder = ("record", id(rec))
        entries.append(_Entry(name, item.dtype, item.shape, nbytes, codec, holder, raw, item.stored_nbytes))
    return _Survey(entries, sorted(writers))


def _size(nbytes: float) -> str:
    """``812 B``, ``4.1 kB``, ``12.3 MB``, ``1.20 GB`` (decimal units)."""
    for unit in ("B", "kB", "MB", "GB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.2f} TB"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; those in ``right`` right-aligned."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in (header, *rows)
    ]
    return "\n".join(line.rstrip() for line in lines)


def _dtype_totals(survey: _Survey) -> list[list[str]]:
    """Rows of (dtype, tensors, raw, stored, ratio), each record or storage counted once, then the total."""
    count = Counter(e.dtype for e in survey.entries)
    raw: Counter[str] = Counter()
    stored: Counter[str] = Counter()
    for entry in survey.holders().values():
        raw[entry.dtype] += entry.raw_nbytes
        stored[entry.dtype] += entry.stored_nbytes
    totals = [(dtype, count[dtype], raw[dtype], stored[dtype]) for dtype in sorted(count)]
    totals.append(("total", len(survey.entries), survey.raw_nbytes(), survey.stored_nbytes()))
    return [[d, str(n), _size(r), _size(s), f"{r / s if s else 1.0:.2f}"] for d, n, r, s in totals]


@contextlib.contextmanager
def _decode_progress(total: int, quiet: bool) -> Iterator[None]:
    """A progress bar on stderr over the raw bytes of the records decoded in this context."""
    disable = True if quiet or not total else None  # None: tqdm disables itself when stderr is not a TTY
    with tqdm(total=total, unit="B", unit_scale=True, desc="decoding", leave=False, disable=disable) as bar:
        token = container.report_progress(bar.update)
        try:
            yield
        finally:
            container._progress.reset(token)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the tensors of a checkpoint with their codecs and ratios, and totals by dtype."""
    survey = _survey(args.file)
    entries = sorted(survey.entries, key=lambda e: e.nbytes, reverse=True)
    shown = entries if args.all else entries[:DEFAULT_ROWS]
    rows = [[e.name, e.dtype, str(list(e.shape)), _size(e.nbytes), e.codec, f"{e.ratio:.2f}"] for e in shown]
    print(_table(["tensor", "dtype", "shape", "size", "codec", "ratio"], rows, right={3, 5}))
    if len(shown) < len(entries):
        print(f"... {len(entries) - len(shown)} smaller tensors not shown (--all lists every tensor)")
    print()
    print(_table(["dtype", "tensors", "raw", "stored", "ratio"], _dtype_totals(survey), right={1, 2, 3, 4}))
    print()
    file_nbytes = os.path.getsize(args.file)
    raw = survey.raw_nbytes()
    print(f"file: {args.file}, {_size(file_nbytes)}; raw tensor bytes / file size: {raw / file_nbytes:.2f}")
    if survey.gans_writers:
        print(f"gANS records written by nvCOMP {', '.join(survey.gans_writers)} (decoding them needs a CUDA GPU)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Decode every record of a checkpoint and check every checksum: 0 intact, 1 damaged, 2 cannot be checked here."""
    survey = _survey(args.file)
    compressed = survey.raw_nbytes(compressed_only=True)
    with _decode_progress(compressed, args.quiet):
        container.load(args.file, map_location="cpu")
    checked = "checksums and decode verified" if compressed else "plain torch.save file, zip checksums verified"
    print(f"OK: {len(survey.entries)} tensors, {_size(survey.raw_nbytes())} raw, {checked}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Load a checkpoint (verified: damaged input is refused) and save it again with another codec."""
    if os.path.realpath(args.input) == os.path.realpath(args.output):
        return _error(f"{args.input} and {args.output} are the same file: convert to a new path", 1)
    if args.codec == "ans" and not gpu_available():
        raise CodecUnavailableError("--codec ans needs a CUDA GPU and nvCOMP (pip install 'lightning-nvcomp[cu12]')")
    if args.device == "cuda" and not torch.cuda.is_available():
        return _error("--device cuda: no CUDA GPU is available here", EXIT_UNAVAILABLE)
    begin = time.perf_counter()
    survey = _survey(args.input)
    device = args.device or ("cuda" if survey.gans_writers and args.codec not in ("none", "torch") and gpu_available() else "cpu")
    with _decode_progress(survey.raw_nbytes(compressed_only=True), args.quiet):
        obj = container.load(args.input, map_location=device)
    if args.codec == "torch":
        size = atomic_write(args.output, lambda f: torch.save(obj, f))
        codec = "plain torch.save"
    else:
        stats = container.save(obj, args.output, codec=args.codec)
        size, codec = stats.file_nbytes, stats.codec
    before = os.path.getsize(args.input)
    print(
        f"converted {args.input} -> {args.output} ({codec}): {_size(before)} -> {_size(size)} "
        f"({before / size:.2f}x), {time.perf_counter() - begin:.1f} s"
    )
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """Print what synchronous checkpoints cost in idle GPU time and dollars, uncompressed and with each codec."""
    result = costs.estimate(
        args.params, args.gpus, args.storage_gbps, args.interval_min, args.gpu_hour_usd,
        precision=args.precision, optimizer=args.optimizer, master_weights=args.master_weights,
        gradients=args.gradients, mtbf_hours=args.mtbf_hours, ratios=dict(args.ratio or []),
    )
    print(costs.render(result))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Probe the directory, calibrate the codecs, print predicted and measured save times per codec."""
    from lightning_nvcomp import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: one subcommand per ``cmd_*`` function, each setting ``run`` to it."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify and convert lossless compressed PyTorch checkpoints (nvCOMP gANS / zstd).",
        epilog="Exit status: 0 success, 1 file missing or damaged, 2 cannot be processed on this machine "
        "(gANS without a CUDA GPU) or bad arguments.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    progress = argparse.ArgumentParser(add_help=False)
    progress.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar (it is also off when stderr is not a terminal)"
    )

    inspect = commands.add_parser(
        "inspect",
        help="list tensors, codecs and compression ratios (decodes nothing)",
        description="List a checkpoint's tensors (largest first) with dtype, shape, size, codec and the compression "
        "ratio of the record holding them, then totals by dtype. Reads only the file's structure.",
    )
    inspect.add_argument("file", help="checkpoint written by lightning_nvcomp or plain torch.save")
    inspect.add_argument("--all", action="store_true", help=f"list every tensor, not only the {DEFAULT_ROWS} largest")
    inspect.set_defaults(run=cmd_inspect)

    verify = commands.add_parser(
        "verify",
        parents=[progress],
        help="decode every tensor and check every checksum",
        description="Fully decode a checkpoint on the CPU (gANS records on the GPU) and check every checksum (the "
        "zip's CRC-32s for a plain torch.save file). Exits 0 if intact, 1 if missing or damaged, 2 if it cannot be "
        "checked here (gANS records and no CUDA GPU, refused by weights_only, too large to decode, out of "
        "memory...).",
    )
    verify.add_argument("file", help="checkpoint to verify")
    verify.set_defaults(run=cmd_verify)

    convert = commands.add_parser(
        "convert",
        parents=[progress],
        help="rewrite a checkpoint with another codec",
        description="Load a checkpoint (verified: a damaged one is refused, nothing is written) and save it with "
        "another codec, e.g. gANS -> zstd on a GPU machine so that it loads anywhere, or -> torch for a plain "
        "torch.save file that needs no lightning_nvcomp.",
    )
    convert.add_argument("input", metavar="IN", help="checkpoint to read")
    convert.add_argument("output", metavar="OUT", help="file to write (replaced atomically; must differ from IN)")
    convert.add_argument(
        "--codec",
        required=True,
        choices=[c for c in container.SAVE_CODECS if c != "auto"] + ["torch"],
        help="zstd: loads anywhere, GPU or CPU; ans: nvCOMP gANS, fastest, needs a GPU to write and to read; "
        "none: uncompressed, checksummed; torch: a plain torch.save file that loads without lightning_nvcomp "
        "(and without checksums on its tensors)",
    )
    convert.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="where tensors are decoded and re-encoded (default: cuda if IN holds gANS records, a GPU is "
        "available and --codec is not none or torch, else cpu; a torch file records this device)",
    )
    convert.set_defaults(run=cmd_convert)

    estimate = commands.add_parser(
        "estimate",
        help="estimate idle GPU time and dollars spent on checkpoints, uncompressed vs gANS / zstd",
        description="Estimate the checkpoint size by component, the GPU time a synchronous save leaves idle and what "
        "it costs per month, uncompressed and with each codec (ratios measured on an H200, "
        "benchmarks/results/codec.md), and with --mtbf-hours the Young/Daly interval and the work lost to failures. "
        "Units: sizes in GiB (2^30 bytes), storage bandwidth in GiB/s. The defaults are the published case "
        "(70B, bf16-mixed, AdamW, gradients included: ~782 GiB, ~156 s at 5 GiB/s). Assumes a sharded save "
        "(each GPU compresses its own shard) with compression hidden behind the write; a month is 30 days.",
    )
    estimate.add_argument("--params", type=costs.arg_params, default=70e9,
                          help="model parameters, e.g. 70e9 or 70B (default: 70e9)")
    estimate.add_argument("--gpus", type=costs.arg_positive_int, default=128,
                          help="GPUs in the job, all idle during a save (default: 128)")
    estimate.add_argument("--storage-gbps", type=costs.arg_positive_float, default=5.0, metavar="GIB_PER_S",
                          help="aggregate storage bandwidth shared by all GPUs, read as GiB/s (2^30 bytes/s), "
                          "used for writes and restart reads (default: 5)")
    estimate.add_argument("--interval-min", type=costs.arg_positive_float, default=30.0, metavar="MIN",
                          help="minutes between checkpoints (default: 30)")
    estimate.add_argument("--gpu-hour-usd", type=costs.arg_positive_float, default=4.40, metavar="USD",
                          help="price of one GPU-hour in dollars (default: 4.40)")
    estimate.add_argument("--optimizer", choices=costs.OPTIMIZERS, default="adamw",
                          help="adamw: fp32 m and v (8 bytes/param); sgd: fp32 momentum (4); none (default: adamw)")
    estimate.add_argument("--precision", choices=costs.PRECISIONS, default="bf16-mixed",
                          help="bf16-mixed: bf16 weights and gradients; fp32: fp32 weights and gradients; fp8: fp8 "
                          "weights, bf16 gradients (default: bf16-mixed)")
    estimate.add_argument("--master-weights", action="store_true",
                          help="add fp32 master weights (4 bytes/param), as real mixed precision keeps; off by "
                          "default to match the published case; no effect with fp32")
    estimate.add_argument("--no-grads", dest="gradients", action="store_false",
                          help="leave gradients out (the published case includes them; Lightning checkpoints don't)")
    estimate.add_argument("--mtbf-hours", type=costs.arg_positive_float, metavar="H",
                          help="mean time between failures of the whole job, hours: adds the Young/Daly interval "
                          "sqrt(2 * write time * MTBF) and the work lost per failure (half an interval + the "
                          "restart read) and per month")
    estimate.add_argument("--ratio", type=costs.arg_ratio, action="extend", nargs="+", metavar="CODEC=R",
                          help="whole-checkpoint compression ratio replacing a measured default (gans or ans, "
                          "zstd) or adding a codec (any other name, e.g. blog=1.18); R > 0")
    estimate.set_defaults(run=cmd_estimate)

    bench = commands.add_parser(
        "bench",
        help="measure a checkpoint directory and the codecs; predict and time a save with each",
        description="Probe the write bandwidth of DIR (write + fsync), calibrate every codec available here on a "
        "trained-like state (or --state FILE), print the predicted save time of each codec next to a measured "
        "save, and the codec that codec='auto' would choose.",
    )
    bench.add_argument("--dir", required=True, help="the checkpoint directory to measure")
    bench.add_argument("--state", help="a checkpoint to calibrate on instead of a generated state")
    bench.add_argument("--state-mb", type=costs.arg_positive_int, default=512, help="size of the generated state (MB)")
    bench.add_argument("--probe-mb", type=costs.arg_positive_int, default=256, help="size of the storage probe (MB)")
    bench.add_argument("--throttle-mbps", type=costs.arg_positive_float, help="hold writes to this many MB/s (emulate slow storage)")
    bench.add_argument("--mode", choices=("sync", "async"), default="sync", help="which save time matters")
    bench.add_argument("--interval-s", type=costs.arg_positive_float, help="seconds between saves (async mode)")
    bench.add_argument("--device", choices=("cpu", "cuda"), help="where the state lives (default: cuda if present)")
    bench.add_argument("--no-measure", action="store_true", help="predict only; do not time real saves")
    bench.set_defaults(run=cmd_bench)
    return parser


def _error(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); return the exit status: 1 for a missing or
    damaged file, 2 for anything that keeps it from being processed here (see the module docstring)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (CorruptCheckpointError, FileNotFoundError, IsADirectoryError) as err:
        return _error(str(err), 1)
    except CheckpointError as err:  # not damage: a codec missing here, weights_only, the decode limit
        return _error(str(err), EXIT_UNAVAILABLE)
    except (OSError, MemoryError, RuntimeError, ValueError) as err:  # the machine, not the file
        return _error(f"{type(err).__name__}: {err}", EXIT_UNAVAILABLE)
