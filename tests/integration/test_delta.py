"""Delta checkpoints on real files: bit-exact round trips through chains, the base's loss or damage named, pruning
that never breaks a chain (a real Trainer's top-k), bare file names in the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_nvcomp
from lightning_nvcomp import DeltaOptions, NvcompCheckpointIO, SaveOptions
from lightning_nvcomp.cli import main
from lightning_nvcomp.codec import delta as transforms
from lightning_nvcomp.errors import CorruptCheckpointError, MissingBaseError
from lightning_nvcomp.format import delta as delta_module
from lightning_nvcomp.format.bases import base_file
from lightning_nvcomp.format.contents import find_contents
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.options import Codec
from lightning_nvcomp.saving.single_file import Held
from lightning_nvcomp.saving.writer import CheckpointWriter

from tests.helpers.lightning_models import TinyData, TinyModule, quiet_trainer
from tests.helpers.states import assert_tree_bit_exact, save_as_training_goes_on, special_floats, trained_like

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int64, torch.bool, torch.complex64]


def drifting_state(step: int) -> dict:
    """Weights and Adam-like moments that move a little between steps, every dtype, special values included."""
    gen = torch.Generator().manual_seed(step)
    w = trained_like(300_000, torch.float32)
    state = {"w": w + step * 1e-5 * torch.randn(w.shape, generator=gen), "v": (w * w + step * 1e-9).abs()}
    for dtype in DTYPES:
        base = trained_like(40_000, torch.float32, seed=7) + step * 1e-4
        t = base.to(dtype) if dtype != torch.bool else base > 0
        state[str(dtype)] = t
    state["specials"] = torch.cat([special_floats(torch.float32), trained_like(20_000, torch.float32)])
    state["scalar"], state["empty"] = torch.tensor(float(step)), torch.empty(0, 3)
    state["strided"] = state["w"][:200_000].view(400, 500)[:, ::2]
    return state


def delta_records(path: str) -> list[dict]:
    found = base_file(path)
    assert found is not None
    return [r.record for r in found.records if "delta" in r.record]


@pytest.mark.parametrize("transform", transforms.TRANSFORMS)
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_transforms_are_undone_bit_exactly(transform: str, itemsize: int) -> None:
    gen = torch.Generator().manual_seed(itemsize)
    data, base = (torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen) for _ in range(2))
    out = torch.empty_like(data)
    transforms.apply(transform, data, base, itemsize, out)
    assert not torch.equal(out, data)
    transforms.undo(transform, out, base, itemsize)
    assert torch.equal(out, data)


def test_a_delta_round_trips_bit_exactly_through_a_chain_with_bare_names(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    states = [drifting_state(s) for s in range(4)]
    lightning_nvcomp.save(states[0], "k.ckpt", codec="zstd")
    lightning_nvcomp.save(states[1], "d1.ckpt", codec="zstd", base="k.ckpt")
    lightning_nvcomp.save(states[2], "d2.ckpt", codec="zstd", base="d1.ckpt")
    assert delta_records("d1.ckpt") and delta_records("d2.ckpt")
    assert os.path.getsize("d1.ckpt") < os.path.getsize("k.ckpt")
    for name, state in (("k.ckpt", states[0]), ("d1.ckpt", states[1]), ("d2.ckpt", states[2])):
        assert_tree_bit_exact(lightning_nvcomp.load(name), state)
        assert_tree_bit_exact(torch.load(name, weights_only=True), state)  # plain torch.load reads the chain too


def test_the_transform_is_measured_per_tensor(tmp_path: Path) -> None:
    """A tensor that forgot its past (new noise) is stored as it is; one that moved a little is a delta."""
    gen = torch.Generator().manual_seed(0)
    w = trained_like(100_000, torch.float32)
    before = {"slow": w, "noise": torch.randn(100_000, generator=gen)}
    after = {"slow": w + 1e-6, "noise": torch.randn(100_000, generator=gen)}
    lightning_nvcomp.save(before, tmp_path / "a.ckpt", codec="zstd")
    lightning_nvcomp.save(after, tmp_path / "b.ckpt", codec="zstd", base=tmp_path / "a.ckpt")
    (rec,) = delta_records(str(tmp_path / "b.ckpt"))
    assert sorted(rec["delta"]["transforms"]) == ["none", "xor"] or sorted(rec["delta"]["transforms"]) == [
        "none",
        "sub",
    ]
    assert_tree_bit_exact(lightning_nvcomp.load(tmp_path / "b.ckpt"), after)


def test_a_missing_replaced_or_damaged_base_is_named(tmp_path: Path) -> None:
    base, delta = tmp_path / "base.ckpt", tmp_path / "delta.ckpt"
    lightning_nvcomp.save(drifting_state(0), base, codec="zstd")
    lightning_nvcomp.save(drifting_state(1), delta, codec="zstd", base=base)
    original = base.read_bytes()
    base.unlink()
    with pytest.raises(MissingBaseError, match="delta.ckpt: tensor .*base.ckpt is missing"):
        lightning_nvcomp.load(delta)
    with pytest.raises(MissingBaseError, match="base.ckpt"):
        torch.load(delta, weights_only=True)
    lightning_nvcomp.save(drifting_state(0), base, codec="zstd")  # the same tensors, another file
    with pytest.raises(MissingBaseError, match="replaced"):
        lightning_nvcomp.load(delta)
    damaged = bytearray(original)
    damaged[len(damaged) // 3] ^= 0x10  # inside a blob
    base.write_bytes(bytes(damaged))
    with pytest.raises(CorruptCheckpointError, match="base.ckpt"):
        lightning_nvcomp.load(delta)
    base.write_bytes(original)
    assert_tree_bit_exact(lightning_nvcomp.load(delta), drifting_state(1))


def test_a_base_elsewhere_or_not_ours_makes_a_standalone_file(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    torch.save(drifting_state(0), tmp_path / "plain.ckpt")
    lightning_nvcomp.save(drifting_state(0), tmp_path / "other" / "k.ckpt", codec="zstd")
    lightning_nvcomp.save(drifting_state(1), tmp_path / "a.ckpt", codec="zstd", base=tmp_path / "plain.ckpt")
    lightning_nvcomp.save(drifting_state(1), tmp_path / "b.ckpt", codec="zstd", base=tmp_path / "other" / "k.ckpt")
    assert not delta_records(str(tmp_path / "a.ckpt")) and not delta_records(str(tmp_path / "b.ckpt"))


@pytest.mark.parametrize("async_save", [False, True])
def test_the_writer_keeps_what_a_chain_needs_and_prunes_the_rest(tmp_path: Path, monkeypatch, async_save: bool) -> None:
    monkeypatch.chdir(tmp_path)
    options = SaveOptions(codec="zstd", durable="os", async_save=async_save, delta=DeltaOptions(keyframe_every=3))
    writer = CheckpointWriter(options)
    for step in range(6):
        for name in (f"step{step}.ckpt", "last.ckpt"):  # as Lightning saves: a top-k file, then last.ckpt
            writer.save(drifting_state(step), name)
            writer.commit(step, name)
        if step >= 1:
            writer.discard(f"step{step - 1}.ckpt")  # top-1
    writer.close()
    kept = sorted(f for f in os.listdir(".") if f.endswith(".ckpt"))
    # step5 is a delta of step3, its chain's keyframe (every 3), so step4 went; last.ckpt would be the chain's
    # third after step3: alone
    assert kept == ["last.ckpt", "step3.ckpt", "step5.ckpt"]
    assert [bool(delta_records(f)) for f in kept] == [False, False, True]
    assert {r["delta"]["base"]["file"] for r in delta_records("step5.ckpt")} == {"step3.ckpt"}
    assert_tree_bit_exact(lightning_nvcomp.load("step5.ckpt"), drifting_state(5))
    assert_tree_bit_exact(lightning_nvcomp.load("last.ckpt"), drifting_state(5))


def test_an_async_delta_is_coded_behind_training_from_the_state_as_saved(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    lightning_nvcomp.save(drifting_state(0), "step0.ckpt", codec="zstd")
    base = base_file("step0.ckpt")
    assert base is not None
    # what training waits for is a standalone coding: the held snapshot has no delta in it...
    state = drifting_state(1)
    held = Held(state, find_contents(state), Codec.ZSTD, None, base)
    with open("held.ckpt", "wb") as f:
        held.snapshot.write_to(ArchiveWriter(f))
    assert delta_records("held.ckpt") == []
    # ...and the file written from it is a delta, of the state as it was when save() returned
    writer = CheckpointWriter(SaveOptions(codec="zstd", durable="os", async_save=True, delta=DeltaOptions()))
    save_as_training_goes_on(writer, drifting_state, range(2))
    assert {r["delta"]["base"]["file"] for r in delta_records("step1.ckpt")} == {"step0.ckpt"}
    assert_tree_bit_exact(lightning_nvcomp.load("step1.ckpt"), drifting_state(1))
    assert_tree_bit_exact(lightning_nvcomp.load("held.ckpt"), drifting_state(1))


def test_a_replaced_base_keeps_its_bytes_for_the_files_that_need_it(tmp_path: Path) -> None:
    writer = CheckpointWriter(SaveOptions(codec="zstd", durable="os", delta=DeltaOptions()))
    model = str(tmp_path / "model.ckpt")
    writer.save(drifting_state(0), model)
    writer.commit(0, model)
    writer.save(drifting_state(1), str(tmp_path / "next.ckpt"))  # coded against model.ckpt
    writer.commit(1, str(tmp_path / "next.ckpt"))
    writer.save(drifting_state(9), model)  # model.ckpt replaced: next.ckpt still needs its old bytes
    writer.commit(2, model)
    writer.close()
    assert delta_records(str(tmp_path / "next.ckpt"))
    assert_tree_bit_exact(lightning_nvcomp.load(tmp_path / "next.ckpt"), drifting_state(1))
    assert_tree_bit_exact(lightning_nvcomp.load(model), drifting_state(9))


def test_lightning_top_k_with_deltas_resumes_bit_exactly(tmp_path: Path) -> None:
    ckdir = tmp_path / "ck"
    plugin = NvcompCheckpointIO(codec="zstd", delta=DeltaOptions(keyframe_every=4))
    callback = ModelCheckpoint(
        dirpath=ckdir, save_top_k=2, monitor="step", mode="max", every_n_epochs=1, save_last=True
    )
    module = TinyModule(in_dim=64, hidden=256)  # 66 kB of weights: tensors large enough to be coded as deltas
    data = TinyData(in_dim=64)
    quiet_trainer(tmp_path, max_epochs=6, plugins=[plugin], callbacks=[callback]).fit(module, datamodule=data)
    files = sorted(os.listdir(ckdir))
    assert len([f for f in files if f.startswith("epoch")]) >= 2 and "last.ckpt" in files
    assert any(delta_records(str(ckdir / f)) for f in files if f.endswith(".ckpt"))
    for f in files:  # every kept checkpoint loads: no base a kept file needs was pruned
        if f.endswith(".ckpt"):
            lightning_nvcomp.load(ckdir / f)
    last = lightning_nvcomp.load(ckdir / "last.ckpt")
    assert_tree_bit_exact(last["state_dict"], dict(module.state_dict()))
    resumed = quiet_trainer(tmp_path / "r", max_epochs=7, plugins=[NvcompCheckpointIO(codec="zstd")])
    resumed.fit(TinyModule(in_dim=64, hidden=256), datamodule=data, ckpt_path=str(ckdir / "last.ckpt"))
    assert resumed.global_step > last["global_step"]


def cli(capsys: pytest.CaptureFixture, *argv: object) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_cli_shows_checks_and_cuts_the_chain(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    lightning_nvcomp.save(drifting_state(0), "k.ckpt", codec="zstd")
    lightning_nvcomp.save(drifting_state(1), "d.ckpt", codec="zstd", base="k.ckpt")
    code, out = cli(capsys, "inspect", "d.ckpt")
    assert code == 0 and "zstd delta" in out and "a delta checkpoint" in out and "k.ckpt" in out
    code, out = cli(capsys, "verify", "d.ckpt")
    assert code == 0 and "its bases" in out and "k.ckpt" in out
    code, out = cli(capsys, "convert", "d.ckpt", "alone.ckpt", "--codec", "zstd")
    assert code == 0 and "stands alone" in out
    assert not delta_records("alone.ckpt")
    os.remove("k.ckpt")
    assert_tree_bit_exact(lightning_nvcomp.load("alone.ckpt"), drifting_state(1))
    code, out = cli(capsys, "verify", "d.ckpt")
    assert code != 0 and "k.ckpt is missing" in out


def test_a_record_is_coded_and_undone_a_window_at_a_time_across_segment_sizes(tmp_path: Path) -> None:
    """One large storage (a record of its own): its delta is made a base range at a time as its segments are coded,
    and undone a base segment at a time, whatever the segment sizes of the base, its base and the delta."""
    w = trained_like(1_500_000, torch.float32)
    steps = [{"w": w + step * 1e-6} for step in range(3)]
    lightning_nvcomp.save(steps[0], tmp_path / "k.ckpt", codec="zstd", staging_mb=1)
    lightning_nvcomp.save(steps[1], tmp_path / "d1.ckpt", codec="zstd", staging_mb=0.5, base=tmp_path / "k.ckpt")
    lightning_nvcomp.save(steps[2], tmp_path / "d2.ckpt", codec="zstd", staging_mb=1.5, base=tmp_path / "d1.ckpt")
    (rec,) = delta_records(str(tmp_path / "d2.ckpt"))
    assert rec["segment"] == 3 << 19 and rec["delta"]["base"]["record"]["segment"] == 1 << 19
    assert (tmp_path / "d2.ckpt").stat().st_size < 0.9 * (tmp_path / "k.ckpt").stat().st_size
    for name, state in (("d1.ckpt", steps[1]), ("d2.ckpt", steps[2])):
        assert_tree_bit_exact(lightning_nvcomp.load(tmp_path / name), state)


def test_a_base_that_stands_alone_is_decoded_into_the_delta_s_storages(tmp_path: Path, monkeypatch) -> None:
    """On the CPU a base with no base of its own is decoded straight into the delta's storages, each transform undone
    as the base's planes are joined (no window of the base's bytes); a base that is a delta itself is decoded apart,
    then undone. Both load bit-exactly."""
    states = [drifting_state(s) for s in range(3)]
    lightning_nvcomp.save(states[0], tmp_path / "k.ckpt", codec="zstd", staging_mb=1)
    lightning_nvcomp.save(states[1], tmp_path / "d1.ckpt", codec="zstd", staging_mb=1, base=tmp_path / "k.ckpt")
    lightning_nvcomp.save(states[2], tmp_path / "d2.ckpt", codec="zstd", staging_mb=1, base=tmp_path / "d1.ckpt")
    real, into = delta_module.decoded_windows, []

    def decoded_windows(*args, **kwargs):
        into.append(kwargs.get("into") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(delta_module, "decoded_windows", decoded_windows)
    for name, state, fused in (("d1.ckpt", states[1], True), ("d2.ckpt", states[2], False)):
        into.clear()
        assert_tree_bit_exact(lightning_nvcomp.load(tmp_path / name), state)
        assert into and set(into) == {fused}


def test_a_delta_at_a_url_reads_its_base_there() -> None:
    """Remote storage (fsspec's memory file system): the base is read through ranged reads, not a mapping."""
    fsspec = pytest.importorskip("fsspec")
    root = f"memory://delta-{os.getpid()}"
    try:
        lightning_nvcomp.save(drifting_state(0), f"{root}/k.ckpt", codec="zstd")
        lightning_nvcomp.save(drifting_state(1), f"{root}/d.ckpt", codec="zstd", base=f"{root}/k.ckpt")
        lightning_nvcomp.save(drifting_state(2), f"{root}/d2.ckpt", codec="zstd", base=f"{root}/d.ckpt")
        assert delta_records(f"{root}/d2.ckpt")
        assert_tree_bit_exact(lightning_nvcomp.load(f"{root}/d2.ckpt"), drifting_state(2))
        fsspec.filesystem("memory").rm(f"{root}/k.ckpt")
        with pytest.raises(MissingBaseError, match="k.ckpt is missing"):
            lightning_nvcomp.load(f"{root}/d2.ckpt")
    finally:
        fsspec.filesystem("memory").rm(root, recursive=True)


@pytest.mark.parametrize(
    "init_args",
    [{"codec": "zstd", "delta": {"keyframe_every": 8}}, {"options": {"codec": "zstd", "delta": {"keyframe_every": 8}}}],
)
def test_a_lightning_cli_config_turns_deltas_on(init_args: dict) -> None:
    """As a LightningCLI YAML's ``trainer.plugins`` entry writes it (jsonargparse makes the plugin)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--plugin", type=NvcompCheckpointIO)
    config = parser.parse_object(
        {"plugin": {"class_path": "lightning_nvcomp.NvcompCheckpointIO", "init_args": init_args}}
    )
    plugin = parser.instantiate(config).plugin
    assert plugin.writer.options.delta == DeltaOptions(keyframe_every=8) and plugin.writer.chain is not None


def test_a_save_against_a_broken_chain_stands_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A base whose own base is gone cannot be decoded: the save is stored alone (and says so), it does not fail."""
    lightning_nvcomp.save(drifting_state(0), tmp_path / "k.ckpt", codec="zstd")
    lightning_nvcomp.save(drifting_state(1), tmp_path / "d1.ckpt", codec="zstd", base=tmp_path / "k.ckpt")
    os.remove(tmp_path / "k.ckpt")
    lightning_nvcomp.save(drifting_state(2), tmp_path / "d2.ckpt", codec="zstd", base=tmp_path / "d1.ckpt")
    assert not delta_records(str(tmp_path / "d2.ckpt")) and "cannot be a base" in caplog.text
    assert_tree_bit_exact(lightning_nvcomp.load(tmp_path / "d2.ckpt"), drifting_state(2))
