"""Training time lost to checkpointing in a Lightning fit (issue 15): a GPT trained on the standard library's sources
with AdamW, a checkpoint every N steps (``ModelCheckpoint(every_n_train_steps=N)``, the newest one kept), through each
checkpoint IO. Lost time = the fit's wall time over the same fit without checkpoints, both in fresh processes on the
same storage (the last save's write included: every IO's teardown waits for it).

    python benchmarks/steady_bench.py --json benchmarks/results/steady/latest-gpu.json
    python benchmarks/steady_bench.py --cgroup /sys/fs/cgroup/lnv --label "200 MB/s" --out /tmp/throttled.md

The result (``--json``) keeps every save's ``nvcomp/`` metrics of our IOs and the step it was made at: the savings
over the run that ``benchmarks/report.py`` plots.

``--cgroup DIR``: each fit's process moves itself into that cgroup (v2) first, so an ``io.max`` set there throttles
its writes, page-cache writeback included. Each fit is its own process: a first save pays what it pays in a real run
(CUDA and nvCOMP set-up, pinned memory, the probe).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))

#: name -> (checkpoint IO, lightning_nvcomp keyword arguments or None for Lightning's own)
IOS: dict[str, tuple[str, dict | None]] = {
    "TorchCheckpointIO": ("torch", None),
    "AsyncCheckpointIO": ("torch-async", None),
    "ours ans sync": ("ours", {"codec": "ans"}),
    "ours ans async": ("ours", {"codec": "ans", "async_save": True}),
    "ours zstd sync": ("ours", {"codec": "zstd"}),
    "ours zstd async": ("ours", {"codec": "zstd", "async_save": True}),
    "ours none sync": ("ours", {"codec": "none"}),
    "ours none async": ("ours", {"codec": "none", "async_save": True}),
    "ours auto sync": ("ours", {"codec": "auto"}),
    "ours auto async": ("ours", {"codec": "auto", "async_save": True}),
    "ours ans sync durable=os": ("ours", {"codec": "ans", "durable": "os"}),
    "ours ans sync durable=sync": ("ours", {"codec": "ans", "durable": "sync"}),
    "ours auto async durable=sync": ("ours", {"codec": "auto", "async_save": True, "durable": "sync"}),
    "ours ans async durable=os": ("ours", {"codec": "ans", "async_save": True, "durable": "os"}),
    "ours auto async durable=os": ("ours", {"codec": "auto", "async_save": True, "durable": "os"}),
    "ours auto sync durable=os": ("ours", {"codec": "auto", "durable": "os"}),
    # deltas against the previous checkpoint (DeltaOptions' fields): every save after the first is one
    "ours ans sync delta": ("ours", {"codec": "ans", "delta": {"keyframe_every": 8}}),
    "ours ans async delta": ("ours", {"codec": "ans", "async_save": True, "delta": {"keyframe_every": 8}}),
    "ours zstd sync delta": ("ours", {"codec": "zstd", "delta": {"keyframe_every": 8}}),
    "ours zstd async delta": ("ours", {"codec": "zstd", "async_save": True, "delta": {"keyframe_every": 8}}),
}
CODECS = {0.0: "none", 1.0: "zstd", 2.0: "ans"}  # nvcomp/codec_id


def child(args: argparse.Namespace) -> None:
    """One fit in this process; prints its figures as one JSON line."""
    if args.cgroup:
        pathlib.Path(args.cgroup, "cgroup.procs").write_text(str(os.getpid()))
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("lightning_nvcomp.auto.policy").setLevel(logging.INFO)  # auto's retries and corrections
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
    from lightning_gpt import GPTModule, RandomWindows
    from torch.utils.data import DataLoader

    import lightning_nvcomp

    from gpt import stdlib_corpus

    kind, kwargs = IOS[args.io] if args.io != "no checkpoints" else ("none", None)
    blocked: list[float] = []
    steps: list[int] = []  # the global step of each save
    spent: dict[str, float] = {"hook": 0.0, "remove": 0.0, "teardown": 0.0}  # the training thread's seconds there

    def timed(name: str, method):  # noqa: ANN001, ANN202
        def call(*a, **k):  # noqa: ANN002, ANN003, ANN202
            begin = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                spent[name] += time.perf_counter() - begin

        return call

    class Timed(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):  # noqa: ANN001
            begin = time.perf_counter()
            super().save_checkpoint(checkpoint, path, storage_options)
            blocked.append(time.perf_counter() - begin)

    plugins = []
    if kind == "torch":
        plugins = [Timed()]
    elif kind == "torch-async":
        plugins = [AsyncCheckpointIO(Timed())]  # blocked here = the background write; timed around fit below
    elif kind == "ours":
        delta = kwargs.get("delta")
        options = {**kwargs, "delta": lightning_nvcomp.DeltaOptions(**delta)} if delta else kwargs
        plugins = [lightning_nvcomp.NvcompCheckpointIO(**options)]
    torch.manual_seed(0)
    module = GPTModule(dim=args.dim, layers=args.layers, heads=args.dim // 64, warmup_steps=10)
    corpus = stdlib_corpus(16 << 20)
    data = DataLoader(RandomWindows(corpus, 257, args.batch, seed=0, rank=0, start=0), batch_size=None)
    root = pathlib.Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    callbacks = [] if kind == "none" else [ModelCheckpoint(dirpath=root, every_n_train_steps=args.every, save_top_k=1)]
    for callback in callbacks:  # its saves and removals, as the training thread waits for them
        callback.on_train_batch_end = timed("hook", callback.on_train_batch_end)
    for plugin in plugins:
        plugin.remove_checkpoint = timed("remove", plugin.remove_checkpoint)
        plugin.teardown = timed("teardown", plugin.teardown)
        plugin.save_checkpoint = stepped(plugin.save_checkpoint, steps)
    if kind == "ours":
        callbacks.append(lightning_nvcomp.NvcompSavings())
    trainer = L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=1,
        precision=args.precision,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=kind != "none",
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        plugins=plugins,
    )
    saves: list[dict] = []
    if kind == "ours":
        saves = plugins[0].savings.history  # each save's metrics, "nvcomp/" prefixed
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    begin = time.perf_counter()
    trainer.fit(module, data)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    fit_s = time.perf_counter() - begin
    files = sorted(root.glob("*.ckpt")) if root.exists() else []
    result = {
        "io": args.io,
        "fit_s": fit_s,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0,
        "size_gb": files[-1].stat().st_size / 1e9 if files else 0.0,
        "saves": len(saves) if kind == "ours" else len(blocked),
        "blocked_s": [s["nvcomp/blocked_s"] for s in saves] if kind == "ours" else blocked,
        "waited_s": [s.get("nvcomp/waited_s", 0.0) for s in saves],
        "durable_s": [s.get("nvcomp/durable_s") for s in saves],
        "codecs": [CODECS.get(s["nvcomp/codec_id"], "?") for s in saves],
        "slowdown": [s.get("nvcomp/slowdown") for s in saves],
        "slowed_s": [s.get("nvcomp/slowed_s", 0.0) for s in saves],
        "spent_s": spent,
        "steps": steps,
        "metrics": [{k.removeprefix("nvcomp/"): v for k, v in s.items()} for s in saves],
    }
    print("RESULT " + json.dumps(result), flush=True)


def stepped(save, steps: list[int]):  # noqa: ANN001, ANN201
    """``save`` (a CheckpointIO's save_checkpoint), appending each checkpoint's global step to ``steps``."""

    def call(checkpoint, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        steps.append(checkpoint.get("global_step", -1))
        return save(checkpoint, *args, **kwargs)

    return call


def run_fit(io: str, args: argparse.Namespace) -> dict | None:
    cmd = [sys.executable, __file__, "--child", "--io", io, "--dir", args.dir, "--dim", str(args.dim)]
    cmd += ["--layers", str(args.layers), "--steps", str(args.steps), "--every", str(args.every)]
    cmd += ["--batch", str(args.batch), "--precision", args.precision]
    if args.cgroup:
        cmd += ["--cgroup", args.cgroup]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.fit_timeout_s)
    except subprocess.TimeoutExpired:
        print(f"{io}: killed after {args.fit_timeout_s} s", file=sys.stderr)
        return None
    if args.log:
        with open(args.log, "a") as log:
            kept = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "lightning_nvcomp" in ln or "auto:" in ln]
            log.write(f"## {io}\n" + "\n".join(kept) + "\n")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    print(f"{io}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def _fmt(values: list) -> str:
    shown = [f"{v:.2f}" for v in values if v is not None]
    return " / ".join(shown) if shown else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--io", default="no checkpoints")
    parser.add_argument("--ios", default=",".join(IOS), help="comma-separated names of IOS to run")
    parser.add_argument("--dir", default="/tmp/lnv-steady")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--cgroup", default=None)
    parser.add_argument("--label", default="local disk")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of fits (see the table's description)")
    parser.add_argument("--budget-s", type=float, default=1e9, help="start no fit after this many seconds")
    parser.add_argument("--fit-timeout-s", type=float, default=None, help="kill a fit that runs longer")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None, help="write the result here as JSON (benchmarks/report.py)")
    parser.add_argument("--log", default=None, help="append each fit's lightning_nvcomp lines to this file")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    begin = time.perf_counter()
    ios = args.ios.split(",")
    bases: list[dict] = []  # each round's fit without checkpoints
    runs: dict[str, list[dict]] = {io: [] for io in ios}  # each IO's fits, with "lost_s" against their round's
    for rnd in range(args.repeat):
        order = ["no checkpoints", *ios] if rnd % 2 == 0 else [*reversed(ios), "no checkpoints"]
        fits = {}
        for io in order:
            if time.perf_counter() - begin > args.budget_s:
                print(f"budget spent: round {rnd + 1} from {io} on not run", file=sys.stderr)
                break
            row = run_fit(io, args)
            if row is not None:
                fits[io] = row
                print(f"round {rnd + 1}, {io}: fit {row['fit_s']:.2f} s, blocked {_fmt(row['blocked_s'])}", flush=True)
        base = fits.pop("no checkpoints", None)
        if base is None:
            if not bases:
                raise SystemExit("the fit without checkpoints failed")
            base = bases[-1]
        bases.append(base)
        for io, row in fits.items():
            runs[io].append({**row, "lost_s": row["fit_s"] - base["fit_s"]})
    rows = [(fits[-1], [f["lost_s"] for f in fits]) for fits in runs.values() if fits]
    base = bases[0]
    import torch

    import lightning_nvcomp
    from lightning_nvcomp.codec.gpu import nvcomp_version

    from common import write_result

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    lines = [
        f"# Time lost to checkpointing in a Lightning fit: {args.label}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {device}; torch {torch.__version__}; "
        f"nvCOMP {nvcomp_version()}; lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT dim {args.dim}, {args.layers} layers, AdamW, {args.precision}, batch {args.batch}x256 bytes "
        f"of the standard library's sources; {args.steps} steps, a checkpoint every {args.every} "
        f"(ModelCheckpoint, save_top_k=1); storage: {args.label}" + (f" (cgroup {args.cgroup})" if args.cgroup else ""),
        f"- the fit without checkpoints: {_fmt([b['fit_s'] for b in bases])} s, peak GPU "
        f"{base['peak_gb']:.2f} GB; {len(bases)} round(s), each the fit without checkpoints and every IO once, in reverse "
        "order every other round. Lost = fit wall time minus that round's fit without checkpoints (median, then each "
        "round's); the other columns are of the last round's fit; blocked = each save_checkpoint call (AsyncCheckpointIO: its background writes, not what "
        "training waited); durable = until the checkpoint was fsynced (ours; Lightning's IOs never fsync); extra "
        "GPU = peak GPU memory above the fit without checkpoints; slowdown = how much longer training steps took "
        "while our writes ran behind them than while none did, as each save reported it (nvcomp/slowdown), and "
        "slowed = what that cost over the run as our metrics count it (nvcomp/slowed_s); in the hook / removing / "
        "teardown = the training thread's seconds in ModelCheckpoint's on_train_batch_end (the saves and the pruning "
        "of the older checkpoint), in the IO's remove_checkpoint (part of the hook's) and in its teardown",
        "",
        "| checkpoint IO | lost s | blocked s per save | waited s | durable s | codecs | slowdown per save | slowed s | "
        "in the hook / removing / teardown s | extra GPU GB | file GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, lost in rows:
        each = f" ({' / '.join(f'{x:+.2f}' for x in lost)})" if len(lost) > 1 else ""
        lines.append(
            f"| {r['io']} | {statistics.median(lost):+.2f}{each} | {_fmt(r['blocked_s'])} | "
            f"{sum(r['waited_s']):.2f} | {_fmt(r['durable_s'])} | {','.join(sorted(set(r['codecs']))) or '-'} | "
            f"{_fmt(r.get('slowdown', []))} | {sum(r.get('slowed_s', [])):.2f} | "
            f"{_fmt([r['spent_s'][k] for k in ('hook', 'remove', 'teardown')]) if 'spent_s' in r else '-'} | "
            f"{r['peak_gb'] - base['peak_gb']:.2f} | {r['size_gb']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(text)
    write_result(
        args.json,
        "steady",
        setup=f"byte-level GPT dim {args.dim}, {args.layers} layers, AdamW, {args.precision}, batch {args.batch}x256 "
        f"bytes of the standard library's sources; {args.steps} steps, a checkpoint every {args.every} "
        f"(ModelCheckpoint, save_top_k=1); storage: {args.label}",
        repetitions=len(bases),
        statistic=f"{len(bases)} round(s) of fresh-process fits, each IO once per round (in reverse order every other "
        "round); lost = fit time minus the round's fit without checkpoints, the median over the rounds; per-save "
        "figures of the last round",
        rows=[
            {
                "io": r["io"],
                "lost_s": statistics.median(lost),
                "lost_s_rounds": lost,
                "extra_gpu_gb": r["peak_gb"] - base["peak_gb"],
                **{k: r[k] for k in ("saves", "steps", "blocked_s", "waited_s", "durable_s", "codecs", "size_gb")},
                **{k: r[k] for k in ("slowdown", "slowed_s", "spent_s", "metrics")},
            }
            for r, lost in rows
        ],
        no_checkpoints_fit_s=[b["fit_s"] for b in bases],
        every=args.every,
        steps=args.steps,
        storage=args.label,
    )


if __name__ == "__main__":
    main()
