"""Codec benchmark on a GPT trained on real text: ratio per tensor class against the order-0 byte-plane bound,
against gANS on raw bytes and CPU zstd, and encode/decode throughput. Writes a Markdown report, and with --json its
result (each class's figures, the whole file's, and the whole state's for benchmarks/before_after.py), which
benchmarks/report.py turns into BENCHMARKS.md.

    python benchmarks/codec_bench.py --steps 300 --json benchmarks/results/codec/latest-gpu.json     # on a GPU
    python benchmarks/codec_bench.py --device cpu --dim 256 --layers 4 --steps 100                   # CPU only
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import torch
import zstandard

import lightning_nvcomp
from lightning_nvcomp import _process as resources
from lightning_nvcomp.codec import engines, layouts, planes, record, segment
from lightning_nvcomp.codec.gpu import gpu_available, nvcomp_version

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import sync, trained_gpt, write_result  # noqa: E402
from gpt import state_by_class  # noqa: E402


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    """Median wall seconds of ``fn()`` over ``repeat`` runs after one warm-up, and its last result."""
    result = fn()
    times = []
    for _ in range(repeat):
        sync()
        begin = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - begin)
    return statistics.median(times), result


def plane_bound(data: torch.Tensor, width: int) -> float:
    """Order-0 byte-plane bound: raw bits over the sum of each plane's exact entropy (whole buffer)."""
    rows = data.view(-1, width)
    bits = 0.0
    for k in range(width):
        counts = torch.bincount(rows[:, k].to(torch.int64), minlength=256).double()
        p = counts[counts > 0] / rows.shape[0]
        bits += float(-(p * p.log2()).sum())
    return 8 * width / bits


def gpu_codec_rows(data: torch.Tensor, dtype: torch.dtype, codec: str) -> dict:
    """Ratio and kernel-level GB/s (planes + nvCOMP, one batch over the whole buffer) for our GPU path."""
    engine = engines.engine_for(codec, data.device)
    layout = layouts.choose_layout(engine, data, dtype, codec)
    enc_s, pieces = timed(lambda: segment.encode_segment(engine, data, layout))
    stored = segment.pack(pieces)
    sizes = [p.numel() for p in pieces]
    out = torch.empty_like(data)
    dec_s, _ = timed(lambda: segment.decode_segment(engine, stored, sizes, [(0, out)], out.numel(), layout))
    assert torch.equal(out, data), f"{codec} round trip is not bit-exact"
    return {
        "ratio": data.numel() / stored.numel(),
        "enc": data.numel() / enc_s / 1e9,
        "dec": data.numel() / dec_s / 1e9,
        "layout": f"{layout.planes}p {layout.data_type.lstrip('|')} {'/'.join(layout.codecs)}",
    }


def end_to_end(data: torch.Tensor, dtype: torch.dtype, codec: str, repeat: int = 1) -> dict:
    """record.encode/decode as a save and a load run them: segments, device-to-host copies and checksums."""
    enc_s, (blobs, meta) = timed(lambda: record.encode(data, dtype, codec), repeat=repeat)
    dec_s, back = timed(lambda: record.decode(blobs, meta, data.device), repeat=repeat)
    assert torch.equal(back, data), f"{codec} end-to-end round trip is not bit-exact"
    return {
        "ratio": data.numel() / sum(b.numel() for b in blobs),
        "enc": data.numel() / enc_s / 1e9,
        "dec": data.numel() / dec_s / 1e9,
    }


def ans_raw_bytes(data: torch.Tensor) -> tuple[float, float]:
    """gANS on the raw bytes (the nvCOMP blog's way): ratio and GB/s."""
    engine = engines.engine_for("ans", data.device)
    spans = [(o, min(1 << 20, data.numel() - o)) for o in range(0, data.numel(), 1 << 20)]
    secs, coded = timed(lambda: engine.encode(data, spans, "ans", "|u1"))
    return data.numel() / sum(c.numel() for c in coded), data.numel() / secs / 1e9


class Throughput:
    """Encode and decode GB/s of a whole state, from its classes' rows: raw bytes over the seconds summed."""

    def __init__(self) -> None:
        self.nbytes, self.enc_s, self.dec_s = 0, 0.0, 0.0

    def add(self, nbytes: int, row: dict) -> None:
        self.nbytes += nbytes
        self.enc_s += nbytes / row["enc"] / 1e9
        self.dec_s += nbytes / row["dec"] / 1e9

    def gbps(self) -> tuple[float, float]:
        return self.nbytes / self.enc_s / 1e9, self.nbytes / self.dec_s / 1e9


def cpu_rows(data_cpu: torch.Tensor, dtype: torch.dtype, threads: int) -> dict:
    os.environ["LIGHTNING_NVCOMP_THREADS"] = str(threads)
    resources.reset()  # a CPU engine with the new thread count
    row = end_to_end(data_cpu, dtype, "zstd", repeat=5)  # small buffers: take the median of five
    del os.environ["LIGHTNING_NVCOMP_THREADS"]
    resources.reset()  # a CPU engine with the new thread count
    return row


def chunk_sweep(classes: dict[str, torch.Tensor]) -> list[str]:
    """Kernel-level gANS / Zstd GB/s and ratio per uncompressed chunk size (what CHUNK_NBYTES trades)."""
    lines = ["| class | codec | chunk KiB | ratio | enc GB/s | dec GB/s |", "|---|---|---|---|---|---|"]
    saved = dict(layouts.CHUNK_NBYTES)
    for name in ("bf16 w", "adam m"):
        data = classes[name].contiguous().view(torch.uint8)
        for codec, sizes in (("ans", (1024, 4096, 16384)), ("zstd", (64, 128, 256))):
            for kib in sizes:
                layouts.CHUNK_NBYTES[(codec, "cuda")] = kib << 10
                row = gpu_codec_rows(data, classes[name].dtype, codec)
                lines.append(f"| {name} | {codec} | {kib} | {row['ratio']:.3f} | {row['enc']:.1f} | {row['dec']:.1f} |")
                print(lines[-1], flush=True)
    layouts.CHUNK_NBYTES.update(saved)
    return lines


def profile_encode(data: torch.Tensor, dtype: torch.dtype, codec: str) -> None:
    import cProfile
    import pstats

    record.encode(data, dtype, codec)
    prof = cProfile.Profile()
    prof.enable()
    record.encode(data, dtype, codec)
    sync()
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(18)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--cpu-sample-mb", type=int, default=256, help="bytes of each class coded on the CPU")
    parser.add_argument("--out", default=None, help="write the Markdown report here too")
    parser.add_argument("--json", default=None, help="write the result here as JSON (benchmarks/report.py)")
    parser.add_argument("--state-cache", default=None, help="folder keeping the trained state between runs")
    parser.add_argument("--sweep", action="store_true", help="also sweep GPU chunk sizes")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one end-to-end encode")
    args = parser.parse_args()
    device = args.device
    gpu = device == "cuda" and gpu_available()

    model, opt = trained_gpt(args.dim, args.layers, args.steps, args.batch, device, args.state_cache)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT {n_params / 1e6:.1f}M params, {args.steps} steps on the standard library's sources")
    classes = {name: torch.cat([t.reshape(-1) for t in ts]) for name, ts in state_by_class(model, opt).items()}

    if args.profile and gpu:
        profile_encode(classes["adam m"].view(torch.uint8), torch.float32, "ans")
        profile_encode(classes["bf16 w"].view(torch.uint8), torch.bfloat16, "ans")
    sweep = chunk_sweep(classes) if args.sweep and gpu else []
    info = {
        "device": f"{torch.cuda.get_device_name() if device == 'cuda' else platform.processor() or 'cpu'}; "
        f"host cores: {os.cpu_count()}",
        "versions": f"torch {torch.__version__}, nvCOMP {nvcomp_version()}, zstandard {zstandard.__version__}, "
        f"lightning_nvcomp {lightning_nvcomp.__version__}",
        "state": f"byte-level GPT, {n_params / 1e6:.1f}M params, trained {args.steps} AdamW steps on the Python "
        "standard library's sources",
    }
    lines = [
        "# Codec benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- device: {info['device']}",
        f"- {info['versions']}",
        f"- state: {info['state']}",
        "",
        "Ratio = raw bytes / stored bytes; % bound = our gANS ratio / order-0 byte-plane bound. GB/s are of raw "
        "bytes. GPU kernel GB/s = byte planes + nvCOMP over the whole class buffer in one batch; end-to-end adds "
        "segmenting, device-to-host copies and CRC-32 (what a save pays before writing).",
        "",
    ]
    header = "| class | MB | bound | ours gANS | % bound | ANS raw bytes | ours GPU zstd | ours CPU zstd | zstd-1 raw bytes (CPU) |"
    rows = [header, "|" + "---|" * 9]
    speed = [
        "| class | gANS layout | gANS enc GB/s | gANS dec GB/s | zstd enc GB/s | zstd dec GB/s | "
        "gANS e2e enc/dec GB/s | zstd e2e enc/dec GB/s | CPU zstd 1 thread GB/s | CPU zstd all threads GB/s |",
        "|" + "---|" * 10,
    ]
    classes_out = []  # each class's figures, for the JSON
    whole: dict[str, Throughput] = collections.defaultdict(Throughput)  # per codec path, over the classes
    cctx = zstandard.ZstdCompressor(level=1)
    for name, data_typed in classes.items():
        dtype = data_typed.dtype
        data = data_typed.contiguous().view(torch.uint8)
        width = planes.plane_width(dtype)
        bound = plane_bound(data, width)
        mb = data.numel() / 1e6
        cpu_n = min(data.numel(), args.cpu_sample_mb << 20) // 64 * 64
        data_cpu = data[:cpu_n].cpu()
        cpu1 = cpu_rows(data_cpu, dtype, 1)
        cpun = cpu_rows(data_cpu, dtype, os.cpu_count() or 1)
        zstd_raw = cpu_n / len(cctx.compress(data_cpu.numpy()))
        whole["CPU zstd 1 thread"].add(cpu_n, cpu1)
        whole["CPU zstd all threads"].add(cpu_n, cpun)
        figures = {
            "class": name,
            "mb": mb,
            "bound": bound,
            "cpu_sample_mb": cpu_n / 1e6,
            "cpu_zstd_ratio": cpu1["ratio"],
            "zstd1_raw_ratio": zstd_raw,
            "cpu_zstd_1thread_enc_gbps": cpu1["enc"],
            "cpu_zstd_1thread_dec_gbps": cpu1["dec"],
            "cpu_zstd_threads_enc_gbps": cpun["enc"],
            "cpu_zstd_threads_dec_gbps": cpun["dec"],
        }
        if gpu:
            ans = gpu_codec_rows(data, dtype, "ans")
            zst = gpu_codec_rows(data, dtype, "zstd")
            ans_e2e = end_to_end(data, dtype, "ans")
            zst_e2e = end_to_end(data, dtype, "zstd")
            raw_ratio, _ = ans_raw_bytes(data)
            kernel_and_e2e = {
                "gANS kernel": ans,
                "zstd kernel": zst,
                "gANS end-to-end": ans_e2e,
                "zstd end-to-end": zst_e2e,
            }
            for path, row in kernel_and_e2e.items():
                whole[f"GPU {path}"].add(data.numel(), row)
            figures |= {
                "ans_ratio": ans["ratio"],
                "ans_raw_ratio": raw_ratio,
                "gpu_zstd_ratio": zst["ratio"],
                "ans_layout": ans["layout"],
                "ans_enc_gbps": ans["enc"],
                "ans_dec_gbps": ans["dec"],
                "gpu_zstd_enc_gbps": zst["enc"],
                "gpu_zstd_dec_gbps": zst["dec"],
                "ans_e2e_enc_gbps": ans_e2e["enc"],
                "ans_e2e_dec_gbps": ans_e2e["dec"],
                "gpu_zstd_e2e_enc_gbps": zst_e2e["enc"],
                "gpu_zstd_e2e_dec_gbps": zst_e2e["dec"],
            }
            rows.append(
                f"| {name} | {mb:.0f} | {bound:.3f} | {ans['ratio']:.3f} | {100 * ans['ratio'] / bound:.1f}% | "
                f"{raw_ratio:.3f} | {zst['ratio']:.3f} | {cpu1['ratio']:.3f} | {zstd_raw:.3f} |"
            )
            speed.append(
                f"| {name} | {ans['layout']} | {ans['enc']:.0f} | {ans['dec']:.0f} | {zst['enc']:.1f} | "
                f"{zst['dec']:.1f} | {ans_e2e['enc']:.1f} / {ans_e2e['dec']:.1f} | "
                f"{zst_e2e['enc']:.1f} / {zst_e2e['dec']:.1f} | {cpu1['enc']:.2f} | {cpun['enc']:.2f} |"
            )
        else:
            rows.append(f"| {name} | {mb:.0f} | {bound:.3f} | - | - | - | - | {cpu1['ratio']:.3f} | {zstd_raw:.3f} |")
            speed.append(f"| {name} | - | - | - | - | - | - | - | {cpu1['enc']:.2f} | {cpun['enc']:.2f} |")
        classes_out.append(figures)
        print(rows[-1], flush=True)
        print(speed[-1], flush=True)
    lines += rows + [""] + speed + [""]
    if sweep:
        lines += ["GPU chunk-size sweep (kernel level):", ""] + sweep + [""]
    if gpu:
        (ans_enc, ans_dec), (zstd_enc, zstd_dec) = whole["GPU gANS kernel"].gbps(), whole["GPU zstd kernel"].gbps()
        lines.append(
            f"Whole state ({whole['GPU gANS kernel'].nbytes / 1e9:.2f} GB): gANS encode {ans_enc:.0f} GB/s, decode "
            f"{ans_dec:.0f} GB/s; GPU zstd encode {zstd_enc:.1f} GB/s, decode {zstd_dec:.1f} GB/s."
        )
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        sizes = []
        for _ in range(2):
            begin = time.perf_counter()
            torch.save(state, os.path.join(tmp, "plain.ckpt"))
            plain_s = time.perf_counter() - begin
        sizes.append(("torch.save", os.path.getsize(os.path.join(tmp, "plain.ckpt")), plain_s))
        for codec in ["ans", "zstd"] if gpu else ["zstd"]:
            path = os.path.join(tmp, f"{codec}.ckpt")
            first = lightning_nvcomp.save(state, path, codec=codec)
            again = lightning_nvcomp.save(state, path, codec=codec)
            sizes.append((f"lightning_nvcomp.save(codec={codec!r})", again.file_nbytes, again.seconds, first.seconds))
            if args.profile:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.runcall(lightning_nvcomp.save, state, path, codec=codec)
                pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    lines += [
        "",
        "Whole checkpoint file (model + AdamW state), written twice to the local disk (the first save also "
        "allocates pinned host memory):",
        "",
        "| writer | size MB | ratio vs torch.save | seconds | first save s |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {w} | {s / 1e6:.1f} | {sizes[0][1] / s:.3f} | {t[0]:.2f} | {t[-1]:.2f} |" for w, s, *t in sizes]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(report)
    figures = {}  # the whole state's, flat: what benchmarks/before_after.py compares
    for path, speed in whole.items():
        figures[f"{path} encode GB/s"], figures[f"{path} decode GB/s"] = speed.gbps()
    for writer, nbytes, seconds, *_ in sizes:
        figures[f"{writer} s"], figures[f"{writer} file MB"] = seconds, nbytes / 1e6
    write_result(
        args.json,
        "codec",
        setup=f"{info['state']}; {len(classes)} tensor classes of its checkpoint, each coded as one buffer; CPU rows on "
        f"the first {args.cpu_sample_mb} MiB of each class",
        repetitions=3,
        statistic="median of 3 after a warm-up (CPU zstd: of 5; the whole-file saves: the second of two)",
        rows=classes_out,
        files=[
            {"writer": w, "mb": s / 1e6, "ratio": sizes[0][1] / s, "save_s": t[0], "first_save_s": t[-1]}
            for w, s, *t in sizes
        ],
        figures=figures,
        info=info,
    )


if __name__ == "__main__":
    main()
