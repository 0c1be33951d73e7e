"""``codec="auto"``'s console line says why it chose: every candidate's predicted lost time and the rule that decided.

Each test makes real saves through the writer the Lightning plugin and the Accelerate hook share, with a policy whose
inputs (the write bandwidth, each codec's ratio and speed) are given, so that the rule that applies is known from the
inputs alone; the line, which names the codec the save used, must state that rule.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from lightning_nvcomp.auto.calibration import CodecProfile
from lightning_nvcomp.auto.policy import RETRY_CLOSE, CodecPolicy
from lightning_nvcomp.auto.prediction import TIE_FRACTION, TIE_S, format_seconds
from lightning_nvcomp.options import SaveOptions
from lightning_nvcomp.saving.writer import CheckpointWriter

from tests.helpers.states import trained_like

NONE = CodecProfile("none", 1.0, float("inf"))
RAW = 1 << 22  # the bytes of STATE's tensor
STATE = {"w": trained_like(RAW // 4, torch.float32)}


def _saves(policy: CodecPolicy, states: list[dict], async_save: bool = False) -> list[str]:
    """Save ``states`` one checkpoint each under ``checkpoints/`` of the working directory, as the Lightning plugin
    does, with ``policy`` deciding; return the console lines."""
    Path("checkpoints").mkdir()
    lines: list[str] = []
    writer = CheckpointWriter(SaveOptions(codec="auto", async_save=async_save), report=lines.append)
    writer.policy = policy
    try:
        for step, state in enumerate(states):
            path = f"checkpoints/step-{step}.ckpt"
            writer.save(state, path)
            writer.commit(step, path)
        writer.wait()
    finally:
        writer.close()
    assert len(lines) == len(states), lines
    return lines


def _reason(line: str, codec: str) -> str:
    """What the line says after ``auto chose <codec>: predicted ... lost (...)``, where the save used ``codec``: the
    rule."""
    assert f": {codec} " in line and f"; auto chose {codec}: predicted " in line, line
    chose = line.split(f"; auto chose {codec}: predicted ", 1)[1].split("; the one-off", 1)[0]
    assert "): " in chose, f"the line states no rule: {line}"
    return chose.split("): ", 1)[1]


def test_the_least_lost_time_with_no_tie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sync, a 4 MB/s disk: none's write 1.05 s, zstd's (1.2x) 0.87 s, far more apart than 5% of 0.87 s
    monkeypatch.chdir(tmp_path)
    gbps, zstd = 0.004, CodecProfile("zstd", 1.2, 10.0)
    (line,) = _saves(CodecPolicy("sync", write_gbps=gbps, profiles=[zstd, NONE]), [STATE])
    zstd_s, none_s = RAW / 1.2 / (gbps * 1e9), RAW / (gbps * 1e9)
    assert none_s > zstd_s * (1 + TIE_FRACTION)
    assert _reason(line, "zstd") == f"the least, no other within {TIE_FRACTION:.0%} of it"
    assert f"(none {format_seconds(none_s)})" in line, line


def test_a_tie_won_by_the_smaller_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # async, the interval not known yet: a write is taken to end before the next save, and a 0.1 s difference is a
    # tie; zstd codes for 0.4 ms where none blocks 0 s, and wins by its smaller file
    monkeypatch.chdir(tmp_path)
    zstd = CodecProfile("zstd", 1.2, 10.0)
    (line,) = _saves(CodecPolicy("async", write_gbps=1.0, profiles=[zstd, NONE]), [STATE], async_save=True)
    assert f"(none {format_seconds(0.0)})" in line, line  # none lost less: the tie decided
    assert _reason(line, "zstd") == (
        f"a tie with none (within {format_seconds(TIE_S)} of the least), won by the smaller file (1.200x; none 1.000x)"
    )


def test_a_tie_of_equal_ratios_won_by_the_checkpoint_durable_sooner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # async, a tie as above; zstd's 1.009x is none's 1.0x within 1%, so the file does not decide: on a 10 MB/s disk
    # zstd's checkpoint is durable 3.7 ms sooner (0.4 ms of coding, 4.1 ms less to write), though it blocks longer
    monkeypatch.chdir(tmp_path)
    gbps, zstd = 0.01, CodecProfile("zstd", 1.009, 10.0)
    (line,) = _saves(CodecPolicy("async", write_gbps=gbps, profiles=[zstd, NONE]), [STATE], async_save=True)
    zstd_durable, none_durable = RAW / 10e9 + RAW / 1.009 / (gbps * 1e9), RAW / (gbps * 1e9)
    assert zstd_durable < none_durable
    assert _reason(line, "zstd") == (
        f"a tie with none (within {format_seconds(TIE_S)} of the least) and ratios within 1%, won by the checkpoint "
        f"durable sooner ({format_seconds(zstd_durable)}; none {format_seconds(none_durable)})"
    )


def test_a_close_runner_up_tried_to_measure_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sync, a 4 MB/s disk, random bytes that zstd cannot shrink: calibrated at 1.2x, zstd wins the first save; that
    # save measures ~1.0x, so at the second none is within 10% of zstd and, never measured, is tried once
    monkeypatch.chdir(tmp_path)
    noise = {"w": torch.randint(0, 256, (RAW,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))}
    policy = CodecPolicy("sync", write_gbps=0.004, profiles=[CodecProfile("zstd", 1.2, 10.0), NONE])
    first, second = _saves(policy, [noise, noise])
    assert _reason(first, "zstd").startswith("the least, ")
    assert _reason(second, "none") == (
        f"tried instead of zstd to measure it in a real save (predicted within {RETRY_CLOSE:.0%} of it, not yet measured)"
    )


def test_accelerate_save_state_says_why_for_its_largest_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``save_state`` writes several files, each decided by itself: the line, of them all, names the codec of the
    largest and the rule that chose it there."""
    from lightning_nvcomp.integrations.accelerate.attach import attach

    from tests.helpers import accelerate_runs as R

    monkeypatch.chdir(tmp_path)
    run = R.build(seed=3)
    attachment = attach(run.accelerator, codec="auto", async_save=True)
    attachment.writer.policy = CodecPolicy("async", write_gbps=1.0, profiles=[CodecProfile("zstd", 1.2, 10.0), NONE])
    with caplog.at_level(logging.INFO, logger="lightning_nvcomp.saving.writer"):
        try:
            run.accelerator.save_state("step-1")
        finally:
            attachment.detach()  # waits for the write, then reports
    (line,) = [r.getMessage() for r in caplog.records if "auto chose" in r.getMessage()]
    largest = max(Path("step-1").glob("*.bin"), key=lambda p: p.stat().st_size).name
    assert _reason(line, "zstd") == (
        f"for {largest}, the largest file, a tie with none (within {format_seconds(TIE_S)} of the least), "
        "won by the smaller file (1.200x; none 1.000x)"
    )
