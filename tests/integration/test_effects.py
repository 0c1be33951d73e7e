"""Effects on the user's process (docs/ARCHITECTURE.md, "Effects on the user's process"): each goes through its one
mechanism and is undone as the table says. Real frameworks throughout: torch's optimizers and DCP, a real Trainer,
a real ``Accelerator(cpu=True)``, jsonargparse parsing real command lines, real checkpoint files."""

from __future__ import annotations

import ast
import contextvars
import gc
import importlib
import re
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.optim.optimizer as torch_optimizer

import lightning_nvcomp
from lightning_nvcomp import _process
from lightning_nvcomp import format as fileformat

from tests.helpers.files import tensor_data_entries
from tests.helpers.paths import REPO_ROOT
from tests.helpers.states import assert_tree_bit_exact, trained_like

PACKAGE = REPO_ROOT / "lightning_nvcomp"


def _global_step_hooks() -> int:
    """How many global ``torch.optim`` step hooks the process has (torch's registry of them)."""
    return len(torch_optimizer._global_optimizer_post_hooks)


def _own_step_hooks(optimizer: torch.optim.Optimizer) -> int:
    return len(optimizer._optimizer_step_post_hooks)


# -- rows 1-4: framework attributes, swapped through one helper with one lock ---------------------------------------


def test_compat_imports_nothing_above_it():
    """``_compat`` names framework internals for the layers above it and imports none of them (the DCP class-name
    seam lives in ``_compat.dcp``, no longer in ``integrations``)."""
    upward = []
    for path in sorted((PACKAGE / "_compat").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            upward += [f"{path.name}: {n}" for n in names if n.startswith("lightning_nvcomp.integrations")]
    assert upward == []


def test_every_framework_swap_waits_for_the_one_in_progress():
    """An Accelerate swap in progress on one thread holds back a Lightning swap on another until it ends: two
    seams never interleave their swaps (each once had a lock of its own, or none)."""
    import lightning.pytorch.strategies.fsdp as fsdp_module

    from lightning_nvcomp._compat.accelerate import checkpoint_io_as
    from lightning_nvcomp._compat.lightning import DISTRIBUTED_SAVE, distributed_checkpoint_helper_as

    inside, release, events = threading.Event(), threading.Event(), []

    def hold_accelerate_swap() -> None:
        with checkpoint_io_as(save=lambda *args, **kwargs: None):
            inside.set()
            release.wait(10)
            events.append("accelerate swap ends")

    holder = threading.Thread(target=hold_accelerate_swap)
    holder.start()
    assert inside.wait(10)
    threading.Timer(0.2, release.set).start()
    with distributed_checkpoint_helper_as(fsdp_module, DISTRIBUTED_SAVE, lambda *args: None):
        events.append("lightning swap begins")
    holder.join()
    assert events == ["accelerate swap ends", "lightning swap begins"]


def test_each_seam_puts_the_framework_back_also_when_the_block_fails():
    import accelerate.checkpointing as checkpointing
    import lightning.pytorch.strategies.fsdp as fsdp_module
    import torch.distributed.checkpoint as dist_cp

    from lightning_nvcomp._compat.accelerate import checkpoint_io_as
    from lightning_nvcomp._compat.dcp import filesystem_classes_as
    from lightning_nvcomp._compat.lightning import DISTRIBUTED_LOAD, distributed_checkpoint_helper_as

    before = (
        checkpointing.save,
        checkpointing.load,
        dist_cp.FileSystemWriter,
        dist_cp.FileSystemReader,
        fsdp_module._distributed_checkpoint_load,
    )
    ours = object()
    seams = [
        (checkpoint_io_as(save=ours, load=lambda original: ours, dcp_writer=ours), lambda: checkpointing.load),
        (filesystem_classes_as(reader=ours), lambda: dist_cp.FileSystemReader),
        (
            distributed_checkpoint_helper_as(fsdp_module, DISTRIBUTED_LOAD, ours),
            lambda: fsdp_module._distributed_checkpoint_load,
        ),
    ]
    for seam, swapped_name in seams:
        with pytest.raises(RuntimeError, match="the block fails"), seam:
            assert swapped_name() is ours
            raise RuntimeError("the block fails")
    after = (
        checkpointing.save,
        checkpointing.load,
        dist_cp.FileSystemWriter,
        dist_cp.FileSystemReader,
        fsdp_module._distributed_checkpoint_load,
    )
    assert after == before


def test_a_missing_framework_name_is_refused_and_nothing_is_swapped():
    import types

    module = types.ModuleType("framework")
    module.present = 1
    with pytest.raises(AttributeError), _process.swapped(module, {"present": 2, "absent": 3}):
        pass
    assert module.present == 1 and not hasattr(module, "absent")


# -- row 5: an attached Accelerator's own methods; row 6: the run's optimizers' step hooks ---------------------------


def test_attach_hooks_the_accelerators_optimizers_and_detach_removes_everything(tmp_path, monkeypatch):
    """A background save times the steps of the Accelerator's optimizer through a hook of its own (no global
    ``torch.optim`` hook, no other optimizer touched); ``detach`` removes the hook and gives the Accelerator its
    methods back."""
    from accelerate import Accelerator

    from lightning_nvcomp.integrations.accelerate.attach import attach

    from tests.helpers import accelerate_runs as R

    monkeypatch.chdir(tmp_path)
    run = R.build(seed=3)
    other = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    globals_before = _global_step_hooks()
    attachment = attach(run.accelerator, codec="zstd", async_save=True, probe_mb=4)
    R.train(run, 2)
    run.accelerator.save_state("ckpt")  # a relative directory, in the working directory
    R.train(run, 2)
    inner = run.optimizer.optimizer
    assert _own_step_hooks(inner) == 1 and _global_step_hooks() == globals_before and _own_step_hooks(other) == 0
    attachment.detach()
    assert _own_step_hooks(inner) == 0 and _global_step_hooks() == globals_before
    assert run.accelerator.save_state.__func__ is Accelerator.save_state and "log" not in vars(run.accelerator)
    assert Path("ckpt/optimizer.bin").is_file()


def test_a_fit_hooks_only_its_own_optimizers_and_the_hooks_end_with_it(tmp_path, monkeypatch):
    """During a fit with background writes, the Trainer's optimizer has the step timer's hook and the process has no
    global step hook; after the fit (the checkpoint IO's teardown) no hook is left."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.helpers.lightning_models import TinyData, TinyModule, quiet_trainer

    seen: list[tuple[int, int]] = []

    class Watching(TinyModule):
        def training_step(self, batch, batch_idx):
            seen.append((_own_step_hooks(self.trainer.optimizers[0]), _global_step_hooks()))
            return super().training_step(batch, batch_idx)

    monkeypatch.chdir(tmp_path)
    globals_before = _global_step_hooks()
    plugin = lightning_nvcomp.NvcompCheckpointIO(codec="none", async_save=True, durable="os", probe_mb=4)
    trainer = quiet_trainer(
        "run", plugins=[plugin], callbacks=[ModelCheckpoint(dirpath="ckpts", every_n_train_steps=2)], max_epochs=2
    )
    model = Watching()
    trainer.fit(model, datamodule=TinyData())
    after_first_save = seen[3:]  # the first save (step 2) started the timer
    assert after_first_save and all(hooks == (1, globals_before) for hooks in after_first_save), seen
    assert _own_step_hooks(trainer.optimizers[0]) == 0 and _global_step_hooks() == globals_before
    assert list(Path("ckpts").glob("*.ckpt"))


# -- row 7: the garbage collector paused where training waits, and put back as it was -------------------------------


def test_a_planning_pause_lasts_through_the_call_that_ends_it():
    """Once the call that ends a planning pause is reached (DCP's ``write_data`` / ``read_data``), its deadline no
    longer applies: the collector stays off to that call's end, however long, then is back on."""
    owner = type("Writer", (), {})()
    pause = _process.PauseBetweenCalls(owner, longest_s=0.05)
    pause.begin()
    with pause.through():
        time.sleep(0.2)  # well past the deadline
        assert not gc.isenabled()
    assert gc.isenabled()
    pause.begin()
    time.sleep(0.2)  # a plan that never reaches write_data: the deadline ends the pause
    assert gc.isenabled()


@pytest.mark.parametrize("enabled_before", [True, False])
def test_a_load_leaves_the_collector_as_it_found_it(tmp_path, monkeypatch, enabled_before):
    monkeypatch.chdir(tmp_path)
    state = {"w": trained_like(4096, torch.float32)}
    lightning_nvcomp.save(state, "c.ckpt", codec="zstd")
    (gc.enable if enabled_before else gc.disable)()
    try:
        assert_tree_bit_exact(lightning_nvcomp.load("c.ckpt"), state)
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()


def test_gc_pauses_are_made_in_the_places_the_table_names_and_nowhere_else():
    """Every use of the collector's pause in the package, by module (each justified in the table's row 7)."""
    uses: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_process.py":
            continue
        count = len(re.findall(r"collector_paused\(\)|PauseBetweenCalls\(", path.read_text()))
        if count:
            uses[str(path.relative_to(PACKAGE))] = count
    assert uses == {
        "format/reader.py": 1,
        "integrations/dcp/reader.py": 2,  # read_metadata; planning + read_data
        "integrations/dcp/writer.py": 3,  # stage; planning + write_data; finish
        "saving/single_file.py": 1,
        "saving/writer.py": 1,
    }


# -- rows 8-9: the decoders' context, one object, set only while a load runs -----------------------------------------


def test_the_decoders_context_is_one_object_in_one_context_variable():
    variables = []
    for path in sorted((PACKAGE / "format").glob("*.py")):
        module = importlib.import_module(f"lightning_nvcomp.format.{path.stem}")
        variables += [name for name, v in vars(module).items() if isinstance(v, contextvars.ContextVar)]
    assert variables == ["_set"]  # load_context's, set by load_context.loading alone


def test_a_load_runs_its_decoders_in_its_own_context_and_leaves_none_set(tmp_path, monkeypatch):
    """Our load's decoders run in the context it made (its file, its settings), a plain ``torch.load``'s in one of
    their own (the block's progress setting is what is active there); after either, nothing is set."""
    from lightning_nvcomp.format import load_context

    monkeypatch.chdir(tmp_path)
    state = {"w": trained_like(4096, torch.float32), "b": trained_like(64, torch.bfloat16, 1)}
    lightning_nvcomp.save(state, "c.ckpt", codec="zstd")
    ours: list[load_context.LoadContext | None] = []
    theirs: list[load_context.LoadContext | None] = []
    seen = [ours]

    def progress(nbytes: int) -> None:
        seen[0].append(load_context.active())

    with fileformat.decode_progress(progress):
        block = load_context.active()
        loaded = lightning_nvcomp.load("c.ckpt", keep_on_gpu=True)
        seen[0] = theirs
        plain = torch.load("c.ckpt")
    assert load_context.active() is None
    assert block is not None and block.state is None and block.progress is progress
    assert ours and all(c is ours[0] for c in ours)
    context = ours[0]
    assert context is not block and context.state is not None and context.state.name == "c.ckpt"
    assert context.keep_on_gpu and context.progress is progress
    assert theirs and all(c is block for c in theirs)
    assert_tree_bit_exact(loaded, state)
    assert_tree_bit_exact(plain, state)


def test_a_plain_torch_load_gets_a_fresh_context_naming_its_file(tmp_path, monkeypatch):
    """The context of a plain ``torch.load`` is found from the load itself (the pickled call cannot say which load
    it belongs to): a damaged record is reported with that load's file, even inside another file's load block."""
    from lightning_nvcomp.format import load_context

    monkeypatch.chdir(tmp_path)
    lightning_nvcomp.save({"w": trained_like(20000, torch.float32)}, "bad.ckpt", codec="zstd")
    lightning_nvcomp.save({"v": trained_like(64, torch.float32)}, "good.ckpt", codec="zstd")
    ((start, size),) = tensor_data_entries("bad.ckpt").values()
    data = bytearray(Path("bad.ckpt").read_bytes())
    data[start + size // 2] ^= 0xFF
    Path("bad.ckpt").write_bytes(data)
    with fileformat.decode_progress(lambda nbytes: None):
        with pytest.raises(lightning_nvcomp.CorruptCheckpointError, match="bad.ckpt.*'w'"):
            torch.load("bad.ckpt")
    assert str(tmp_path / "bad.ckpt") in _error_of(lambda: torch.load("bad.ckpt"))
    assert_tree_bit_exact(torch.load("good.ckpt")["v"], trained_like(64, torch.float32))
    assert load_context.active() is None


def _error_of(call) -> str:
    try:
        call()
    except lightning_nvcomp.CheckpointError as err:
        return str(err)
    raise AssertionError("no error")


# -- row 13: an option error of a config-file command line, without stack inspection or exit from the classes -------


def test_a_plugin_made_by_the_users_own_jsonargparse_function_raises_its_error(monkeypatch):
    """A program whose command line is jsonargparse's, making the plugin in its own code, gets the plugin's error to
    handle: the class neither inspects the stack nor ends the program."""
    import jsonargparse

    made: list[object] = []

    def build(codec: str = "zstd") -> None:
        try:
            made.append(lightning_nvcomp.NvcompCheckpointIO(codec=codec))
        except ValueError as err:
            made.append(err)

    monkeypatch.setattr("sys.argv", ["train.py"])
    jsonargparse.CLI(build, args=["--codec=zstdd"])
    (error,) = made
    assert isinstance(error, ValueError) and "codec must be one of" in str(error)


def test_a_config_made_plugin_with_a_bad_option_ends_the_command_with_one_line(tmp_path, capsys, monkeypatch):
    """A LightningCLI config making the plugin: jsonargparse's instantiator for our classes ends the command as a
    command line it rejects, in one line naming the class and the option."""
    from lightning.pytorch.cli import LightningCLI

    from tests.helpers.lightning_models import TinyData, TinyModule

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["train.py"])
    plugin = '[{"class_path": "lightning_nvcomp.NvcompCheckpointIO", "init_args": {"codec": "zstdd"}}]'
    with pytest.raises(SystemExit) as ended:
        LightningCLI(TinyModule, TinyData, args=["--trainer.plugins", plugin], run=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2
    assert err == [
        "train.py: error: NvcompCheckpointIO: codec must be one of ['auto', 'ans', 'zstd', 'none'], not 'zstdd'"
    ]


# -- row 14: process-wide resources; what a run object can own, it owns ----------------------------------------------


def test_the_sharded_strategies_and_the_attachment_own_their_dcp_policy():
    from accelerate import Accelerator

    from lightning_nvcomp.auto.policy import CodecPolicy
    from lightning_nvcomp.dcp import default_policy
    from lightning_nvcomp.integrations.accelerate.attach import attach

    first, second = lightning_nvcomp.NvcompModelParallelStrategy(), lightning_nvcomp.NvcompModelParallelStrategy()
    attachment = attach(Accelerator(cpu=True), codec="zstd", probe_mb=4)
    policies = [first.policy, second.policy, attachment.dcp_policy]
    assert all(isinstance(p, CodecPolicy) for p in policies)
    assert len({id(p) for p in [*policies, default_policy("sync")]}) == 4
    attachment.detach()


# -- the table itself ------------------------------------------------------------------------------------------------


def test_the_table_names_mechanisms_that_exist():
    table = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    rows = [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 15
    named = set(re.findall(r"`((?:_process|_moved|_compat|format|auto|saving|integrations)\.[\w.]+)", table))
    for dotted in named:
        module, _, attribute = f"lightning_nvcomp.{dotted}".rpartition(".")
        try:
            found = importlib.import_module(module)
        except ImportError:
            module, _, owner = module.rpartition(".")
            found = getattr(importlib.import_module(module), owner)
        assert hasattr(found, attribute), dotted


def test_the_loaders_modules_and_functions_are_within_the_size_targets():
    """The modules of the load path (split by concern) are at most 400 lines, their functions at most 60."""
    over = []
    for name in ("reader", "decode", "placement", "zip_checks", "load_context", "load_state"):
        source = (PACKAGE / "format" / f"{name}.py").read_text()
        if source.count("\n") > 400:
            over.append(f"{name}.py: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 60:
                over.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert over == []
