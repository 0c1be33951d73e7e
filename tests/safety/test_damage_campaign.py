"""Damage campaign (issue 12): sampled bit flips, zeroed ranges and truncations across every region of a
``save(codec="none")``, a ``save(codec="zstd")`` and a plain ``torch.save`` file, each damaged copy loaded by
``lightning_nvcomp.load``, by plain ``torch.load(weights_only=True)`` and by the CLI's ``verify``.

What must hold:

* ``lightning_nvcomp.load`` never returns a wrong object (any file type): it returns the saved object bit for bit,
  or raises a :class:`CheckpointError` naming the file;
* plain ``torch.load`` never returns a wrong *tensor* from a file this package wrote (non-tensor values of the
  pickle are outside what ``decode_tensor`` can check: counted, not asserted; ``torch.save`` files are torch's
  business: counted, not asserted);
* ``verify`` exits 0 only when the file loads equal, and 1 (not 2, not an exception) for damage.

The summary table is printed, and written to the file ``LNV_CAMPAIGN_REPORT`` names (for the README).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.damage_campaign import (
    EQUAL,
    ERROR,
    FILE_KINDS,
    PICKLE_VALUE_FLIPS,
    SEED,
    SILENT_OTHER,
    SILENT_TENSOR,
    Damage,
    by_region,
    campaign_state,
    classify,
    error_types,
    file_regions,
    load_with_package,
    load_with_torch,
    run_case,
    run_verify,
    sample_damage,
    table,
    tally,
    write_file,
)

#: Tallies of the campaigns run in this process, by file kind (the report file holds all of them).
SUMMARIES: dict[str, dict] = {}


def _file(kind: str, directory: Path) -> tuple[Path, dict, bytes]:
    state = campaign_state()
    path = write_file(kind, state, directory / "campaign.pt")
    return path, state, path.read_bytes()


def _examples(cases, pick, n: int = 6) -> str:
    return "\n".join(f"  {c.damage} -> {pick(c)}" for c in cases[:n])


# ------------------------------------------------------------------------------------ the campaign's own checks


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_campaign_covers_every_region(kind, tmp_path):
    """Regions tile the file; every zip member is in one; each region gets flips, zeroed ranges and cuts;
    the sample is deterministic and of the intended size."""
    path, _, raw = _file(kind, tmp_path)
    regions = file_regions(path)
    covered = sorted(r for region in regions for r in region.ranges)
    assert covered[0][0] == 0 and covered[-1][1] == len(raw)
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:])), "regions leave gaps or overlap"
    names = {r.name for r in regions}
    data = [n for n in names if n.startswith("data/")]
    assert {"local headers", "data.pkl", "metadata entries", "central directory", "end records"} <= names
    assert len(data) >= 4, data
    cases = sample_damage(raw, regions, f"{SEED}-{kind}")
    assert cases == sample_damage(raw, regions, f"{SEED}-{kind}")
    for region in regions:
        kinds = {c.kind for c in cases if c.region == region.name}
        assert kinds == {"flip", "zero", "truncate"}, (region.name, kinds)
    assert {c.offset for c in cases if c.kind == "truncate"} >= {0, 1, 2, 3}
    pickle_values = [c for c in cases if c.region == "data.pkl values"]
    assert len(pickle_values) == PICKLE_VALUE_FLIPS
    ((start, end),) = next(r for r in regions if r.name == "data.pkl").ranges
    assert all(start <= c.offset < end for c in pickle_values)
    assert all(c.apply(raw) != raw for c in cases), "a sampled damage changes nothing"
    assert 300 <= len(cases) <= 400, len(cases)


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_undamaged_file_loads_equal_three_ways(kind, tmp_path):
    path, state, _ = _file(kind, tmp_path)
    assert load_with_package(path, state).outcome == EQUAL, load_with_package(path, state)
    assert load_with_torch(path, state).outcome == EQUAL, load_with_torch(path, state)
    assert run_verify(path)[0] == 0, run_verify(path)


def test_classification_sees_each_kind_of_difference():
    """The comparison is not blind: a changed byte, stride, sharing, key or value is seen, and sorted right."""
    state = campaign_state()
    assert classify(state, campaign_state()) == (EQUAL, "")

    def changed(edit) -> str:
        other = campaign_state()
        edit(other)
        return classify(state, other)[0]

    def flip_bit(s):
        s["model"]["mask"][7] = not s["model"]["mask"][7]

    assert changed(flip_bit) == SILENT_TENSOR
    assert changed(lambda s: s["model"].update(x=s["model"]["x"].view(torch.int32))) == SILENT_TENSOR
    assert changed(lambda s: s["model"].update(w_t=s["model"]["w_t"].clone())) == SILENT_TENSOR  # sharing lost
    assert changed(lambda s: s["model"].update(w_t=s["model"]["w_t"].contiguous().t().t())) == SILENT_TENSOR
    assert changed(lambda s: s["model"].update(x_every5=s["model"]["x"][4::5])) == SILENT_TENSOR  # offset
    assert changed(lambda s: s["model"].update(step=torch.tensor([12.5]))) == SILENT_TENSOR  # 0-d -> 1-d
    assert changed(lambda s: s.update(epoch=4)) == SILENT_OTHER
    assert changed(lambda s: s["optim"]["sched"].update(kind="cosinf")) == SILENT_OTHER
    assert changed(lambda s: s["optim"].update(betas=[0.9, 0.999])) == SILENT_OTHER
    assert changed(lambda s: s["model"].update(w=s["model"]["w"].detach())) == SILENT_OTHER  # not a Parameter
    assert changed(lambda s: s["model"].pop("ids")) == SILENT_OTHER


# -------------------------------------------------------------------------------------------------- campaign


def _write_report() -> str:
    report = table(SUMMARIES)
    target = os.environ.get("LNV_CAMPAIGN_REPORT")
    if target:
        Path(target).write_text(report + "\n")
    return report


@pytest.mark.slow
@pytest.mark.parametrize("kind", FILE_KINDS)
def test_damage_campaign(kind, tmp_path):
    """About 350-400 damaged copies of one file, each loaded three ways; see the module docstring for what must
    hold. Failures list the first few cases of each kind (region, damage, what came back)."""
    path, state, raw = _file(kind, tmp_path)
    cases_to_run: list[Damage] = sample_damage(raw, file_regions(path), f"{SEED}-{kind}")
    begin = time.perf_counter()
    cases = [run_case(raw, d, tmp_path / f"damaged-{i:04d}.pt", state) for i, d in enumerate(cases_to_run)]
    seconds = time.perf_counter() - begin

    SUMMARIES[kind] = tally(cases)
    print(f"\ndamage campaign, {kind} file of {len(raw)} bytes: {len(cases)} cases in {seconds:.1f} s")
    print(_write_report())
    print(error_types(cases))
    print(by_region(cases))

    package_silent = [c for c in cases if c.package.outcome in (SILENT_TENSOR, SILENT_OTHER)]
    package_unclear = [c for c in cases if c.package.outcome == ERROR and not c.package.clear]
    torch_wrong_tensors = [c for c in cases if c.torch.outcome == SILENT_TENSOR]
    verify_ok_not_equal = [c for c in cases if c.verify_rc == 0 and c.package.outcome != EQUAL]
    verify_not_0_or_1 = [c for c in cases if c.verify_rc not in (0, 1)]  # 2, or it raised

    problems = []
    if package_silent:
        problems.append(
            f"{len(package_silent)} damaged copies loaded silently wrong by lightning_nvcomp.load:\n"
            + _examples(package_silent, lambda c: c.package.detail)
        )
    if package_unclear:
        problems.append(
            f"{len(package_unclear)} lightning_nvcomp.load errors are not a CheckpointError naming "
            f"the file:\n" + _examples(package_unclear, lambda c: c.package.detail)
        )
    if torch_wrong_tensors and kind != "torch.save":
        problems.append(
            f"{len(torch_wrong_tensors)} damaged copies gave wrong tensors through plain torch.load:\n"
            + _examples(torch_wrong_tensors, lambda c: c.torch.detail)
        )
    if verify_ok_not_equal:
        problems.append(
            f"{len(verify_ok_not_equal)} times verify exited 0 on a file that does not load equal:\n"
            + _examples(verify_ok_not_equal, lambda c: c.package.outcome + ", " + c.package.detail)
        )
    if verify_not_0_or_1:
        problems.append(
            f"{len(verify_not_0_or_1)} times verify did not exit 0 or 1 on a damaged copy:\n"
            + _examples(verify_not_0_or_1, lambda c: f"{c.verify_rc}: {c.verify_out}")
        )
    assert not problems, f"{kind} file, {len(cases)} damage cases:\n" + "\n".join(problems)
