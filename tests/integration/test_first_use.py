"""The rough edges a new user met (issue 16), each as that user meets it: the example's LightningCLI and its configs
run as commands, a real Trainer with its progress bar, real checkpoint files, the command line's ``main``.

CPU only. The example GPT is made tiny on the command line (a few hundred kB per checkpoint).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import lightning_nvcomp
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.errors import CodecUnavailableError, RefusedObjectsError

from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import python_child

EXAMPLES = REPO_ROOT / "examples"
CONFIGS = REPO_ROOT / "configs"
#: The example GPT made tiny (configs/demo_cpu.yaml's model and data are already small; this is smaller still).
TINY = [
    "--model.dim=32",
    "--model.layers=1",
    "--model.heads=2",
    "--model.context=16",
    "--data.batch_size=4",
    "--data.corpus_mb=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def _example_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python examples/lightning_gpt.py ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "lightning_gpt.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(cwd),
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )


# ---------------------------------------------------------------------------------------------------------------
# configs/ans.yaml on a machine without a GPU: one line, not ~90 lines of jsonargparse's union errors
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(gpu_available(), reason="gANS runs here: the config trains")
def test_ans_config_without_a_gpu_fails_with_one_line(tmp_path: Path) -> None:
    proc = _example_cli("fit", "--config", str(CONFIGS / "ans.yaml"), cwd=tmp_path)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) <= 3 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (message,) = [line for line in lines if "error:" in line]
    assert message.startswith("lightning_gpt.py: error: NvcompCheckpointIO: codec='ans' (nvCOMP gANS) needs a CUDA GPU")
    assert "use codec='zstd'" in message
    assert proc.stdout == ""


@pytest.mark.slow
def test_a_wrong_codec_in_a_config_fails_with_one_line(tmp_path: Path) -> None:
    config = yaml.safe_load((CONFIGS / "demo_cpu.yaml").read_text())
    config["trainer"]["plugins"][0]["init_args"]["codec"] = "zstdd"
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = _example_cli("fit", "--config", str(path), cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) <= 3, proc.stderr[-3000:]
    assert "error: NvcompCheckpointIO: codec must be one of ['auto', 'ans', 'zstd', 'none'], not 'zstdd'" in proc.stderr


def test_option_errors_raise_where_no_config_cli_makes_the_object() -> None:
    from lightning_nvcomp import NvcompCheckpointIO

    with pytest.raises(ValueError, match="codec must be one of"):
        NvcompCheckpointIO(codec="zstdd")
    if not gpu_available():
        with pytest.raises(CodecUnavailableError, match="needs a CUDA GPU and nvCOMP"):
            NvcompCheckpointIO(codec="ans")


# ---------------------------------------------------------------------------------------------------------------
# the console line: human units, on a line of its own beside Lightning's progress bar
# ---------------------------------------------------------------------------------------------------------------

PROGRESS_RUN = """
import sys, warnings
warnings.filterwarnings("ignore")
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_nvcomp import NvcompCheckpointIO
from tests.helpers.lightning_models import TinyData, TinyModule

for mode in ("sync", "async"):
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_model_summary=False, limit_val_batches=0,
        enable_progress_bar=True, default_root_dir=sys.argv[1],
        plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4, async_save=mode == "async")],
        callbacks=[ModelCheckpoint(dirpath=f"{sys.argv[1]}/{mode}", filename="{epoch}-{step}", save_top_k=-1)],
    )
    trainer.fit(TinyModule(), datamodule=TinyData())
"""


def terminal_lines(output: str) -> list[str]:
    """What a terminal shows for ``output``: each line as left by carriage returns writing over it."""
    shown = []
    for line in output.split("\n"):
        screen: list[str] = []
        for part in line.split("\r"):
            screen[: len(part)] = part
        shown.append("".join(screen).rstrip())
    return shown


@pytest.mark.slow
def test_console_line_has_human_units_and_a_line_of_its_own(tmp_path: Path) -> None:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    # one stream, as a terminal shows both: the progress bar (stdout) and Lightning's log (stderr)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRESS_RUN, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        env=env,
        cwd=str(REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "Epoch 1" in proc.stdout  # the progress bar was drawn
    shown = terminal_lines(proc.stdout)
    summaries = [line for line in shown if "lightning_nvcomp: " in line and ".ckpt:" in line]
    names = [f"{mode}/epoch={e}-step={4 * (e + 1)}.ckpt" for mode in ("sync", "async") for e in (0, 1)]
    assert len(summaries) == 4 and all(any(n in line for line in summaries) for n in names), "\n".join(shown)
    for line in summaries:
        assert line.startswith("lightning_nvcomp: "), line  # not after the bar's text on its line
        # a checkpoint of ~2 kB: in kB and ms, not "0.00 -> 0.00 GB" and "0.00 s"
        assert re.search(
            r": zstd \d+\.\d\d -> \d+\.\d\d kB \(\d\.\d{3}x\), training blocked -?\d+\.\d (ms|s) ", line
        ), line
        assert " GB" not in line and "0.00 s" not in line, line


def test_summary_units() -> None:
    from lightning_nvcomp.telemetry import savings as telemetry
    from lightning_nvcomp.telemetry.stats import SaveStats

    def line(raw: int, stored: int, blocked: float) -> str:
        stats = SaveStats("f.ckpt", "zstd", raw, stored, 0.0, 0.0)
        return telemetry.summary("f.ckpt", stats, telemetry.Savings().add(stats, blocked, raw / 1e9))

    assert "zstd 812 -> 700 B (1.160x), training blocked 2.5 ms" in line(812, 700, 0.0025)
    assert "zstd 257.73 -> 236.60 kB" in line(257_730, 236_600, 0.1)
    assert "zstd 12.35 -> 10.02 MB" in line(12_345_678, 10_020_000, 0.5)
    big = line(3_630_000_000, 3_010_000_000, 2.5)
    assert "zstd 3.63 -> 3.01 GB" in big and "training blocked 2.50 s (torch.save: 3.63 s)" in big
    assert "saved 1.13 s so far" in big


# ---------------------------------------------------------------------------------------------------------------
# resuming the example: the README's command continues training; load_from_checkpoint reads the files
# ---------------------------------------------------------------------------------------------------------------


def _resume_commands() -> list[tuple[str, str]]:
    """(where, command) for every ``lightning_gpt.py fit ... --ckpt_path`` the README, the example and the configs
    show (continuation lines joined)."""
    found = []
    for path in [REPO_ROOT / "README.md", EXAMPLES / "lightning_gpt.py", *sorted(CONFIGS.glob("*.yaml"))]:
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if "lightning_gpt.py fit" in line and "--ckpt_path" in line:
                found.append((path.name, line.split("python ", 1)[1].split("#")[0].strip()))
    return found


def test_every_resume_command_trains_on() -> None:
    """A resumed run trains until ``trainer.max_steps``: a command that resumes the config's finished run must raise
    it above the config's, or it trains 0 steps."""
    commands = _resume_commands()
    assert {where for where, _ in commands} >= {"README.md", "lightning_gpt.py", "ans.yaml"}, commands
    for where, command in commands:
        args = shlex.split(command)
        config = yaml.safe_load((REPO_ROOT / args[args.index("--config") + 1]).read_text())
        assert "--trainer.max_steps" in args, (where, command)
        assert int(args[args.index("--trainer.max_steps") + 1]) > config["trainer"]["max_steps"], (where, command)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``examples/lightning_gpt.py fit --config configs/demo_cpu.yaml`` (tiny), 10 steps: a checkpoint at step 10."""
    root = tmp_path_factory.mktemp("gpt")
    proc = _example_cli(
        "fit",
        "--config",
        str(CONFIGS / "demo_cpu.yaml"),
        *TINY,
        "--trainer.max_steps=10",
        f"--trainer.logger.init_args.save_dir={root}",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    (last,) = root.glob("demo_cpu/version_0/checkpoints/last.ckpt")
    return last


@pytest.mark.slow
def test_the_readme_resume_command_continues_training(first_run: Path, tmp_path: Path) -> None:
    """The README's resume command, run on the tiny CPU config (its max_steps 3000 scaled to 20): it restores step
    10 and trains on to step 20."""
    (command,) = [c for where, c in _resume_commands() if where == "README.md"]
    args = shlex.split(command)[1:]  # without the script
    args[args.index("--config") + 1] = str(CONFIGS / "demo_cpu.yaml")
    args[args.index("--trainer.max_steps") + 1] = "20"
    args[args.index("--ckpt_path") + 1] = str(first_run)
    proc = _example_cli(*args, *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert f"Restoring states from the checkpoint path at {first_run}" in proc.stderr
    saved = sorted(p.name for p in tmp_path.glob("demo_cpu/version_0/checkpoints/*.ckpt"))
    assert saved == ["epoch=0-step=20.ckpt", "last.ckpt"], saved  # trained from step 10, not from 0 and not 0 steps
    assert torch.load(tmp_path / "demo_cpu/version_0/checkpoints/last.ckpt")["global_step"] == 20


LOAD_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[2])
if sys.argv[3] == "example":
    from lightning_gpt import GPTModule  # a user's script: the example, not lightning_nvcomp, imported
    module = GPTModule.load_from_checkpoint(sys.argv[1])
    result = {"class": type(module).__name__, "dim": module.hparams.dim, "params": sum(p.numel() for p in module.parameters())}
else:
    import torch
    try:
        torch.load(sys.argv[1], weights_only=True)
        result = {"error": None}
    except Exception as err:
        result = {"error": str(err)}
result["imported"] = "lightning_nvcomp" in sys.modules
print(json.dumps(result))
"""


@pytest.mark.slow
def test_load_from_checkpoint_through_the_example(first_run: Path) -> None:
    """``GPTModule.load_from_checkpoint`` in a fresh process that imports only the example works: the example
    imports lightning_nvcomp. Without that import torch refuses the file (the control)."""
    loaded = python_child(LOAD_CHILD, str(first_run), str(EXAMPLES), "example", timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-5000:]
    result = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert result["class"] == "GPTModule" and result["dim"] == 32 and result["params"] > 0 and result["imported"]

    plain = python_child(LOAD_CHILD, str(first_run), str(EXAMPLES), "torch", timeout=300)
    result = json.loads(plain.stdout.strip().splitlines()[-1])
    assert not result["imported"] and "lightning_nvcomp" in result["error"] and "decode_tensor" in result["error"]


#: Example modules that never read or write a checkpoint: the model definition the others import, and the plot of
#: the TensorBoard events.
NO_CHECKPOINTS = {"gpt.py", "plot_savings.py"}


def _imports_lightning_nvcomp(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "lightning_nvcomp" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lightning_nvcomp":
            return True
    return False


def test_every_example_imports_lightning_nvcomp() -> None:
    examples = sorted(EXAMPLES.glob("*.py"))
    assert {p.name for p in examples} >= {"lightning_gpt.py", "accelerate_train.py", "demo.py"} | NO_CHECKPOINTS
    missing = [p.name for p in examples if p.name not in NO_CHECKPOINTS and not _imports_lightning_nvcomp(p)]
    assert not missing, missing


def test_readme_imports_lightning_nvcomp_where_it_shows_load_from_checkpoint() -> None:
    blocks = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(), flags=re.S)
    shown = [b for b in blocks if "load_from_checkpoint(" in b]
    assert shown
    for block in shown:
        before = block.split("load_from_checkpoint(", 1)[0]
        assert re.search(r"^import lightning_nvcomp\b", before, flags=re.M), block


# ---------------------------------------------------------------------------------------------------------------
# inspect of something that is not a checkpoint of tensors
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "verify", "convert"])
def test_commands_on_a_pickled_module_say_what_it_is(tmp_path: Path, capsys, command: str) -> None:
    from lightning_nvcomp.cli import main

    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(4, 2), path)  # a whole module, not its state dict
    args = [command, str(path)] + (
        [str(tmp_path / "out.ckpt"), "--codec", "zstd", "-q"] if command == "convert" else []
    )
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"lightning-nvcomp: error: {path} is not a checkpoint lightning-nvcomp reads: its pickle ")
    assert "holds torch.nn.modules.linear.Linear" in err and "Save obj.state_dict() instead" in err
    assert "weights_only=False" not in err  # no option of these commands


def test_load_names_the_refused_objects(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    lightning_nvcomp.save({"module": torch.nn.Linear(4, 2), "w": torch.ones(3)}, path, codec="zstd")
    with pytest.raises(RefusedObjectsError, match="weights_only=True does not load") as info:
        lightning_nvcomp.load(path)
    assert info.value.path == str(path) and info.value.refused == ("torch.nn.modules.linear.Linear",)
    assert isinstance(lightning_nvcomp.load(path, weights_only=False)["module"], torch.nn.Linear)


# ---------------------------------------------------------------------------------------------------------------
# plot_savings.py and estimate
# ---------------------------------------------------------------------------------------------------------------


def _plot_savings():
    spec = importlib.util.spec_from_file_location("plot_savings_example", EXAMPLES / "plot_savings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plot_savings_of_a_missing_directory(tmp_path: Path, monkeypatch, capsys) -> None:
    plot_savings = _plot_savings()
    monkeypatch.setattr(
        sys, "argv", ["plot_savings.py", str(tmp_path / "runs" / "nope"), "-o", str(tmp_path / "p.png")]
    )
    with pytest.raises(SystemExit) as info:
        plot_savings.main()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"no such directory: {tmp_path / 'runs' / 'nope'}" in err and "nvcomp/" not in err
    # an existing directory without the metrics still says that
    monkeypatch.setattr(sys, "argv", ["plot_savings.py", str(tmp_path), "-o", str(tmp_path / "p.png")])
    with pytest.raises(SystemExit, match=f"no nvcomp/ metrics under {tmp_path}"):
        plot_savings.main()
    assert not (tmp_path / "p.png").exists()


def test_estimate_units_line_is_the_estimate_at_hand(capsys) -> None:
    from lightning_nvcomp.cli import main

    assert main(["estimate"]) == 0
    assert "(so 782 GiB at 5 GiB/s = 156 s)" in capsys.readouterr().out  # the published case, the defaults
    assert main(["estimate", "--params", "8e9", "--gpus", "16", "--storage-gbps", "2"]) == 0
    out = capsys.readouterr().out
    assert "(so 89.4 GiB at 2 GiB/s = 44.7 s)" in out and "782" not in out


# ---------------------------------------------------------------------------------------------------------------
# Accelerate: the savings metrics at the run's step
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True])
def test_accelerate_metrics_are_logged_at_the_runs_step(tmp_path: Path, async_save: bool) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lightning_nvcomp.accelerate import attach

    from tests.helpers import accelerate_runs as R

    run = R.build(seed=3, log_with="tensorboard", project_dir=str(tmp_path / "project"))
    run.accelerator.init_trackers("run")
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4, async_save=async_save)
    for step in (3, 6, 9):
        R.train(run, 3)
        run.accelerator.log({"train/loss": float(step)}, step=step)
        run.accelerator.save_state(str(tmp_path / f"ck{step}"))
    attachment.detach()
    run.accelerator.log({"after": 1.0}, step=10)  # Accelerate's own log again
    assert attachment.logged_step == 9
    run.accelerator.end_training()
    (logdir,) = {p.parent for p in (tmp_path / "project").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert steps["train/loss"] == [3, 6, 9] and steps["after"] == [10]
    assert steps["nvcomp/ratio"] == [3, 6, 9] and steps["nvcomp/saved_s_total"] == [3, 6, 9]


def test_accelerate_metrics_without_a_logged_step_stay_at_the_save_index(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lightning_nvcomp.accelerate import attach

    from tests.helpers import accelerate_runs as R

    run = R.build(seed=4, log_with="tensorboard", project_dir=str(tmp_path / "project"))
    run.accelerator.init_trackers("run")
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4)
    for i in range(2):
        R.train(run, 1)
        run.accelerator.save_state(str(tmp_path / f"ck{i}"))
    attachment.detach()
    run.accelerator.end_training()
    (logdir,) = {p.parent for p in (tmp_path / "project").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("nvcomp/ratio")] == [0, 1]
