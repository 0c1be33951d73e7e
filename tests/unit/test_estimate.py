"""``lightning-nvcomp estimate``: checkpoint sizes, idle GPU time and dollars, Young/Daly, argument errors.

Expected values are computed by hand below from the formulas in lightning_nvcomp/estimate.py's docstring:
sizes in GiB (2**30 bytes), bandwidth in GiB/s, a 30-day month.
"""

from __future__ import annotations

import math

import pytest

from lightning_nvcomp.cli import main
from lightning_nvcomp.cli.estimate import arg_ratio, parse_count
from lightning_nvcomp.telemetry import components
from lightning_nvcomp.telemetry import estimate as costs

GIB = 2**30
MONTH_S = 30 * 24 * 3600


def run(capsys: pytest.CaptureFixture, *argv: object) -> tuple[int, str, str]:
    """``main(["estimate", *argv])``: (exit status, stdout, stderr); argparse's SystemExit counts as a status."""
    try:
        status = main(["estimate", *(str(a) for a in argv)])
    except SystemExit as exc:
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ------------------------------------------------------------------------------------------- hand-computed case


def test_small_fp32_sgd_case_by_hand():
    # 1e9 params, fp32, SGD: fp32 weights 4 + fp32 momentum 4 + fp32 grads 4 = 12 bytes/param
    est = costs.estimate(1e9, 8, 2.0, 10, 2.0, precision="fp32", optimizer="sgd")
    names = [(c.name, c.dtype, c.nbytes) for c in est.components]
    assert names == [("weights", "fp32", 4e9), ("SGD momentum", "fp32", 4e9), ("gradients", "fp32", 4e9)]
    assert est.nbytes == 12e9

    base = est.rows[0]
    assert base.codec == "none" and base.ratio == 1.0
    write_s = 12e9 / (2.0 * GIB)  # 5.587 s
    assert base.idle.write_s == pytest.approx(write_s)
    per_month = 30 * 24 * 60 / 10  # 4320 checkpoints
    assert base.idle.checkpoints_per_month == pytest.approx(per_month)
    gpu_hours = write_s * per_month / 3600 * 8
    assert base.idle.gpu_hours_month == pytest.approx(gpu_hours)
    assert base.idle.usd_month == pytest.approx(gpu_hours * 2.0)

    # gANS: fp32 weights 1.213; momentum and fp32 grads borrow Adam m's 1.195
    gans = est.rows[1]
    stored = 4e9 / 1.213 + 4e9 / 1.195 + 4e9 / 1.195
    assert gans.codec == "gans" and gans.nbytes == pytest.approx(stored)
    assert gans.ratio == pytest.approx(12e9 / stored)
    assert gans.idle.write_s == pytest.approx(stored / (2.0 * GIB))
    assert gans.idle.usd_month == pytest.approx(stored / (2.0 * GIB) * per_month / 3600 * 8 * 2.0)
    zstd = est.rows[2]
    assert zstd.nbytes == pytest.approx(4e9 / 1.185 + 8e9 / 1.178)
    assert [c.assumed for c in est.components] == [False, True, True]


@pytest.mark.parametrize(
    ("precision", "optimizer", "master", "grads", "layout"),
    [
        ("bf16-mixed", "adamw", False, True, [("bf16", 2), ("fp32", 4), ("fp32", 4), ("bf16", 2)]),
        ("bf16-mixed", "adamw", True, True, [("bf16", 2), ("fp32", 4), ("fp32", 4), ("fp32", 4), ("bf16", 2)]),
        ("fp32", "adamw", True, False, [("fp32", 4), ("fp32", 4), ("fp32", 4)]),  # fp32 weights are the master
        ("fp8", "none", False, True, [("fp8", 1), ("bf16", 2)]),
        ("fp8", "sgd", True, False, [("fp8", 1), ("fp32", 4), ("fp32", 4)]),
    ],
)
def test_components_per_precision_and_optimizer(precision, optimizer, master, grads, layout):
    parts = components.checkpoint_components(1000, precision, optimizer, master_weights=master, gradients=grads)
    assert [(c.dtype, c.bytes_per_param) for c in parts] == layout
    assert all(c.nbytes == 1000 * c.bytes_per_param for c in parts)


def test_default_ratios_are_the_measured_ones():
    parts = {c.name: c for c in components.checkpoint_components(1, "bf16-mixed", "adamw", master_weights=True)}
    assert parts["weights"].ratios == {"gans": 1.518, "zstd": 1.454}
    assert parts["master weights"].ratios == {"gans": 1.213, "zstd": 1.185}
    assert parts["Adam m (exp_avg)"].ratios == {"gans": 1.195, "zstd": 1.178}
    assert parts["Adam v (exp_avg_sq)"].ratios == {"gans": 1.234, "zstd": 1.229}
    assert not any(parts[n].assumed for n in ("weights", "master weights", "Adam m (exp_avg)", "Adam v (exp_avg_sq)"))
    assert parts["gradients"].assumed


# ------------------------------------------------------------------------------------------------- calibration


def test_defaults_reproduce_the_published_case():
    """DESIGN.md section 1: 70B, bf16-mixed, AdamW, grads: ~782 GB (130 + 521 + 130), ~156 s at 5 GB/s."""
    est = costs.estimate(70e9, 128, 5, 30, 4.40)
    sizes = [c.nbytes / GIB for c in est.components]
    assert sizes[0] == pytest.approx(130, rel=0.01) and sizes[3] == pytest.approx(130, rel=0.01)
    assert sizes[1] + sizes[2] == pytest.approx(521, rel=0.01)
    assert est.nbytes / GIB == pytest.approx(782, rel=0.01)
    assert est.rows[0].idle.write_s == pytest.approx(156, rel=0.01)


def test_monthly_dollars_of_the_published_case():
    est = costs.estimate(70e9, 128, 5, 30, 4.40)
    write_s = 70e9 * 12 / (5 * GIB)  # 156.46 s
    checkpoints = 30 * 24 * 60 / 30  # 1440
    usd = write_s * checkpoints / 3600 * 128 * 4.40  # 35,248
    assert est.rows[0].idle.usd_month == pytest.approx(usd)
    assert 35_000 < usd < 35_500
    # the 405B case of DESIGN.md: "over $200K a month"
    assert costs.estimate(405e9, 128, 5, 30, 4.40).rows[0].idle.usd_month > 200_000
    # compression saves (1 - 1/ratio) of it
    gans = est.rows[1]
    assert usd - gans.idle.usd_month == pytest.approx(usd * (1 - 1 / gans.ratio))


# -------------------------------------------------------------------------------------------------- failures


def test_young_daly_by_hand():
    est = costs.estimate(1e9, 8, 2.0, 10, 2.0, precision="fp32", optimizer="sgd", mtbf_hours=10)
    base = est.rows[0]
    c = 12e9 / (2.0 * GIB)
    interval = math.sqrt(2 * c * 10 * 3600)  # ~634 s
    assert costs.young_daly_interval_s(c, 10) == pytest.approx(interval)
    assert base.optimal.interval_s == pytest.approx(interval)
    failures = 30 * 24 / 10  # 72 per month
    lost = interval / 2 + c  # half an interval + reading the checkpoint back
    assert base.optimal.failures_per_month == pytest.approx(failures)
    assert base.optimal.lost_s_per_failure == pytest.approx(lost)
    assert base.optimal.gpu_hours_month == pytest.approx(lost * failures / 3600 * 8)
    assert base.optimal.usd_month == pytest.approx(lost * failures / 3600 * 8 * 2.0)
    assert base.optimal_idle.usd_month == pytest.approx(c * (MONTH_S / interval) / 3600 * 8 * 2.0)
    # at the chosen interval (10 min)
    assert base.at_interval.lost_s_per_failure == pytest.approx(300 + c)
    # compression: shorter write, shorter optimal interval, less lost per failure
    gans = est.rows[1]
    c2 = gans.nbytes / (2.0 * GIB)
    assert gans.optimal.interval_s == pytest.approx(math.sqrt(2 * c2 * 36000))
    assert gans.optimal.lost_s_per_failure == pytest.approx(gans.optimal.interval_s / 2 + c2)
    assert gans.optimal.lost_s_per_failure < base.optimal.lost_s_per_failure


def test_no_mtbf_no_failure_figures():
    est = costs.estimate(1e9, 1, 1, 1, 1)
    assert all(r.optimal is None and r.at_interval is None for r in est.rows)


# ---------------------------------------------------------------------------------------------- ratio overrides


def test_ratio_overrides_and_extra_codecs():
    est = costs.estimate(70e9, 128, 5, 30, 4.40, ratios={"gans": 1.5, "blog": 1.18})
    rows = {r.codec: r for r in est.rows}
    assert list(rows) == ["none", "gans", "zstd", "blog"]
    assert rows["gans"].ratio == 1.5 and rows["gans"].overridden
    assert not rows["zstd"].overridden
    # the NVIDIA blog's 1.18x on raw bytes: 156 s -> ~133 s
    assert rows["blog"].idle.write_s == pytest.approx(156.46 / 1.18, rel=1e-3)
    assert rows["blog"].idle.write_s == pytest.approx(133, rel=0.01)
    assert rows["blog"].hidden is None  # no measured throughput for an invented codec


def test_compression_hidden_check():
    # 1 GPU at 0.9 GB/s (zstd, slowest measured) cannot feed 20 GiB/s of storage; 128 GPUs can feed 5 GiB/s
    assert costs.compression_hidden("zstd", 1, 20, 1.2) is False
    assert costs.compression_hidden("zstd", 128, 5, 1.3) is True
    est = costs.estimate(1e9, 1, 20, 30, 1)
    assert any("may not keep pace" in n for n in est.notes)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gans=1.3", ("gans", 1.3)),
        ("ANS=1.3", ("gans", 1.3)),
        ("zstd=0.99", ("zstd", 0.99)),
        ("blog=1.18", ("blog", 1.18)),
    ],
)
def test_arg_ratio_accepts(text, expected):
    assert arg_ratio(text) == expected


@pytest.mark.parametrize("text", ["70e9", "70B", "70b", "70000000000", "0.07T", "70_000M"])
def test_parse_count(text):
    assert parse_count(text) == pytest.approx(70e9)


def test_pure_functions_reject_bad_values():
    with pytest.raises(ValueError, match="precision"):
        components.checkpoint_components(1, "fp16")
    with pytest.raises(ValueError, match="optimizer"):
        components.checkpoint_components(1, "fp32", "adam")
    with pytest.raises(ValueError, match="params"):
        components.checkpoint_components(0)
    with pytest.raises(ValueError, match="storage_gibps"):
        costs.estimate(1, 1, -1, 1, 1)
    with pytest.raises(ValueError, match="ratio for gans"):
        costs.estimate(1, 1, 1, 1, 1, ratios={"gans": 0})


# ----------------------------------------------------------------------------------------------- command line


def test_command_prints_the_published_case(capsys):
    status, out, err = run(capsys)  # every default: 70e9, 128 GPUs, 5 GiB/s, 30 min, $4.40
    assert status == 0 and err == ""
    usd = 70e9 * 12 / (5 * GIB) * 1440 / 3600 * 128 * 4.40
    for text in (
        "GiB",
        "GiB/s",
        "782.3",
        "156.5",
        "130.4",
        "260.8",
        f"${usd:,.0f}",
        "1,440 checkpoints",
        "weights",
        "Adam m",
        "Adam v",
        "gradients",
        "gANS",
        "zstd",
        "uncompressed",
        "saved $/month",
        "codec_bench.py",
    ):
        assert text in out, text
    assert "Young/Daly" not in out


def test_command_explicit_arguments_and_failures(capsys):
    status, out, _ = run(
        capsys,
        "--params",
        "1e9",
        "--gpus",
        8,
        "--storage-gbps",
        2,
        "--interval-min",
        10,
        "--gpu-hour-usd",
        2,
        "--precision",
        "fp32",
        "--optimizer",
        "sgd",
        "--mtbf-hours",
        10,
    )
    assert status == 0
    c = 12e9 / (2 * GIB)
    assert "SGD momentum" in out and "Adam" not in out
    assert f"{c:.2f}" in out  # write seconds per checkpoint, 5.59
    assert "Young/Daly" in out and f"{math.sqrt(2 * c * 36000) / 60:.1f}" in out  # optimal interval, minutes
    assert "72 per month" in out


def test_command_options_change_the_checkpoint(capsys):
    _, out, _ = run(capsys, "--no-grads")
    assert "gradients" not in out and f"{70e9 * 10 / GIB:,.1f}" in out  # 651.9 GiB
    _, out, _ = run(capsys, "--master-weights")
    assert "master weights" in out and f"{70e9 * 16 / GIB:,.1f}" in out  # 1,043.1 GiB
    _, out, _ = run(capsys, "--ratio", "gans=1.5", "blog=1.18", "--ratio", "zstd=1.25")
    assert "1.500 (--ratio)" in out and "1.250 (--ratio)" in out and "blog" in out
    assert f"{70e9 * 12 / (5 * GIB) / 1.18:.1f}" in out  # the blog's 133 s


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--params", "-70e9"], "--params"),
        (["--params", "0"], "--params"),
        (["--params=-70e9"], "--params"),
        (["--params", "-70"], "--params"),
        (["--params", "lots"], "--params"),
        (["--gpus", "0"], "--gpus"),
        (["--gpus", "-4"], "--gpus"),
        (["--gpus", "1.5"], "--gpus"),
        (["--storage-gbps", "0"], "--storage-gbps"),
        (["--storage-gbps", "-5"], "--storage-gbps"),
        (["--interval-min", "0"], "--interval-min"),
        (["--interval-min", "-30"], "--interval-min"),
        (["--gpu-hour-usd", "-1"], "--gpu-hour-usd"),
        (["--mtbf-hours", "0"], "--mtbf-hours"),
        (["--storage-gbps", "nan"], "--storage-gbps"),
        (["--precision", "fp16"], "--precision"),
        (["--optimizer", "adam"], "--optimizer"),
        (["--ratio", "gans"], "--ratio"),
        (["--ratio", "gans=abc"], "--ratio"),
        (["--ratio", "gans=0"], "--ratio"),
        (["--ratio", "gans=-1.2"], "--ratio"),
        (["--ratio", "=1.2"], "--ratio"),
        (["--ratio", "none=1.2"], "--ratio"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(capsys, argv, option):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert f"argument {option}" in err, err
