"""The Accelerate integration on the CPU: a real ``Accelerator(cpu=True)``, real files, real child processes.

``attach(accelerator, ...)`` makes ``save_state`` write the model, optimizer, scheduler and registered objects as
compressed torch zips; everything else (names, pruning, RNG files, ``load_state``) stays Accelerate's. Every
comparison here is of bits (``assert_tree_bit_exact`` / SHA-256 of the bits), never of values.

"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import lightning_nvcomp
from lightning_nvcomp.format import TensorInfo, describe
from lightning_nvcomp.integrations.accelerate.attach import attach
from lightning_nvcomp.storage import ThrottledStorage

from tests.helpers import accelerate_runs as R
from tests.helpers.paths import HELPERS, REPO_ROOT
from tests.helpers.processes import child_json, python_child, torchrun
from tests.helpers.states import assert_tree_bit_exact

#: The children import this checkout's package (the PYTHONPATH this run has, if any) and the test helpers.
CHILD_ENV = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    "OMP_NUM_THREADS": "1",
}
#: What ``save_state`` writes for one model, optimizer, scheduler and registered object on one process.
FILES = {"pytorch_model.bin", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"}
#: The files that go through the attachment's writer and hold tensors (the scheduler's state has none; the RNG
#: states are Accelerate's own plain torch.save).
COMPRESSED = {"pytorch_model.bin", "optimizer.bin", "custom_checkpoint_0.pkl"}
#: The savings metrics the brief and the README promise (a subset of telemetry.Savings' keys).
DOCUMENTED = {"nvcomp/ratio", "nvcomp/blocked_s", "nvcomp/saved_s_total", "nvcomp/saved_usd_total"}


def _tensor_infos(tree: object) -> list[TensorInfo]:
    """The TensorInfo leaves of a :func:`describe` tree (one per compressed tensor)."""
    if isinstance(tree, TensorInfo):
        return [tree]
    if isinstance(tree, dict):
        return [i for v in tree.values() for i in _tensor_infos(v)]
    if isinstance(tree, (list, tuple)):
        return [i for v in tree for i in _tensor_infos(v)]
    return []


def _plain_tensors(tree: object) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _plain_tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _plain_tensors(v)]
    return []


def _mutate(run: R.Run) -> None:
    """Change every piece of state save_state captures, in place (as training would, and more)."""
    R.train(run, 2)
    with torch.no_grad():
        for p in run.model.parameters():
            p.add_(1.0)
    run.progress.batches += 1000
    run.progress.loss_ema.fill_(float("nan"))


def _assert_loaded(run: R.Run, expected: dict) -> None:
    # check_type=False: the optimizer state is compared as state_dict trees (Parameter-ness is the model's business)
    assert_tree_bit_exact(expected, R.states(run), check_type=False)


# 1. round trip ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("codec", ["zstd", "none", "auto"])
def test_save_load_round_trip_is_bit_exact(tmp_path, codec, async_save):
    run = R.build(seed=1)
    R.train(run, 3)
    attachment = attach(run.accelerator, codec=codec, async_save=async_save, probe_mb=4)
    expected = copy.deepcopy(R.states(run))
    torch_rng_at_save = torch.get_rng_state()
    location = run.accelerator.save_state(str(tmp_path / "ck"))
    assert Path(location) == tmp_path / "ck"
    py_np_after_save = R.draws()[:2]
    _mutate(run)  # async: right away, while the background write may still be running
    run.accelerator.load_state(str(tmp_path / "ck"))
    _assert_loaded(run, expected)
    assert torch.equal(torch.get_rng_state(), torch_rng_at_save)  # torch's: as when save_state was called
    assert R.draws()[:2] == py_np_after_save  # Python's and NumPy's RNGs continue as after the save
    attachment.detach()
    assert set(os.listdir(tmp_path / "ck")) == FILES


def test_torch_rng_draws_after_save_match_draws_after_load(tmp_path):
    run = R.build(seed=2)
    R.train(run, 1)
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4)
    run.accelerator.save_state(str(tmp_path / "ck"))
    after_save = R.draws()
    R.train(run, 1)
    run.accelerator.load_state(str(tmp_path / "ck"))
    attachment.detach()
    assert R.draws() == after_save


# 2. files on disk ---------------------------------------------------------------------------------------------


def test_files_are_compressed_torch_zips_that_plain_torch_load_reads(tmp_path):
    run = R.build(seed=3)
    R.train(run, 5)  # AdamW moments of a few steps on trained-like weights
    run.accelerator.save_state(str(tmp_path / "plain"))  # unattached: Accelerate's own files
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4)
    run.accelerator.save_state(str(tmp_path / "ck"), safe_serialization=True)  # ignored: torch zips
    attachment.detach()
    expected = R.states(run)
    ck = tmp_path / "ck"
    assert set(os.listdir(ck)) == FILES  # no temp or probe files left behind
    assert set(os.listdir(tmp_path / "plain")) == FILES - {"pytorch_model.bin"} | {"model.safetensors"}
    for name in sorted(COMPRESSED):
        infos = _tensor_infos(describe(ck / name))
        assert infos, f"{name}: no compressed tensor"
        assert not _plain_tensors(describe(ck / name)), f"{name}: a tensor was stored uncompressed"
    # Accelerate's own torch.save of the RNG states, the same as unattached (nothing was drawn in between)
    plain_rng, ours_rng = (torch.load(d / "random_states_0.pkl", weights_only=False) for d in (tmp_path / "plain", ck))
    assert plain_rng.keys() == ours_rng.keys()
    assert (plain_rng["step"], plain_rng["random_state"]) == (ours_rng["step"], ours_rng["random_state"])
    (name_a, keys_a, *rest_a), (name_b, keys_b, *rest_b) = plain_rng["numpy_random_seed"], ours_rng["numpy_random_seed"]
    assert (name_a, rest_a) == (name_b, rest_b) and keys_a.tobytes() == keys_b.tobytes()
    assert_tree_bit_exact(plain_rng["torch_manual_seed"], ours_rng["torch_manual_seed"])
    assert (ck / "optimizer.bin").stat().st_size < (tmp_path / "plain" / "optimizer.bin").stat().st_size
    assert (ck / "pytorch_model.bin").stat().st_size < (tmp_path / "plain" / "model.safetensors").stat().st_size

    # A fresh interpreter: plain torch.load (weights_only=True, torch's default) once lightning_nvcomp is imported.
    code = """
        import json, sys, torch
        import lightning_nvcomp
        from tests.helpers import accelerate_runs as R
        out = {n: R.tree_digest(torch.load(f"{sys.argv[1]}/{n}", weights_only=True)) for n in sys.argv[2:]}
        print(json.dumps(out))
    """
    names = ["pytorch_model.bin", "optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl"]
    got = child_json(python_child(code, str(ck), *names, env=CHILD_ENV, check=True))
    assert got["pytorch_model.bin"] == R.tree_digest(expected["model"])
    assert got["optimizer.bin"] == R.tree_digest(expected["optimizer"])
    assert got["scheduler.bin"] == R.tree_digest(expected["scheduler"])
    assert got["custom_checkpoint_0.pkl"] == R.tree_digest(expected["progress"])
    # and the compressed optimizer holds exactly what the uncompressed one does
    assert_tree_bit_exact(torch.load(tmp_path / "plain" / "optimizer.bin"), torch.load(ck / "optimizer.bin"))


# 3. training continues identically ----------------------------------------------------------------------------

RESUME_IN_CHILD = """
    import json, sys, torch
    from tests.helpers import accelerate_runs as R
    from lightning_nvcomp.integrations.accelerate.attach import attach
    torch.set_num_threads(int(sys.argv[5]))  # the parent's (one_intra_op_thread): float sums depend on the split
    run = R.build(seed=99)  # other initial weights and RNG: everything must come from the checkpoint
    attachment = attach(run.accelerator, codec=sys.argv[2], async_save=sys.argv[3] == "1", probe_mb=4)
    run.accelerator.load_state(sys.argv[1])
    R.train(run, int(sys.argv[4]))
    attachment.detach()
    print(json.dumps(R.tree_digest(R.states(run))))
"""


@pytest.fixture
def one_intra_op_thread():
    """One intra-op thread while the test trains: float sums depend on how the work is split among threads, and
    the resume test once saw its two runs of the same steps differ in the weights (no checksum error) on a loaded
    2-core CI machine. With one thread the split cannot differ between them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_resumed_training_matches_uninterrupted_training(tmp_path, async_save, one_intra_op_thread):
    total, first = 7, 3
    a = R.build(seed=4)
    R.train(a, total)
    uninterrupted = R.tree_digest(R.states(a))

    b = R.build(seed=4)
    R.train(b, first)
    attachment = attach(b.accelerator, codec="zstd", async_save=async_save, probe_mb=4)
    b.accelerator.save_state(str(tmp_path / "ck"))
    attachment.detach()

    if not async_save:  # a fresh process, fresh Accelerator and objects (once: an interpreter start costs ~3 s)
        child = python_child(
            RESUME_IN_CHILD,
            str(tmp_path / "ck"),
            "zstd",
            "0",
            str(total - first),
            str(torch.get_num_threads()),
            env=CHILD_ENV,
            check=True,
        )
        assert child_json(child) == uninterrupted

    # fresh objects in this process too
    c = R.build(seed=98)
    c.accelerator.load_state(str(tmp_path / "ck"))  # unattached: Accelerate's own load_state reads them as well
    R.train(c, total - first)
    assert R.tree_digest(R.states(c)) == uninterrupted


def test_saving_does_not_change_training(tmp_path, one_intra_op_thread):
    a = R.build(seed=5)
    R.train(a, 6)
    b = R.build(seed=5)
    attachment = attach(b.accelerator, codec="zstd", probe_mb=4)
    for i in range(3):
        R.train(b, 2)
        b.accelerator.save_state(str(tmp_path / f"ck{i}"))
    attachment.detach()
    assert R.tree_digest(R.states(b)) == R.tree_digest(R.states(a))


# 4. automatic naming and total_limit --------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_total_limit_keeps_the_last_two_complete_checkpoints(tmp_path, async_save):
    from accelerate.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    run = R.build(seed=6, project_config=config)
    # sync saves durable when they return (with "background" durability, their files would appear once flushed)
    attachment = attach(run.accelerator, codec="zstd", async_save=async_save, probe_mb=4, durable="sync")
    # ~0.8 MB a checkpoint at 4 MB/s: each background write outlasts the next training steps by far, so every
    # save_state after the first meets a write still in flight in the directory it is about to prune or beside it
    attachment.writer.storage = ThrottledStorage(4e6)
    saved, pending_on_return = [], []
    for i in range(5):
        R.train(run, 1)
        saved.append(copy.deepcopy(R.states(run)))
        location = Path(run.accelerator.save_state())
        assert location == tmp_path / "checkpoints" / f"checkpoint_{i}"
        pending_on_return.append(not (location / "optimizer.bin").exists())
    if async_save:
        assert all(pending_on_return)  # the test really overlaps background writes with pruning
    else:
        assert not any(pending_on_return)
    attachment.wait()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_3", "checkpoint_4"]
    for i in (3, 4):
        assert set(os.listdir(tmp_path / "checkpoints" / f"checkpoint_{i}")) == FILES, i  # complete, no temp files
    _mutate(run)
    run.accelerator.load_state()  # automatic naming: the latest
    _assert_loaded(run, saved[4])
    run.accelerator.load_state(str(tmp_path / "checkpoints" / "checkpoint_3"))
    _assert_loaded(run, saved[3])
    attachment.detach()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_3", "checkpoint_4"]


def test_delta_checkpoints_survive_total_limit(tmp_path):
    """Each file a delta of its namesake in its chain's keyframe folder: before Accelerate's total_limit deletes a
    folder, the files the kept checkpoints still need are kept beside each of them (hidden); the next save, its
    keyframe gone, starts a new chain; every kept checkpoint loads bit-exactly."""
    from accelerate.utils import ProjectConfiguration

    from lightning_nvcomp.format.bases import base_file

    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=3)
    run = R.build(seed=8, project_config=config)
    attachment = attach(
        run.accelerator, codec="zstd", probe_mb=4, durable="sync", delta=lightning_nvcomp.DeltaOptions()
    )
    saved, hidden = [], {}
    for i in range(5):
        R.train(run, 1)
        saved.append(copy.deepcopy(R.states(run)))
        run.accelerator.save_state()
        if i == 3:  # checkpoint_0 went: checkpoints 1 and 2 both need its pytorch_model.bin, each keeps it
            for k in (1, 2):
                hidden[k] = [n for n in os.listdir(tmp_path / "checkpoints" / f"checkpoint_{k}") if n[0] == "."]
            inodes = {  # one file, linked into both folders: no copy on a local disk
                (tmp_path / "checkpoints" / f"checkpoint_{k}" / n).stat().st_ino
                for k in (1, 2)
                for n in hidden[k]
                if n.startswith(".pytorch_model.bin.")
            }
            assert len(inodes) == 1, inodes
    attachment.wait()
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3", "checkpoint_4"]
    assert all(any(n.startswith(".pytorch_model.bin.") for n in names) for names in hidden.values()), hidden

    def bases(k: int, name: str = "pytorch_model.bin") -> set[str]:
        found = base_file(str(root / f"checkpoint_{k}" / name))
        assert found is not None
        return {r.record["delta"]["base"]["file"] for r in found.records if "delta" in r.record}

    assert bases(2) == {"../checkpoint_0/pytorch_model.bin"} and bases(3) == set()
    assert bases(4) == {"../checkpoint_3/pytorch_model.bin"} and bases(4, "optimizer.bin")
    _mutate(run)
    run.accelerator.load_state()  # the latest
    _assert_loaded(run, saved[4])
    run.accelerator.load_state(str(root / "checkpoint_2"))  # its base lies hidden beside it
    _assert_loaded(run, saved[2])
    attachment.detach()


def _bytes_written() -> int:
    """Bytes this process (all threads) has passed to write(2) so far (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_automatic_naming_probes_the_storage_once(tmp_path):
    from accelerate.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    run = R.build(seed=7, project_config=config)
    attachment = attach(run.accelerator, codec="zstd", probe_mb=16)
    run.accelerator.save_state()  # the first save may probe
    written = []
    for _ in range(2):
        before = _bytes_written()
        run.accelerator.save_state()
        written.append(_bytes_written() - before)
    attachment.detach()
    assert max(written) < 4 << 20, written  # a checkpoint is < 1 MB; a 16 MiB probe is not part of it


def test_background_write_failure_surfaces_and_the_attachment_recovers(tmp_path):
    run = R.build(seed=13)
    R.train(run, 2)
    attachment = attach(run.accelerator, codec="zstd", async_save=True, probe_mb=4)
    attachment.writer.storage = ThrottledStorage(4e6)  # the writes are still running when the directory goes
    run.accelerator.save_state(str(tmp_path / "doomed"))
    (tmp_path / "doomed").rename(tmp_path / "gone")  # not rmtree: it races with the writer's next file
    while attachment.writer.pending():  # the next save_state does not wait for them: it raises a failure done
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="background save of .*doomed"):
        run.accelerator.save_state(str(tmp_path / "next"))  # the failure is raised by the next save_state
    for _ in range(8):  # the doomed checkpoint's other files may fail too: each wait() raises one failure
        try:
            attachment.wait()
            break
        except RuntimeError as err:
            assert "doomed" in str(err)
    R.train(run, 1)
    expected = copy.deepcopy(R.states(run))
    run.accelerator.save_state(str(tmp_path / "next"))
    attachment.detach()  # no error left over
    assert set(os.listdir(tmp_path / "next")) == FILES
    _mutate(run)
    run.accelerator.load_state(str(tmp_path / "next"))
    _assert_loaded(run, expected)


def test_wait_after_a_failure_still_waits_for_the_rest_of_that_checkpoint(tmp_path):
    run = R.build(seed=14)
    attachment = attach(run.accelerator, codec="zstd", async_save=True, probe_mb=4)
    attachment.writer.storage = ThrottledStorage(1e6)  # ~0.2 s for the model file, ~0.45 s for the optimizer's
    ck = tmp_path / "ck"
    (ck / "pytorch_model.bin").mkdir(parents=True)  # a directory where the model file goes: its write fails
    (ck / "pytorch_model.bin" / "kept").write_text("not empty")
    run.accelerator.save_state(str(ck))
    with pytest.raises(RuntimeError, match="pytorch_model.bin"):
        attachment.wait()
    try:
        attachment.wait()
    except RuntimeError:
        pass  # raising the next failure would be fine too; returning early is not
    in_flight = [n for n in os.listdir(ck) if n.endswith(".tmp")]
    attachment.detach()
    assert not in_flight, in_flight
    assert "optimizer.bin" in os.listdir(ck)  # the rest of the checkpoint was written


# 5. metrics ---------------------------------------------------------------------------------------------------


def _tensorboard_scalars(logdir: Path) -> dict[str, list]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = {p.parent for p in logdir.rglob("events.out.tfevents.*")}
    assert len(runs) == 1, runs
    acc = EventAccumulator(str(runs.pop()), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def _lightning_metric_names(tmp_path: Path) -> set[str]:
    """The metric names the Lightning plugin produces for one zstd save with a GPU-hour price."""
    from lightning_nvcomp.integrations.lightning.checkpoint_io import NvcompCheckpointIO

    io = NvcompCheckpointIO(codec="zstd", gpu_hour_usd=2.0, probe_mb=4)
    with warnings.catch_warnings():  # "no savings callback is attached": there is no Trainer here
        warnings.simplefilter("ignore")
        io.save_checkpoint({"state_dict": {"w": torch.randn(1000)}, "global_step": 1}, tmp_path / "lightning.ckpt")
    io.teardown()
    return set(io.savings.history[0])


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_savings_metrics_reach_tensorboard(tmp_path, async_save):
    run = R.build(seed=8, log_with="tensorboard", project_dir=str(tmp_path / "project"))
    run.accelerator.init_trackers("run")
    attachment = attach(run.accelerator, codec="zstd", async_save=async_save, gpu_hour_usd=2.0, probe_mb=4)
    for i in range(3):
        R.train(run, 1)
        run.accelerator.save_state(str(tmp_path / f"ck{i}"))
    attachment.detach()  # async: the last save's metrics are logged here
    run.accelerator.end_training()

    scalars = _tensorboard_scalars(tmp_path / "project")
    names = {t for t in scalars if t.startswith(lightning_nvcomp.telemetry.savings.PREFIX)}
    assert DOCUMENTED <= names
    assert names == _lightning_metric_names(tmp_path)  # the same metrics as the Lightning plugin
    assert all(len(scalars[name]) == 3 for name in names), {n: len(scalars[n]) for n in names}  # one per save
    history = attachment.writer.savings.history
    for name in names:  # what reached TensorBoard is what was measured (TensorBoard stores float32)
        assert [e.value for e in scalars[name]] == pytest.approx([h[name] for h in history], rel=1e-6, abs=1e-12)
    assert all(e.value > 1.0 for e in scalars["nvcomp/ratio"])  # zstd on trained-like weights and AdamW moments
    totals = [e.value for e in scalars["nvcomp/saved_s_total"]]
    usd = [e.value for e in scalars["nvcomp/saved_usd_total"]]
    assert usd == pytest.approx([s / 3600 * 2.0 for s in totals], rel=1e-5)


def test_auto_codec_metrics_match_the_lightning_plugins(tmp_path):
    from lightning_nvcomp.integrations.lightning.checkpoint_io import NvcompCheckpointIO

    run = R.build(seed=15)
    attachment = attach(run.accelerator, codec="auto", gpu_hour_usd=2.0, probe_mb=4)
    run.accelerator.save_state(str(tmp_path / "ck"))
    attachment.detach()
    io = NvcompCheckpointIO(codec="auto", gpu_hour_usd=2.0, probe_mb=4)
    with warnings.catch_warnings():  # "no savings callback is attached": there is no Trainer here
        warnings.simplefilter("ignore")
        io.save_checkpoint({"state_dict": R.states(run)["model"], "global_step": 1}, tmp_path / "lightning.ckpt")
    io.teardown()
    assert set(attachment.writer.savings.history[0]) == set(io.savings.history[0])


def test_each_save_is_logged_at_its_own_step(tmp_path):
    run = R.build(seed=9, log_with="tensorboard", project_dir=str(tmp_path / "project"))
    run.accelerator.init_trackers("run")
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4)
    for i in range(3):
        R.train(run, 2)
        run.accelerator.save_state(str(tmp_path / f"ck{i}"))
    attachment.detach()
    run.accelerator.end_training()
    steps = [e.step for e in _tensorboard_scalars(tmp_path / "project")["nvcomp/ratio"]]
    assert len(set(steps)) == 3 and steps == sorted(steps), steps


# 6. detach ----------------------------------------------------------------------------------------------------


def test_detach_restores_accelerates_own_save_and_load(tmp_path):
    from accelerate import Accelerator

    run = R.build(seed=10)
    R.train(run, 2)
    acc = run.accelerator
    attachment = attach(acc, codec="zstd", probe_mb=4)
    assert acc.save_state == attachment.save_state
    expected = copy.deepcopy(R.states(run))
    acc.save_state(str(tmp_path / "compressed"))
    attachment.detach()
    assert "save_state" not in vars(acc) and "load_state" not in vars(acc)
    assert acc.save_state.__func__ is Accelerator.save_state and acc.load_state.__func__ is Accelerator.load_state

    acc.save_state(str(tmp_path / "own"))
    own = tmp_path / "own"
    assert set(os.listdir(own)) == FILES - {"pytorch_model.bin"} | {"model.safetensors"}
    for name in ("optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl"):
        assert not _tensor_infos(describe(own / name)), f"{name} is compressed after detach"
    # Accelerate's own load_state still reads the compressed checkpoint (the decoder is registered at import)
    _mutate(run)
    acc.load_state(str(tmp_path / "compressed"))
    _assert_loaded(run, expected)
    attachment.detach()  # a second detach is harmless


ATTACH_TWICE = """
    import faulthandler, os, sys
    from tests.helpers import accelerate_runs as R
    from lightning_nvcomp.integrations.accelerate.attach import attach
    run = R.build(seed=16)
    attach(run.accelerator, codec="zstd", probe_mb=4)
    try:
        second = attach(run.accelerator, codec="zstd", probe_mb=4)
    except (ValueError, RuntimeError) as err:  # refusing is fine
        print("refused:", err)
    else:  # so is working
        faulthandler.dump_traceback_later(float(sys.argv[2]), exit=True)  # a deadlock: a traceback and exit 1
        run.accelerator.save_state(sys.argv[1])
        second.detach()
        print("saved:", sorted(os.listdir(sys.argv[1])))
    faulthandler.cancel_dump_traceback_later()
"""


@pytest.mark.slow  # ~4 s once fixed; 10 s while it deadlocks (the child's 5 s watchdog)
def test_attaching_twice_does_not_deadlock(tmp_path):
    child = python_child(ATTACH_TWICE, str(tmp_path / "ck"), "5", env=CHILD_ENV, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.startswith(("refused:", "saved:")), child.stdout


# 7. two processes ---------------------------------------------------------------------------------------------


def _launch_two_ranks(tmp_path: Path, timeout_s: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, **CHILD_ENV, PYTHONDONTWRITEBYTECODE="1")
    args = [str(tmp_path), str(tmp_path / "ck"), str(timeout_s)]
    return torchrun(2, HELPERS / "accelerate_ddp_child.py", args, env, timeout_s * 6 + 60, "2-process")


@pytest.mark.slow  # 7-10 s on 2 cores: torch.distributed.run and two ranks importing torch
def test_two_process_gloo_save_and_load(tmp_path):
    proc = _launch_two_ranks(tmp_path, 20)  # a rank-mismatched collective (a deadlock) fails after 20 s
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, out in enumerate(ranks):
        assert (out["rank"], out["world"], out["backend"]) == (r, 2, "gloo")
        assert out["distributed_type"] == "DistributedType.MULTI_CPU"
        assert out["draws_after_load"] == out["draws_after_save"], r  # each rank its own random_states_{r}.pkl
        assert out["world_size_metric"] == 2
    # rank 0 restored exactly what it saved; rank 1 got the same model, optimizer and scheduler (DDP keeps them in
    # step) and rank 0's registered object (Accelerate saves custom objects from the main process only)
    assert ranks[0]["loaded"] == ranks[0]["expected"]
    assert ranks[1]["loaded"] == ranks[0]["expected"]
    own = {repr_key: digest for _, repr_key, digest in ranks[1]["expected"]}
    loaded1 = {repr_key: digest for _, repr_key, digest in ranks[1]["loaded"]}
    for part in ("'model'", "'optimizer'", "'scheduler'"):
        assert loaded1[part] == own[part], part  # bit-exact on rank 1 against its own pre-save state too
    # only rank 0 wrote the compressed files; each rank its RNG states
    assert (ranks[0]["saves_written"], ranks[1]["saves_written"]) == (1, 0)
    ck = tmp_path / "ck"
    assert set(os.listdir(ck)) == FILES | {"random_states_1.pkl"}
    for name in COMPRESSED:
        assert _tensor_infos(describe(ck / name)), name


# 8. bad arguments ---------------------------------------------------------------------------------------------


def test_bad_codec_is_refused_before_anything_changes():
    run = R.build(seed=11)
    with pytest.raises(ValueError, match="bogus"):
        attach(run.accelerator, codec="bogus")
    assert "save_state" not in vars(run.accelerator)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_ans_without_a_gpu_is_refused():
    run = R.build(seed=12)
    with pytest.raises(lightning_nvcomp.CodecUnavailableError, match="ans"):
        attach(run.accelerator, codec="ans")
    assert "save_state" not in vars(run.accelerator)


# the example ----------------------------------------------------------------------------------------------------

EXAMPLE = REPO_ROOT / "examples" / "accelerate_train.py"
TINY_GPT = [
    "--cpu",
    "--dim",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--context",
    "32",
    "--batch",
    "4",
    "--corpus-mb",
    "1",
    "--codec",
    "zstd",
    "--probe-mb",
    "4",
    "--save-every",
    "2",
    "--log-every",
    "1",
]


def _example(*args: str) -> subprocess.CompletedProcess:
    """The example in a fresh interpreter, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *TINY_GPT, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO_ROOT),
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.mark.slow
def test_example_trains_saves_and_resumes_bit_exactly(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # for its `from gpt import ...`
    spec = importlib.util.spec_from_file_location("accelerate_train_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # uninterrupted and first half in this process (saves two interpreter starts), the resume in a fresh one; one
    # intra-op thread everywhere, as float sums depend on how the work is split
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        example.main([*TINY_GPT, "--steps", "4", "--project-dir", str(tmp_path / "straight")])
        example.main([*TINY_GPT, "--steps", "2", "--project-dir", str(tmp_path / "resumed"), "--async-save"])
    finally:
        torch.set_num_threads(threads)
    resumed = _example("--steps", "4", "--project-dir", str(tmp_path / "resumed"), "--async-save", "--resume", "latest")
    assert "at step 2" in resumed.stdout
    for run in ("straight", "resumed"):  # total_limit 2, automatic naming continued after the resumed checkpoint
        assert sorted(os.listdir(tmp_path / run / "checkpoints")) == ["checkpoint_0", "checkpoint_1"], run
    for name in sorted(FILES - {"random_states_0.pkl"}):
        a, b = (torch.load(tmp_path / run / "checkpoints" / "checkpoint_1" / name) for run in ("straight", "resumed"))
        assert_tree_bit_exact(a, b)
    assert torch.load(tmp_path / "resumed" / "checkpoints" / "checkpoint_1" / "custom_checkpoint_0.pkl")["step"] == 4
    scalars = _tensorboard_scalars_all(tmp_path / "straight")
    assert {"train/loss", "train/lr"} | DOCUMENTED <= set(scalars)
    assert len(scalars["nvcomp/ratio"]) == 2
    # the savings at the checkpoints' steps (2 and 4 of --save-every 2), where the example logs its losses too
    assert [e.step for e in scalars["nvcomp/ratio"]] == [2, 4]
    assert {2, 4} <= {e.step for e in scalars["train/loss"]}


def _tensorboard_scalars_all(logdir: Path) -> dict[str, list]:
    """Every scalar of every event file under ``logdir`` (Accelerate writes hparams to a second run dir)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list] = {}
    for run in {p.parent for p in logdir.rglob("events.out.tfevents.*")}:
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend(acc.Scalars(tag))
    return out


def test_an_async_save_told_the_run_ends_counts_its_write_in_full(tmp_path):
    """Accelerate has no fit whose end the savings callback could see: ``writer.policy.run_ending`` set before the
    run's last ``save_state`` makes auto decide it by its time to be written (the run waits for that write), where an
    earlier async save, with no interval known yet, is taken to write behind training."""
    run = R.build(seed=16)
    attachment = attach(run.accelerator, codec="auto", async_save=True, probe_mb=4)
    try:
        run.accelerator.save_state(str(tmp_path / "first"))
        early = attachment.writer.policy.last_decision[0]
        attachment.writer.policy.run_ending = True
        run.accelerator.save_state(str(tmp_path / "last"))
        last = attachment.writer.policy.last_decision[0]
        attachment.writer.wait()
    finally:
        attachment.detach()
    assert early.write_s > 0 and early.blocked_s == pytest.approx(early.encode_s)
    assert last.write_s > 0 and last.blocked_s == pytest.approx(last.encode_s + last.write_s)
