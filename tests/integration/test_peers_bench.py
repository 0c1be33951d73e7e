"""benchmarks/peers_bench.py: a real run on a tiny state (``--quick``) from the working directory with relative paths,
a small MiniLM-like safetensors file standing in for the real one; its JSON holds every figure, every round trip it
reports was bit-exact, and benchmarks/report.py renders its section. Its byte-plane bound and its bit-exact check are
held to values worked out by hand."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from lightning_nvcomp.codec.gpu import gpu_available

from tests.helpers.paths import REPO_ROOT
from tests.helpers.report import rendered_section, run_benchmark

BENCH = REPO_ROOT / "benchmarks"
#: What the run is given and what its result must say it ran.
ARGS = ("--quick", "--cache-dir", "cache", "--minilm", "model.safetensors")
STATES = ["GPT fp32 w+m+v", "GPT bf16 weights", "GPT FP8", "MiniLM fp32", "MiniLM bf16", "MiniLM FP8"]


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> object:
    """benchmarks/peers_bench.py as a module."""
    monkeypatch.syspath_prepend(str(BENCH))
    import peers_bench

    return peers_bench


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """A --quick run in a fresh working directory: its folder, its JSON result and its output."""
    from safetensors.torch import save_file

    work = tmp_path_factory.mktemp("peers")
    gen = torch.Generator().manual_seed(0)
    save_file(
        {
            "embeddings.position_ids": torch.arange(64).unsqueeze(0),  # int64, as in the real file: left out
            "embeddings.word_embeddings.weight": torch.randn(500, 32, generator=gen) * 0.05,
            "encoder.layer.0.attention.self.query.weight": torch.randn(32, 32, generator=gen) * 0.1,
            "encoder.layer.0.attention.self.query.bias": torch.randn(32, generator=gen) * 0.01,
        },
        work / "model.safetensors",
    )
    proc = run_benchmark("peers_bench.py", *ARGS, "--dir", ".", "--json", "out/latest-cpu.json", cwd=work)
    return work, json.loads((work / "out" / "latest-cpu.json").read_text()), proc.stdout


@pytest.mark.slow
def test_a_quick_run_measures_every_state_and_method_and_every_round_trip_was_bit_exact(
    run: tuple[Path, dict, str],
) -> None:
    work, result, _ = run
    sys.path.insert(0, str(BENCH))
    try:
        import report
    finally:
        sys.path.remove(str(BENCH))
    assert all(k in result for k in report.REQUIRED) and result["benchmark"] == "peers"
    assert result["command"] == "python benchmarks/peers_bench.py " + " ".join(ARGS)  # no --dir, no --json
    for peer in ("zipnn", "lz4", "safetensors", "zstandard"):  # the peers' versions, None where not installed
        assert result["versions"][peer] == (importlib.metadata.version(peer) if available(peer) else None)
    assert sorted(p.name for p in (work / "out").iterdir()) == ["latest-cpu.json"]
    assert [p.name for p in (work / "cache").iterdir()] == ["gpt-64x2-4x2-cpu.pt"]  # the trained GPT, kept
    assert sorted(p.name for p in work.iterdir()) == ["cache", "model.safetensors", "out"]  # no saved file left

    methods = ["ours zstd", "ours none", "DCP + ZStandard", "zstd -1", "zstd -3", "zstd -9", "torch.save"]
    methods += ["ZipNN"] * available("zipnn") + ["lz4"] * available("lz4") + ["safetensors"] * available("safetensors")
    rows = result["rows"]
    assert list(dict.fromkeys(r["state"] for r in rows)) == STATES
    for state in STATES:
        assert set(methods) <= {r["method"] for r in rows if r["state"] == state}
    assert {s["state"]: s["tensors"] for s in result["states"]}["MiniLM fp32"] == 3  # the float tensors
    for r in rows:
        assert r["exact"] is True, r
        assert len(r["save_s"]) == len(r["load_s"]) == len(r["cold_load_s"]) == result["repetitions"] == 1
        assert math.isclose(r["ratio"], r["raw_mb"] / r["stored_mb"], rel_tol=1e-9)
        for figure in ("save_gbps", "load_gbps", "cold_load_gbps", "save_cpu_s_per_gb", "load_cpu_s_per_gb"):
            assert r[figure] > 0, (r["state"], r["method"], figure)
    # the coders compared on each class alone; every state has a row of its every tensor
    classes = result["classes"]
    assert {c["state"] for c in classes if c["whole"]} == set(STATES)
    gpt = {c["class"]: c for c in classes if c["state"] == "GPT fp32 w+m+v"}
    assert list(gpt) == ["fp32 weights", "exp_avg", "exp_avg_sq", "whole state"]
    coders = ["ours zstd", *["ours ans (GPU)", "ours zstd (GPU)"] * gpu_available(), *["ZipNN"] * available("zipnn")]
    for c in classes:
        assert sorted(c["ratios"]) == sorted(coders) and all(v > 0 for v in c["ratios"].values())
    whole = gpt["whole state"]
    assert whole["ratios"]["ours zstd"] == next(
        r["ratio"] for r in rows if r["state"] == "GPT fp32 w+m+v" and r["method"] == "ours zstd"
    )
    assert whole["mb"] == pytest.approx(sum(gpt[c]["mb"] for c in ("fp32 weights", "exp_avg", "exp_avg_sq")))
    assert all(c["bound"] > 1 and c["rotated_bound"] > 1 for c in gpt.values())  # trained floats do compress


@pytest.mark.slow
def test_the_report_renders_the_run_and_check_accepts_it(run: tuple[Path, dict, str], tmp_path: Path) -> None:
    _, result, printed = run
    section = rendered_section(result, "Peers", tmp_path)
    zstd = next(r for r in result["rows"] if r["state"] == "MiniLM bf16" and r["method"] == "ours zstd")
    assert (
        f"| MiniLM bf16 | ours zstd | {zstd['raw_mb']:.1f} | {zstd['stored_mb']:.1f} | {zstd['ratio']:.4f} |" in section
    )
    assert "**NO**" not in section  # every bit-exact cell says yes
    assert f"- rerun: `{result['command']} --json benchmarks/results/peers/latest-cpu.json`" in section
    # the script printed the same tables
    assert section.split("Ratio (raw tensor bytes", 1)[1].split("\n- ")[0] in printed


def test_the_bound_rotates_the_sign_out_of_the_exponent_byte(bench: object) -> None:
    # 1.0, -1.0, 2.0, -2.0 equally often: plain planes, top byte 3F/BF/40/C0 (2 bits) and byte 2 80/80/00/00
    # (1 bit): 3 bits per 32; rotated left one bit: 7F000000, 7F000001, 80000000, 80000001: 1 bit in the top byte,
    # 1 in the lowest: 2 bits per 32
    floats = torch.tensor([1.0, -1.0, 2.0, -2.0]).repeat(1000)
    assert bench.plane_bound([[floats]]) == pytest.approx(32 / 3)
    assert bench.plane_bound([[floats]], rotated=True) == pytest.approx(16)
    # bf16 (3F80, BF80, 4000, C000): 3 bits of 16; rotated (7F00, 7F01, 8000, 8001): 2 bits of 16
    assert bench.plane_bound([[floats.bfloat16()]]) == pytest.approx(16 / 3)
    assert bench.plane_bound([[floats.bfloat16()]], rotated=True) == pytest.approx(8)
    # two classes, each coded alone: one constant (0 bits), one of 2 equally likely fp32 values (1 bit of 32)
    halves = torch.tensor([1.0, -1.0]).repeat(1000)
    assert bench.plane_bound([[torch.ones(2000)], [halves]]) == pytest.approx(64)
    assert bench.plane_bound([[torch.ones(8)]]) is None


def test_the_bit_exact_check_compares_bytes_keys_and_dtypes(bench: object) -> None:
    state = {"w": torch.tensor([0.0, 1.5, float("nan")]), "s": torch.tensor(2.0)}
    assert bench.exact(state, {k: v.clone() for k, v in state.items()})
    minus_zero = {**state, "w": torch.tensor([-0.0, 1.5, float("nan")])}  # equal as floats, not as bytes
    assert not bench.exact(state, minus_zero)
    other_nan = state["w"].clone()
    other_nan.view(torch.int32)[2] += 1  # another NaN payload
    assert not bench.exact(state, {**state, "w": other_nan})
    assert not bench.exact(state, {**state, "s": torch.tensor(2.0, dtype=torch.float64)})
    assert not bench.exact(state, {"w": state["w"]})
    assert not bench.exact(state, [state["w"], state["s"]])


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
def test_on_a_gpu_ours_saves_from_and_loads_to_the_gpu_bit_exact(run: tuple[Path, dict, str]) -> None:
    _, result, _ = run
    for state in STATES:
        gpu = {r["method"]: r for r in result["rows"] if r["state"] == state and r["method"].endswith("(GPU)")}
        assert sorted(gpu) == ["ours ans (GPU)", "ours zstd (GPU)"]
        assert all(r["exact"] is True for r in gpu.values())
    assert all({"ours ans (GPU)", "ours zstd (GPU)"} <= set(c["ratios"]) for c in result["classes"])
