"""Write BENCHMARKS.md and its plots from the benchmarks' results: ``benchmarks/results/<benchmark>/latest-*.json``, the
latest run of each benchmark as its script wrote it with ``--json`` (a GPU and a CPU run as separate files,
``latest-gpu.json`` and ``latest-cpu.json``). One table per result, with its hardware, versions, date, repetitions and
the command that reruns it; the plots go to ``benchmarks/results/plots/`` and ``docs/savings.png``.

    python benchmarks/report.py            # write BENCHMARKS.md and draw the plots (needs matplotlib)
    python benchmarks/report.py --check    # exit 1 when BENCHMARKS.md or benchmarks/results/ is not what the results give

``--check`` (CI) compares the Markdown text only and checks that every plot it shows exists, and that
``benchmarks/results/`` holds nothing but the results and those plots: it needs neither matplotlib nor a rerun.
"""

from __future__ import annotations

import argparse
import difflib
import json
import pathlib
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PLOTS = RESULTS / "plots"
OUTPUT = ROOT / "BENCHMARKS.md"
#: The README's picture: the savings over a run, drawn from the steady-state result of a GPU run if there is one.
SAVINGS = ROOT / "docs" / "savings.png"
#: The result layout this script reads: ``common.SCHEMA``, which ``common.write_result`` writes.
SCHEMA = 1
#: The keys every result has (``common.write_result``).
REQUIRED = (
    "schema",
    "benchmark",
    "date",
    "command",
    "repetitions",
    "statistic",
    "hardware",
    "versions",
    "setup",
    "rows",
)

Row = dict[str, object]
Draw = Callable[[pathlib.Path], None]


class ResultError(Exception):
    """A result file that this script cannot read: it names the file and what is wrong."""


@dataclass(frozen=True)
class Column:
    """One column of a table: its header, its value in a row (None: no value, shown as "-"), the value's format, and
    whether it is a GPU's figure (left out of a CPU run's table)."""

    header: str
    value: Callable[[Row], object]
    spec: str = ""
    gpu: bool = False


def key(name: str) -> Callable[[Row], object]:
    """A column's value: the row's ``name``."""
    return lambda row: row.get(name)


def pair(first: str, second: str) -> Callable[[Row], object]:
    """A column's value: the row's ``first`` and ``second`` (e.g. encode and decode GB/s), or None without them."""
    return lambda row: None if row.get(first) is None else (row[first], row.get(second))


def cell(value: object, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**NO**"
    if isinstance(value, tuple):
        return " / ".join(cell(v, spec) for v in value)
    if isinstance(value, float):
        return format(value, spec)
    return str(value).replace("|", "\\|")


def table(columns: list[Column], rows: list[Row], result: dict) -> list[str]:
    """A Markdown table of ``rows`` of ``result``; a column without a value in any row is left out, and so are the GPU
    columns of a CPU run."""
    on_gpu = result["hardware"]["accelerator"] == "GPU"
    values = [[column.value(row) for column in columns] for row in rows]
    shown = [i for i, c in enumerate(columns) if (on_gpu or not c.gpu) and any(v[i] is not None for v in values)]
    return [
        "| " + " | ".join(columns[i].header for i in shown) + " |",
        "|" + "---|" * len(shown),
        *("| " + " | ".join(cell(v[i], columns[i].spec) for i in shown) + " |" for v in values),
    ]


def median(values: list) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def ratio(part: object, whole: object) -> float | None:
    return part / whole if isinstance(part, (int, float)) and isinstance(whole, (int, float)) and whole else None


# The benchmarks: their tables, headline and plots.


def codec_tables(result: dict) -> list[str]:
    rows = result["rows"]
    ratios = table(
        [
            Column("tensor class", key("class")),
            Column("MB", key("mb"), ".1f"),
            Column("order-0 bound", key("bound"), ".3f"),
            Column("ours gANS (GPU)", key("ans_ratio"), ".3f", gpu=True),
            Column(
                "% of bound", lambda r: None if r.get("ans_ratio") is None else 100 * r["ans_ratio"] / r["bound"], ".1f"
            ),
            Column("ours zstd (GPU)", key("gpu_zstd_ratio"), ".3f", gpu=True),
            Column("ours zstd (CPU)", key("cpu_zstd_ratio"), ".3f"),
            Column("gANS on raw bytes (nvCOMP blog)", key("ans_raw_ratio"), ".3f", gpu=True),
            Column("zstd-1 on raw bytes (CPU)", key("zstd1_raw_ratio"), ".3f"),
        ],
        rows,
        result,
    )
    speeds = table(
        [
            Column("tensor class", key("class")),
            Column("gANS layout", key("ans_layout")),
            Column("gANS kernel enc / dec GB/s", pair("ans_enc_gbps", "ans_dec_gbps"), ".0f"),
            Column("GPU zstd kernel enc / dec GB/s", pair("gpu_zstd_enc_gbps", "gpu_zstd_dec_gbps"), ".1f"),
            Column("gANS save path enc / dec GB/s", pair("ans_e2e_enc_gbps", "ans_e2e_dec_gbps"), ".1f"),
            Column("GPU zstd save path enc / dec GB/s", pair("gpu_zstd_e2e_enc_gbps", "gpu_zstd_e2e_dec_gbps"), ".1f"),
            Column(
                "CPU zstd 1 thread enc / dec GB/s",
                pair("cpu_zstd_1thread_enc_gbps", "cpu_zstd_1thread_dec_gbps"),
                ".2f",
            ),
            Column(
                f"CPU zstd {result['hardware']['cores']} threads enc / dec GB/s",
                pair("cpu_zstd_threads_enc_gbps", "cpu_zstd_threads_dec_gbps"),
                ".2f",
            ),
        ],
        rows,
        result,
    )
    files = table(
        [
            Column("writer", key("writer")),
            Column("file MB", key("mb"), ".1f"),
            Column("ratio vs torch.save", key("ratio"), ".3f"),
            Column("save s", key("save_s"), ".2f"),
            Column("first save s", key("first_save_s"), ".2f"),
        ],
        result["files"],
        result,
    )
    figures = result.get("figures", {})
    whole = [
        f"{path}: encode {figures[f'{path} encode GB/s']:.1f} GB/s, decode {figures[f'{path} decode GB/s']:.1f} GB/s"
        for path in ("GPU gANS kernel", "GPU gANS end-to-end", "GPU zstd kernel", "GPU zstd end-to-end")
        if f"{path} encode GB/s" in figures
    ]
    return [
        *ratios,
        "",
        *speeds,
        "",
        *([f"The whole state, every class: {'; '.join(whole)}.", ""] if whole else []),
        "The whole checkpoint file (model + AdamW state), saved twice to the local disk (the first save also allocates "
        "pinned host memory):",
        "",
        *files,
    ]


def codec_headline(result: dict) -> str:
    best = max(result["files"], key=lambda f: f["ratio"])
    return f"checkpoint file {best['ratio']:.3f}x smaller than torch.save's with `{best['writer']}`"


def steady_row(row: Row) -> Row:
    """A steady-state row with what the table and the plots derive: lost per checkpoint, medians per save, the run's
    savings by our metrics."""
    saves = row["saves"] or None
    metrics = row.get("metrics") or []
    return {
        **row,
        "lost_per_save_s": saves and row["lost_s"] / saves,
        "blocked_median_s": median(row["blocked_s"]),
        "durable_median_s": median(row["durable_s"]),
        "codec": ",".join(sorted(set(row["codecs"]))) or None,
        "saved_total_s": metrics[-1]["saved_s_total"] if metrics else None,
        "file_mb": row["size_gb"] * 1e3,
    }


def steady_tables(result: dict) -> list[str]:
    rows = [steady_row(r) for r in result["rows"]]
    return [
        f"The fit without checkpoints took {cell(tuple(result['no_checkpoints_fit_s']), '.2f')} s "
        f"({len(result['no_checkpoints_fit_s'])} round(s)).",
        "",
        *table(
            [
                Column("checkpoint IO", key("io")),
                Column("training time lost s", key("lost_s"), "+.2f"),
                Column("lost per checkpoint s", key("lost_per_save_s"), "+.2f"),
                Column("checkpoints", key("saves")),
                Column("blocked s per save (median)", key("blocked_median_s"), ".3f"),
                Column("durable after s (median)", key("durable_median_s"), ".2f"),
                Column("codec", key("codec")),
                Column("saved s by our metrics (nvcomp/saved_s_total)", key("saved_total_s"), "+.2f"),
                Column("file MB", key("file_mb"), ".1f"),
                Column("extra GPU GB", key("extra_gpu_gb"), ".2f", gpu=True),
            ],
            rows,
            result,
        ),
    ]


def steady_headline(result: dict) -> str:
    rows = {r["io"]: steady_row(r) for r in result["rows"]}
    ours = [r for r in rows.values() if r["io"].startswith("ours")]
    if not ours:
        return "-"
    best = min(ours, key=lambda r: r["lost_s"])
    text = f"{best['io']}: {best['lost_per_save_s']:+.2f} s lost per checkpoint"
    torch = rows.get("TorchCheckpointIO")
    return text + (f" (TorchCheckpointIO {torch['lost_per_save_s']:+.2f} s)" if torch else "")


def recode_rows(result: dict) -> list[Row]:
    alone = {r["save"]: median(r["write_s"]) for r in result["rows"] if r["beside"] == "nothing"}
    return [
        {
            "save": r["save"],
            "beside": r["beside"],
            "write_s": median(r["write_s"]),
            "slower": ratio(median(r["write_s"]), alone.get(r["save"])),
            "file_mb": r["file_mb"],
            "bit_exact": r.get("bit_exact"),
        }
        for r in result["rows"]
    ]


def recode_tables(result: dict) -> list[str]:
    return [
        f"The GIL's switch interval: {result['switch_interval_s'] * 1e3:g} ms; {result['state_mb']:.0f} MB of state.",
        "",
        *table(
            [
                Column("write", key("save")),
                Column("beside it", key("beside")),
                Column("write s", key("write_s"), ".3f"),
                Column("x the same write with nothing beside it", key("slower"), ".1f"),
                Column("file MB", key("file_mb"), ".1f"),
                Column("bit-exact", key("bit_exact")),
            ],
            recode_rows(result),
            result,
        ),
    ]


def recode_headline(result: dict) -> str:
    rows = {(r["save"], r["beside"]): r for r in recode_rows(result)}
    parts = [
        f"{save} write beside Python {rows[(save, 'python')]['write_s']:.2f} s (alone "
        f"{rows[(save, 'nothing')]['write_s']:.2f} s)"
        for save in ("delta", "standalone")
        if (save, "python") in rows and (save, "nothing") in rows
    ]
    return "; ".join(parts) or "-"


def dcp_tables(result: dict) -> list[str]:
    rows = result["rows"]
    plain = next((r for r in rows if r["method"] == "FileSystemWriter"), None)
    return table(
        [
            Column("method", key("method")),
            Column("codec", lambda r: None if r["codec"] == "-" else r["codec"]),
            Column("dcp.save s", key("save_s"), ".3f"),
            Column("vs FileSystemWriter", lambda r: ratio(r["save_s"], plain and plain["save_s"]), ".2f"),
            Column("async_save blocked s", key("blocked_s"), ".3f"),
            Column("async_save done s", key("async_s"), ".3f"),
            Column("dcp.load s", key("load_s"), ".3f"),
            Column(".distcp / file MB", lambda r: r["mb"] or None, ".1f"),
            Column("ratio", lambda r: ratio(plain and plain["mb"], r["mb"]), ".3f"),
            Column("extra GPU GB save / load", pair("extra_gpu_gb", "load_extra_gpu_gb"), ".2f", gpu=True),
            Column(
                "our pinned pool GB",
                lambda r: r.get("pool_gb") if r["method"].startswith("Nvcomp") else None,
                ".2f",
                gpu=True,
            ),
            Column("bit-exact", lambda r: r["exact"] if r["mb"] else None),
        ],
        rows,
        result,
    )


def dcp_headline(result: dict) -> str:
    rows = {r["method"]: r for r in result["rows"]}
    plain = rows.get("FileSystemWriter")
    ours = [r for r in rows.values() if r["method"].startswith("Nvcomp")]
    if not plain or not ours:
        return "-"
    best = max(ours, key=lambda r: plain["mb"] / r["mb"])
    return (
        f"{best['method']}: files {plain['mb'] / best['mb']:.3f}x smaller than FileSystemWriter's, dcp.save in "
        f"{best['save_s'] / plain['save_s']:.2f}x its time"
    )


def items_tables(result: dict) -> list[str]:
    lines = table(
        [
            Column("path", key("path")),
            Column("save s", key("save_s"), ".2f"),
            Column("load s", key("load_s"), ".2f"),
            Column("stored MB", key("mb"), ".1f"),
        ],
        result["rows"],
        result,
    )
    pairs = result.get("dcp_over_single_pairs") or []
    if pairs:
        lines += [
            "",
            f"Our `dcp.save` over our single-file save of the same state, {len(pairs)} alternating pairs: median "
            f"**{result['dcp_over_single']:.2f}x** (range {min(pairs):.2f}-{max(pairs):.2f}x).",
        ]
    return lines


def items_headline(result: dict) -> str:
    found = result.get("dcp_over_single")
    return "-" if found is None else f"{result['tensors']} tensors: our dcp.save {found:.2f}x our single-file save"


def remote_tables(result: dict) -> list[str]:
    return [
        f"The storage probe measured {result['probe_mbps']:.0f} MB/s ({result['probe_s']:.2f} s); multipart uploads "
        f"left at the end: {result['multipart_uploads_left']}.",
        "",
        *table(
            [
                Column("checkpoint IO", key("io")),
                Column("object MB", key("mb"), ".1f"),
                Column("ratio", key("ratio"), ".3f"),
                Column("save s", key("save_s"), ".3f"),
                Column("load s", key("load_s"), ".3f"),
                Column("first save s", key("first_save_s"), ".3f"),
            ],
            result["rows"],
            result,
        ),
    ]


def remote_headline(result: dict) -> str:
    best = max(result["rows"], key=lambda r: r["ratio"])
    return f"{best['io']}: objects {best['ratio']:.3f}x smaller, save {best['save_s']:.2f} s"


def accelerate_tables(result: dict) -> list[str]:
    return table(
        [
            Column("method", key("method")),
            Column("codec", lambda r: r["codec"] if r["codec"] not in ("", "-") else None),
            Column("save_state s", key("save_s"), ".2f"),
            Column("vs Accelerate", key("vs_accelerate"), ".2f"),
            Column("written GB", key("gb"), ".3f"),
            Column("ratio", key("ratio"), ".3f"),
            Column("extra GPU GB", key("extra_gpu_gb"), ".2f", gpu=True),
            Column("load_state s", key("load_s"), ".2f"),
            Column("bit-exact", key("exact")),
        ],
        result["rows"],
        result,
    )


def accelerate_headline(result: dict) -> str:
    ours = [r for r in result["rows"] if r["method"] != "Accelerate"]
    if not ours:
        return "-"
    best = min(ours, key=lambda r: r["save_s"])
    return f"{best['method']}: save_state {best['vs_accelerate']:.2f}x Accelerate's time, {best['ratio']:.3f}x smaller"


def peers_tables(result: dict) -> list[str]:
    rows = result["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    whole = {c["state"]: c for c in result["classes"] if c["whole"]}
    by_state: dict[str, Row] = {}
    for r in rows:
        by_state.setdefault(r["state"], {"state": r["state"]})[r["method"]] = r["ratio"]
    ratios = table(
        [
            Column("state", key("state")),
            *(Column(m, key(m), ".4f") for m in methods),
            Column("order-0 byte-plane bound", lambda r: whole[r["state"]]["bound"], ".4f"),
            Column("sign-rotated bound", lambda r: whole[r["state"]]["rotated_bound"], ".4f"),
        ],
        list(by_state.values()),
        result,
    )
    speeds = table(
        [
            Column("state", key("state")),
            Column("method", key("method")),
            Column("raw MB", key("raw_mb"), ".1f"),
            Column("stored MB", key("stored_mb"), ".1f"),
            Column("ratio", key("ratio"), ".4f"),
            Column("save GB/s", key("save_gbps"), ".2f"),
            Column("load GB/s", key("load_gbps"), ".2f"),
            Column("load from disk GB/s", key("cold_load_gbps"), ".2f"),
            Column("save CPU s/GB", key("save_cpu_s_per_gb"), ".2f"),
            Column("load CPU s/GB", key("load_cpu_s_per_gb"), ".2f"),
            Column("bit-exact", key("exact")),
        ],
        rows,
        result,
    )
    coders = list(dict.fromkeys(m for c in result["classes"] for m in c["ratios"]))
    classes = table(
        [
            Column("state", key("state")),
            Column("class", key("class")),
            Column("tensors", key("tensors")),
            Column("MB", key("mb"), ".2f"),
            Column("order-0 byte-plane bound", key("bound"), ".4f"),
            Column("sign-rotated bound", key("rotated_bound"), ".4f"),
            *(Column(m, lambda r, m=m: r["ratios"].get(m), ".4f") for m in coders),
        ],
        result["classes"],
        result,
    )
    return [
        "Ratio (raw tensor bytes / bytes on disk) of each state:",
        "",
        *ratios,
        "",
        "Each state and method:",
        "",
        *speeds,
        "",
        "Each tensor class, coded alone:",
        "",
        *classes,
        "",
        *(f"- {note}" for note in result["notes"]),
    ]


def peers_headline(result: dict) -> str:
    first = result["rows"][0]["state"]
    rows = {r["method"]: r for r in result["rows"] if r["state"] == first}
    ours, zipnn = rows.get("ours zstd"), rows.get("ZipNN")
    if ours is None:
        return "-"
    text = f"{first}: ours zstd {ours['ratio']:.4f}x, load {ours['load_gbps']:.2f} GB/s"
    return text + (f" (ZipNN {zipnn['ratio']:.4f}x, {zipnn['load_gbps']:.2f} GB/s)" if zipnn else "")


def delta_tables(result: dict) -> list[str]:
    rows = [
        {
            **r,
            "gain": r["delta"] / r["alone"],
            "save_x": r["save_s"]["delta"] / r["save_s"]["alone"],
            "load_x": r["load_s"]["delta"] / r["load_s"]["alone"],
            "durable_x": r["durable_s"]["delta"] / r["durable_s"]["alone"] if r.get("durable_s") else None,
        }
        for r in result["rows"]
    ]
    return table(
        [
            Column("steps apart", key("interval")),
            Column("state", key("state")),
            Column("class", key("class")),
            Column("raw MB", lambda r: r["raw_nbytes"] / 1e6, ".1f"),
            Column("alone", key("alone"), ".4f"),
            Column("delta", key("delta"), ".4f"),
            Column("delta / alone", key("gain"), ".3f"),
            Column("bound alone", key("ideal_alone"), ".4f"),
            Column("bound of the XOR", key("ideal_xor"), ".4f"),
            Column("save time, delta / alone", key("save_x"), ".2f"),
            Column("load time, delta / alone", key("load_x"), ".2f"),
            Column("time to durable on a slow disk, delta / alone", key("durable_x"), ".2f"),
            Column("bit-exact", key("bit_exact")),
        ],
        rows,
        result,
    ) + delta_memory_table(result)


def delta_memory_table(result: dict) -> list[str]:
    """The peak memory of a save and a load of the fp32 state 50 steps apart, alone and as a delta (MiB above where
    each process started; a load's includes the state it returns), under each allocator setting measured."""
    found = [r for r in result["rows"] if r.get("memory")]
    if not found:
        return []
    memory = found[0]["memory"]
    rows = [
        {"allocator": allocator, **peaks, "base": memory["base_stored_mib"]}
        for allocator, peaks in memory.items()
        if isinstance(peaks, dict)
    ]
    for row in rows:
        row["save_extra"] = row["save_delta_mib"] - row["save_alone_mib"]
        row["load_extra"] = row["load_delta_mib"] - row["load_alone_mib"]
    lines = table(
        [
            Column("allocator", key("allocator")),
            Column("save alone", key("save_alone_mib"), ".0f"),
            Column("save delta", key("save_delta_mib"), ".0f"),
            Column("save: delta's extra", key("save_extra"), ".0f"),
            Column("load alone", key("load_alone_mib"), ".0f"),
            Column("load delta", key("load_delta_mib"), ".0f"),
            Column("load: delta's extra", key("load_extra"), ".0f"),
            Column("save alone, GPU", key("save_alone_gpu_mib"), ".0f", gpu=True),
            Column("save delta, GPU", key("save_delta_gpu_mib"), ".0f", gpu=True),
            Column("load alone, GPU", key("load_alone_gpu_mib"), ".0f", gpu=True),
            Column("load delta, GPU", key("load_delta_gpu_mib"), ".0f", gpu=True),
            Column("the base stored", key("base"), ".0f"),
        ],
        rows,
        result,
    )
    return ["", "Peak memory, MiB above each process's start (the fp32 state, 50 steps apart):", "", *lines]


def delta_headline(result: dict) -> str:
    found = [r for r in result["rows"] if r["interval"] == 50 and r["class"] == "whole"]
    return "; ".join(f"{r['state']} 50 steps apart: {r['delta']:.4f}x (alone {r['alone']:.4f}x)" for r in found) or "-"


def title_of(result: dict) -> str:
    """The machine a result ran on, for a plot's title: "GPU run: NVIDIA H100 ..." or "CPU run: AMD EPYC, 2 cores"."""
    hw = result["hardware"]
    if hw["accelerator"] == "GPU":
        return f"GPU run: {hw['device']}, {hw['cores']} CPU cores"
    return f"CPU run (no GPU): {hw['cpu']}, {hw['cores']} cores"


def plot_codec(result: dict) -> Draw:
    def draw(path: pathlib.Path) -> None:
        plt = pyplot()
        series = [
            ("order-0 byte-plane bound", "bound"),
            ("ours gANS (GPU)", "ans_ratio"),
            ("ours zstd (GPU)", "gpu_zstd_ratio"),
            ("ours zstd (CPU)", "cpu_zstd_ratio"),
            ("gANS on raw bytes (nvCOMP blog)", "ans_raw_ratio"),
            ("zstd-1 on raw bytes (CPU)", "zstd1_raw_ratio"),
        ]
        rows = result["rows"]
        series = [(label, name) for label, name in series if any(r.get(name) is not None for r in rows)]
        fig, ax = plt.subplots(figsize=(9, 4.2), constrained_layout=True)
        width = 0.8 / len(series)
        for i, (label, name) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
            style = {"color": "lightgrey", "edgecolor": "grey", "hatch": "//"} if name == "bound" else {}
            ax.bar(xs, [r.get(name) or 0 for r in rows], width, label=label, **style)
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xticks(range(len(rows)), [r["class"] for r in rows])
        ax.set_ylim(0.9, None)
        ax.set(ylabel="raw bytes / stored bytes", title=f"Compression ratio per tensor class\n{title_of(result)}")
        ax.legend(fontsize="small", ncols=2)
        ax.grid(axis="y", alpha=0.3)
        save(fig, path)

    return draw


def plot_lost(result: dict) -> Draw:
    def draw(path: pathlib.Path) -> None:
        plt = pyplot()
        rows = [steady_row(r) for r in result["rows"]]
        fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.6), constrained_layout=True)
        ys = range(len(rows))
        ax.barh([y + 0.2 for y in ys], [r["lost_per_save_s"] or 0 for r in rows], 0.4, label="training time lost")
        ax.barh(
            [y - 0.2 for y in ys],
            [r["blocked_median_s"] or 0 for r in rows],
            0.4,
            label="in save_checkpoint, median (AsyncCheckpointIO: its background write)",
        )
        ax.set_yticks(list(ys), [r["io"] for r in rows])
        ax.invert_yaxis()
        ax.axvline(0, color="grey", lw=0.8)
        ax.set(xlabel="seconds per checkpoint", title=f"Time a Lightning fit loses per checkpoint\n{title_of(result)}")
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2)  # below: no bar hidden
        ax.grid(axis="x", alpha=0.3)
        save(fig, path)

    return draw


def plot_savings(result: dict) -> Draw:
    def draw(path: pathlib.Path) -> None:
        plt = pyplot()
        rows = [steady_row(r) for r in result["rows"]]
        ours = [r for r in rows if r.get("metrics")]
        torch_io = next((r for r in rows if r["io"] == "TorchCheckpointIO"), None)
        fig, (total, each) = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
        for r in ours:
            total.plot(r["steps"], [m["saved_s_total"] for m in r["metrics"]], "o-", label=r["io"])
        total.axhline(0, color="grey", lw=0.8)
        total.set(title="time saved so far (nvcomp/saved_s_total)", xlabel="step", ylabel="seconds")
        total.legend(fontsize="small")
        best = max(ours, key=lambda r: r["saved_total_s"])
        xs = range(len(best["steps"]))
        baseline = [m["baseline_s"] for m in best["metrics"]]
        lost = [m["lost_s"] for m in best["metrics"]]
        each.bar(
            [x - 0.2 for x in xs], baseline, 0.4, color="lightgrey", label="torch.save, same durability (baseline_s)"
        )
        each.bar([x + 0.2 for x in xs], lost, 0.4, label=f"{best['io']}: training time lost (lost_s)")
        shown = baseline + lost
        if torch_io and len(torch_io["blocked_s"]) == len(best["steps"]):
            each.plot(xs, torch_io["blocked_s"], "kx", label="TorchCheckpointIO's save, measured (no fsync)")
            shown += torch_io["blocked_s"]
        each.set_ylim(0, 1.45 * max(shown))  # room for the legend above the bars
        each.set_xticks(list(xs), [str(s) for s in best["steps"]])
        each.set(title="each checkpoint", xlabel="checkpoint at step", ylabel="seconds")
        each.legend(fontsize="small")
        for ax in (total, each):
            ax.grid(alpha=0.3)
        fig.suptitle(
            f"Checkpoint time saved over a Lightning fit: {title_of(result)}\na checkpoint every {result['every']} "
            f"of {result['steps']} steps, {best['metrics'][0]['raw_gb'] * 1e3:.4g} MB of tensors each; storage: "
            f"{result['storage']}",
            fontsize="small",
        )
        save(fig, path)

    return draw


def codec_plots(result: dict, variant: str) -> dict[pathlib.Path, Draw]:
    return {PLOTS / f"codec-{variant}-ratio.png": plot_codec(result)}


def steady_plots(result: dict, variant: str) -> dict[pathlib.Path, Draw]:
    plots = {PLOTS / f"steady-{variant}-lost.png": plot_lost(result)}
    if any(r.get("metrics") for r in result["rows"]):
        plots[PLOTS / f"steady-{variant}-savings.png"] = plot_savings(result)
    return plots


def no_plots(result: dict, variant: str) -> dict[pathlib.Path, Draw]:
    return {}


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its results folder, script, what it measures, and how its results are shown."""

    name: str
    title: str
    script: str
    about: str
    tables: Callable[[dict], list[str]]
    headline: Callable[[dict], str]
    plots: Callable[[dict, str], dict[pathlib.Path, Draw]] = no_plots


BENCHMARKS = (
    Benchmark(
        "codec",
        "Codec",
        "codec_bench.py",
        "The compression ratio of each tensor class of a trained GPT's checkpoint (bf16 and fp32 weights, AdamW's "
        "moments) against the order-0 entropy bound of its byte planes and against the peers (gANS on the raw bytes, "
        "as nvCOMP's blog codes them; zstd level 1 on the raw bytes), and the coders' speed: the GPU kernels alone, "
        "and the save path (segments, device-to-host copies, CRC-32). Every coded buffer is checked bit-exact.",
        codec_tables,
        codec_headline,
        codec_plots,
    ),
    Benchmark(
        "peers",
        "Peers",
        "peers_bench.py",
        "Our codecs against the peers, side by side in one run, on real states: a GPT trained on the standard "
        "library's sources (fp32 weights + AdamW moments; its weights in bf16; in FP8 scaled per tensor) and the real "
        "all-MiniLM-L6-v2 weights (fp32, bf16, FP8). The peers: ZipNN (byte grouping + Huffman), DCP's ZStandard "
        "extension, zstd and lz4 over `torch.save`'s bytes, `torch.save`, safetensors (and zstd over it). Ratio, save "
        "and load GB/s and CPU seconds per GB, every load checked bit-exact; for each tensor class, the order-0 "
        "byte-plane bound, plain and with the sign rotated out of the exponent byte.",
        peers_tables,
        peers_headline,
    ),
    Benchmark(
        "delta",
        "Delta checkpoints",
        "delta_bench.py",
        "A training run's last state (a GPT trained with AdamW on the standard library's sources) saved alone and as "
        "a delta against the states 10, 50 and 200 steps earlier (CPU zstd; on a GPU, gANS): fp32 weights and moments (whole and per "
        "class), the weights in bf16, in FP8 scaled per tensor. The bounds are the order-0 entropy of the byte planes "
        "alone (sign-rotated) and of the bits XORed with the base's; times are the delta's over the file's alone (each a median of saves or loads "
        "of the two in turns, see each run's notes). Every load is checked bit-exact.",
        delta_tables,
        delta_headline,
    ),
    Benchmark(
        "steady",
        "Lightning steady state",
        "steady_bench.py",
        "The training time a Lightning fit loses to checkpointing: the same fit with a checkpoint every N steps "
        "through each checkpoint IO, against the fit without checkpoints, each fit in a fresh process (its first save "
        "pays its set-up, its last save's write is waited for). Lost = fit time minus the fit without checkpoints; "
        "blocked = each save_checkpoint call (AsyncCheckpointIO: its background write); durable = until the "
        "checkpoint was fsynced (Lightning's own IOs never fsync); saved = what our `nvcomp/` metrics logged against "
        "an uncompressed `torch.save` of the same durability.",
        steady_tables,
        steady_headline,
        steady_plots,
    ),
    Benchmark(
        "recode",
        "Async writes beside training",
        "recode_bench.py",
        "What an async save's write costs on its writer thread: a standalone "
        "snapshot's write, and a delta's (its base decoded, each tensor's transform chosen and the delta coded on the "
        "writer thread), beside nothing, beside the main thread training the model, or beside a thread running pure "
        "Python (as a framework's loop holds the GIL between its CUDA launches). Each C call that lets the GIL go costs the writer thread up to a "
        "switch interval to take it back while another thread runs Python.",
        recode_tables,
        recode_headline,
    ),
    Benchmark(
        "dcp",
        "DCP",
        "dcp_bench.py",
        "torch.distributed.checkpoint on one rank: `dcp.save` (files fsynced), `dcp.async_save` (blocked = until it "
        "returns, done = until its future is) and `dcp.load` of a trained GPT's model + AdamW state through DCP's "
        "FileSystemWriter, DCP's ZStandard extension, our NvcompFileSystemWriter, our single-file save, and DCP's own "
        "cost (a writer that writes no item). Every load is checked bit-exact.",
        dcp_tables,
        dcp_headline,
    ),
    Benchmark(
        "dcp_items",
        "Many items through DCP",
        "dcp_items_bench.py",
        "Per-item costs: a deep, narrow GPT's state (thousands of LayerNorm- and bias-sized tensors) through DCP's "
        "writer and reader and ours, next to our single-file save and DCP's own cost. Every load is checked bit-exact.",
        items_tables,
        items_headline,
    ),
    Benchmark(
        "remote",
        "Remote storage",
        "remote_bench.py",
        "Lightning checkpoints saved to and loaded from S3 (moto's server on the same machine, through s3fs): our IO "
        "against TorchCheckpointIO through fsspec. The emulator shares the CPU cores with the coder: the figures show "
        "the code path and its relative cost, not a cloud's bandwidth. Every load is checked bit-exact.",
        remote_tables,
        remote_headline,
    ),
    Benchmark(
        "accelerate_fsdp",
        "Accelerate FSDP",
        "accelerate_fsdp_bench.py",
        "`accelerator.save_state` / `load_state` with FSDP2 sharded state dicts (AdamW, bf16 mixed precision), "
        "Accelerate's own DCP path against lightning_nvcomp attached; every rank's shards checked bit-exact after the "
        "load. Accelerate runs FSDP only on an accelerator: GPU runs only.",
        accelerate_tables,
        accelerate_headline,
    ),
)


def pyplot():  # noqa: ANN201
    """matplotlib's pyplot, drawing to files only (imported when a plot is drawn: ``--check`` needs none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: pathlib.Path) -> None:  # noqa: ANN001
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: a redraw changes only what changed
    pyplot().close(fig)


def load_results(results: pathlib.Path = RESULTS) -> dict[str, dict[str, dict]]:
    """Each benchmark's results (``latest-<variant>.json``): name -> variant (e.g. "gpu") -> result, GPU runs first,
    the plain run of each kind before its variants.

    Raises:
        ResultError: a result file is not JSON, lacks a key, has another schema or names another benchmark.
    """
    found: dict[str, dict[str, dict]] = {}
    for bench in BENCHMARKS:
        runs = {}
        for path in sorted((results / bench.name).glob("latest-*.json")):
            try:
                result = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                raise ResultError(f"{path}: not a readable JSON result ({error})") from error
            missing = [k for k in REQUIRED if k not in result]
            if missing:
                raise ResultError(f"{path}: lacks {', '.join(missing)}; rerun {bench.script} with --json")
            if result["schema"] != SCHEMA or result["benchmark"] != bench.name:
                raise ResultError(
                    f"{path}: schema {result['schema']} of benchmark {result['benchmark']!r}, where this script reads "
                    f"schema {SCHEMA} of {bench.name!r}; rerun {bench.script} with --json"
                )
            runs[path.stem.removeprefix("latest-")] = result
        # GPU runs first, and of each kind the plain run (latest-gpu) before its variants (latest-gpu-delta)
        found[bench.name] = dict(
            sorted(runs.items(), key=lambda kv: (kv[1]["hardware"]["accelerator"] != "GPU", "-" in kv[0]))
        )
    return found


def repo_path(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def describe(result: dict, path: pathlib.Path) -> list[str]:
    """The lines under a result's heading: machine, versions, date, repetitions, workload and the command."""
    hw = result["hardware"]
    gpu = (
        f"{hw['gpus']} x {hw['device']} ({hw['gpu_memory_gb']:.0f} GB); CPU: "
        if hw["accelerator"] == "GPU"
        else "no GPU; CPU: "
    )
    versions = ", ".join(f"{name} {version}" for name, version in result["versions"].items() if version is not None)
    return [
        f"- machine: {gpu}{hw['cpu']}, {hw['cores']} cores (torch threads: {hw['torch_threads']}), "
        f"{hw['memory_gb']:.0f} GB; load average "
        f"{hw['load_1min']:.2f} as it began",
        f"- versions: {versions}",
        f"- date: {result['date']}; repetitions: {result['repetitions']}; shown: {result['statistic']}",
        f"- workload: {result['setup']}",
        f"- rerun: `{result['command']} --json {repo_path(path)}`",
    ]


def link(bench: Benchmark) -> str:
    """A Markdown link to the benchmark's section (its title has letters and spaces only: one slug everywhere)."""
    return f"[{bench.title}](#{bench.title.lower().replace(' ', '-')})"


def render(results: dict[str, dict[str, dict]]) -> tuple[str, dict[pathlib.Path, Draw]]:
    """BENCHMARKS.md's text and the plots it shows (path -> how to draw it)."""
    plots: dict[pathlib.Path, Draw] = {}
    savings_drawn = False
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python benchmarks/report.py` from benchmarks/results/*/latest-*.json: rerun a benchmark "
        "(its command is under its table) and this script, do not edit by hand. CI runs `python benchmarks/report.py "
        "--check`. -->",
        "",
        "One table per benchmark run: the latest run of each benchmark, on a GPU (`bash benchmarks/gpu_all.sh` runs "
        "them all on one GPU host) and, where it runs there, on a CPU. Each result names its machine, versions, date "
        "and repetitions, and the command that reruns it. Timings on a shared machine move from run to run; ratios "
        "and file sizes do not.",
        "",
        "| benchmark | run | result |",
        "|---|---|---|",
    ]
    sections: list[str] = []
    for bench in BENCHMARKS:
        runs = results.get(bench.name, {})
        sections += ["", f"## {bench.title}", "", bench.about, ""]
        if not runs:
            sections += [
                f"No result yet: run `benchmarks/{bench.script}` with `--json` (see `benchmarks/gpu_all.sh`).",
                "",
            ]
            lines.append(f"| {link(bench)} | - | no result yet |")
        for variant, result in runs.items():
            path = RESULTS / bench.name / f"latest-{variant}.json"
            hw = result["hardware"]
            heading = f"GPU: {hw['device']}" if hw["accelerator"] == "GPU" else f"CPU: {hw['cpu']}, {hw['cores']} cores"
            lines.append(f"| {link(bench)} | {heading} | {cell(bench.headline(result), '')} |")
            sections += [f"### {heading}", "", *describe(result, path), "", *bench.tables(result), ""]
            for plot, draw in bench.plots(result, variant).items():
                plots[plot] = draw
                sections += [f"![{plot.stem}]({repo_path(plot)})", ""]
            if bench.name == "steady" and not savings_drawn and any(r.get("metrics") for r in result["rows"]):
                plots[SAVINGS] = plot_savings(result)  # GPU runs come first: the README's picture is a GPU run's if any
                savings_drawn = True
                sections += [f"`{repo_path(SAVINGS)}` (the README's picture) is this run's savings plot.", ""]
    lines += sections
    return "\n".join(lines).rstrip("\n") + "\n", plots


def stray_files(plots: dict[pathlib.Path, Draw], results: pathlib.Path = RESULTS) -> list[str]:
    """Files under ``results`` that are neither a benchmark's ``latest-*.json`` nor a plot the report shows."""
    kept = set(plots)
    for bench in BENCHMARKS:
        kept |= set((results / bench.name).glob("latest-*.json"))
    return sorted(repo_path(p) for p in results.rglob("*") if p.is_file() and p not in kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--check", action="store_true", help="check BENCHMARKS.md and benchmarks/results/; write nothing"
    )
    args = parser.parse_args(argv)
    try:
        text, plots = render(load_results())
    except ResultError as error:
        print(f"benchmarks/report.py: {error}", file=sys.stderr)
        return 1
    if not args.check:
        OUTPUT.write_text(text)
        for path, draw in plots.items():
            draw(path)
        for old in set(PLOTS.glob("*")) - set(plots):  # a plot of a result no longer kept
            old.unlink()
        print(f"wrote {repo_path(OUTPUT)} and {len(plots)} plot(s)")
        stray = stray_files(plots)
        if stray:
            print(f"not from the latest results (delete them): {', '.join(stray)}", file=sys.stderr)
        return 0
    problems = []
    current = OUTPUT.read_text() if OUTPUT.exists() else ""
    if current != text:
        diff = difflib.unified_diff(
            current.splitlines(), text.splitlines(), "BENCHMARKS.md", "from the results", lineterm=""
        )
        problems.append("BENCHMARKS.md is not what the results give:\n" + "\n".join(list(diff)[:40]))
    missing = [repo_path(p) for p in plots if not p.exists()]
    if missing:
        problems.append(f"plots missing: {', '.join(missing)}")
    stray = stray_files(plots)
    if stray:
        problems.append(
            f"benchmarks/results/ holds files that are not the latest results or their plots: {', '.join(stray)}"
        )
    for problem in problems:
        print(f"benchmarks/report.py --check: {problem}", file=sys.stderr)
    if problems:
        print("Run `python benchmarks/report.py` and commit BENCHMARKS.md and the plots.", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
