"""Remote storage benchmark: Lightning checkpoints saved to and loaded from S3 (a moto server on localhost, over
HTTP, through s3fs), ours (zstd and none) against Lightning's TorchCheckpointIO through fsspec, on the state of a
byte-level GPT trained on the standard library's sources (real weights and AdamW moments, not random), and the
bandwidth the storage probe reports there.

    python benchmarks/remote_bench.py --json benchmarks/results/remote/latest-cpu.json

The moto server runs in a process of its own (``python -m moto.server``) on the same CPU cores as the coder, so its
figures are those of a local S3 emulator, not of a real object store: they show the code path (multipart parts in
parallel, parallel ranged reads) and its relative cost, not a cloud's bandwidth.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from common import publish, same_bytes, write_result  # noqa: E402
from gpt import GPT, stdlib_corpus, train  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, timeout_s: float = 60) -> None:
    """Wait until the server accepts connections on ``port``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"moto did not start on port {port}")


def _tensors(checkpoint: dict) -> list[torch.Tensor]:
    import lightning_nvcomp

    return lightning_nvcomp.format.find_contents(checkpoint).tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--part-mb", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None, help="write the result here as JSON (benchmarks/report.py)")
    args = parser.parse_args()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for(port)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    import fsspec
    import lightning
    import moto
    import s3fs
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    import lightning_nvcomp
    from lightning_nvcomp.auto.policy import CodecPolicy
    from lightning_nvcomp.storage.remote import RemoteOptions

    fs = fsspec.filesystem("s3")
    bucket = "lnv-bench"
    fs.mkdir(bucket)
    remote = RemoteOptions(part_nbytes=args.part_mb << 20, max_parallel=args.parallel)

    torch.manual_seed(0)
    model = GPT(dim=args.dim, layers=args.layers, heads=max(1, args.dim // 64))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT {n_params / 1e6:.1f}M params, training {args.steps} steps on the CPU", flush=True)
    opt = train(model, stdlib_corpus(8 << 20), args.steps, 8, "cpu", log_every=10)
    checkpoint = {
        "state_dict": model.state_dict(),
        "optimizer_states": [opt.state_dict()],
        "global_step": args.steps,
        "epoch": 0,
    }
    expected = _tensors(checkpoint)
    raw_mb = sum(t.numel() * t.element_size() for t in expected) / 1e6

    probe = CodecPolicy(probe_nbytes=256 << 20, remote=remote)
    begin = time.perf_counter()
    probe_gbps = probe.write_gbps(f"s3://{bucket}/probe", int(raw_mb * 1e6))
    probe_s = time.perf_counter() - begin
    leftovers = fs.ls(bucket)
    print(f"probe: {probe_gbps * 1e3:.0f} MB/s ({probe_s:.2f} s); objects left: {leftovers}", flush=True)

    methods = {
        "TorchCheckpointIO (fsspec)": TorchCheckpointIO,
        "NvcompCheckpointIO(zstd)": lambda: lightning_nvcomp.NvcompCheckpointIO("zstd", probe_mb=64, remote=remote),
        "NvcompCheckpointIO(none)": lambda: lightning_nvcomp.NvcompCheckpointIO("none", probe_mb=64, remote=remote),
    }
    rows = []
    for i, (name, make) in enumerate(methods.items()):
        io = make()
        url = f"s3://{bucket}/run/method{i}.ckpt"
        saves, loads = [], []
        for _ in range(args.repeats + 1):  # the first round warms up (ours: the probe, the pools)
            begin = time.perf_counter()
            io.save_checkpoint(checkpoint, url)
            saves.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            loaded = io.load_checkpoint(url)
            loads.append(time.perf_counter() - begin)
            assert same_bytes(expected, _tensors(loaded)), f"{name}: the load is not bit-exact"
        size_mb = fs.size(f"{bucket}/run/method{i}.ckpt") / 1e6
        io.teardown()
        save_s, load_s = statistics.median(saves[1:]), statistics.median(loads[1:])
        rows.append((name, size_mb, save_s, load_s, saves[0]))
        print(name, f"{size_mb:.1f} MB", f"save {save_s:.3f} s", f"load {load_s:.3f} s", flush=True)
    uploads = fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])
    server.terminate()
    server.wait(30)

    lines = [
        "# Remote storage: Lightning checkpoints on S3 (moto on localhost)",
        "",
        f"{datetime.date.today().isoformat()}; `python benchmarks/remote_bench.py --steps {args.steps} --dim {args.dim} "
        f"--layers {args.layers} --repeats {args.repeats} --part-mb {args.part_mb} --parallel {args.parallel}`",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU; Python {platform.python_version()}, "
        f"torch {torch.__version__}, lightning {lightning.__version__}, lightning-nvcomp {lightning_nvcomp.__version__}, "
        f"fsspec {fsspec.__version__}, s3fs {s3fs.__version__}, moto {moto.__version__}",
        f"- state: byte-level GPT, {n_params / 1e6:.1f}M parameters, {args.steps} AdamW steps on the standard "
        f"library's sources (fp32 weights and moments): {raw_mb:.1f} MB of tensors",
        f"- storage: moto's server in a process of its own (`python -m moto.server`, HTTP on 127.0.0.1), s3fs; our "
        f"uploads in {args.part_mb} MiB parts, {args.parallel} at once; reads in {args.part_mb} MiB ranges",
        f"- probe (`CodecPolicy.write_gbps` of the bucket, bounded by the checkpoint's size): "
        f"**{probe_gbps * 1e3:.0f} MB/s** ({probe_s:.2f} s, including the object's delete); objects left after it: "
        f"{len(leftovers)}",
        f"- median of {args.repeats} saves and loads after one warm-up round; every load checked bit-exact; "
        f"multipart uploads left at the end: {len(uploads)}",
        "",
        "| checkpoint IO | object MB | ratio | save s | load s | first save s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = rows[0][1]
    for name, size_mb, save_s, load_s, first_s in rows:
        lines.append(f"| {name} | {size_mb:.1f} | {base / size_mb:.3f} | {save_s:.3f} | {load_s:.3f} | {first_s:.3f} |")
    lines += [
        "",
        "The server shares the CPU cores with the coder and with the client: zstd's coding time counts fully "
        "here, where a real object store's bandwidth would make the smaller object the faster one only when the "
        "link is slower than the coder (see README, *Choosing the codec*).",
    ]
    publish(lines, args.out)
    write_result(
        args.json,
        "remote",
        setup=f"byte-level GPT, {n_params / 1e6:.1f}M parameters, {args.steps} AdamW steps on the standard library's "
        f"sources: {raw_mb:.1f} MB of tensors; S3 = moto's server (a process of its own on this machine, HTTP on "
        f"127.0.0.1) through s3fs; our uploads in {args.part_mb} MiB parts, {args.parallel} at once",
        repetitions=args.repeats,
        statistic=f"median of {args.repeats} saves and loads after a warm-up round; every load checked bit-exact",
        rows=[
            {
                "io": name,
                "mb": size_mb,
                "ratio": base / size_mb,
                "save_s": save_s,
                "load_s": load_s,
                "first_save_s": first,
            }
            for name, size_mb, save_s, load_s, first in rows
        ],
        probe_mbps=probe_gbps * 1e3,
        probe_s=probe_s,
        multipart_uploads_left=len(uploads),
    )


if __name__ == "__main__":
    main()
