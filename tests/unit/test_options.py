"""One options object at every entry point (issue 33): :class:`SaveOptions` in the units a config writes, taken as
``options=`` and as keyword arguments of the same names by the Lightning plugin, ``attach``, the DCP writer, the
sharded strategies and ``save``; LightningCLI configs in both spellings; the codec a :class:`Codec` wherever a save
reports it, and never in a file; ``load``'s decode bound without a boolean; deprecated spellings that warn.

CPU only: real Trainers and LightningCLI, a real Accelerator, real ``dcp.save``, real files in the working directory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import lightning_nvcomp
from lightning_nvcomp import Codec, DecodeLimitError, DeltaOptions, Durability, RemoteOptions, SaveOptions
from lightning_nvcomp import format as fileformat
from lightning_nvcomp.accelerate import attach
from lightning_nvcomp.dcp import NvcompFileSystemWriter
from lightning_nvcomp.format import DECODE_LIMIT_ENV
from lightning_nvcomp.integrations.lightning.sharded import NvcompFSDPStrategy, NvcompModelParallelStrategy
from lightning_nvcomp.options import MiB

from tests.helpers import accelerate_runs as R
from tests.helpers.lightning_models import TinyData, TinyModule
from tests.helpers.states import assert_state_equal, assert_tree_bit_exact, trained_like, zeros_like_state

_OPTIONS_MODULE = b"lightning_nvcomp.options"


def _state() -> dict[str, Any]:
    return {"w": trained_like(1 << 16, torch.float32, seed=3), "b": trained_like(64, torch.bfloat16, seed=4), "step": 7}


def _codecs(path: str | os.PathLike) -> set[str]:
    """The codecs the records of the single-file checkpoint ``path`` store their planes with (``raw``: as is)."""
    found: set[str] = set()
    stack = [fileformat.describe(path)]
    while stack:
        item = stack.pop()
        if isinstance(item, fileformat.TensorInfo):
            found.update(item.record["codecs"])
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


def _holds_no_enum(path: str | os.PathLike) -> None:
    """Every entry of the zip ``path`` is free of the options module: no Codec was pickled into the file."""
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            assert _OPTIONS_MODULE not in z.read(name), f"{path}: {name} pickles lightning_nvcomp.options"


# -- SaveOptions: the units a config writes, checked when made ------------------------------------------------------


def test_sizes_are_given_in_mib_and_read_in_bytes() -> None:
    options = SaveOptions(staging_mb=64, probe_mb=1 / 16, host_buffer_mb=0.5)
    assert options.staging_nbytes == 64 * MiB
    assert options.probe_nbytes == MiB // 16
    assert options.host_buffer_nbytes == MiB // 2
    assert SaveOptions().host_buffer_nbytes is None  # the default: two checkpoints
    assert SaveOptions().staging_nbytes is None  # the default: the coder's own, per device


@pytest.mark.parametrize("every", [1, 0, 2.5, True, "8"])
def test_a_chain_is_two_saves_or_more(every: object) -> None:
    with pytest.raises(ValueError, match="keyframe_every must be an integer of 2 or more"):
        DeltaOptions(keyframe_every=every)  # type: ignore[arg-type]


def test_choices_are_enums_however_they_are_given() -> None:
    options = SaveOptions(codec="zstd", durable="os")  # type: ignore[arg-type]
    assert options.codec is Codec.ZSTD and options.durable is Durability.OS
    # configs write the values; parsers (jsonargparse) look enum members up by name: both find the member
    assert Codec["zstd"] is Codec["ZSTD"] is Codec.ZSTD and Durability["sync"] is Durability.SYNC
    with pytest.raises(KeyError):
        Codec["lz4"]


@pytest.mark.parametrize(
    ("field", "value", "error", "match"),
    [
        ("codec", "lz4", ValueError, "codec must be one of"),
        ("durable", "never", ValueError, "durable must be one of"),
        ("async_save", "false", TypeError, "async_save must be True or False"),
        ("staging_mb", 0, ValueError, "staging_mb must be a positive number of MiB"),
        ("staging_mb", -1, ValueError, "staging_mb must be a positive number of MiB"),
        ("staging_mb", math.inf, ValueError, "staging_mb must be a positive number of MiB"),
        ("staging_mb", math.nan, ValueError, "staging_mb must be a positive number of MiB"),
        ("staging_mb", True, ValueError, "staging_mb must be a positive number of MiB"),
        ("staging_mb", 0.3, ValueError, "staging_mb must be a multiple of 512 bytes"),
        ("probe_mb", 0, ValueError, "probe_mb must be a positive number of MiB"),
        ("host_buffer_mb", -2, ValueError, "host_buffer_mb must be a positive number of MiB"),
        ("interval_s", 0, ValueError, "interval_s must be a positive number of seconds"),
        ("gpu_hour_usd", -0.5, ValueError, "gpu_hour_usd must be a price in USD"),
        ("remote", {"anon": True}, TypeError, "remote must be a RemoteOptions"),
        ("delta", {"keyframe_every": 4}, TypeError, "delta must be a DeltaOptions"),
    ],
)
def test_every_option_is_checked_when_made(field: str, value: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SaveOptions(**{field: value})


# -- every entry point: options= and the same keywords -------------------------------------------------------------

#: Each entry point: the fields it acts on, and how to make it and read back the options it saves with.
ENTRY_POINTS: dict[str, tuple[tuple[str, ...], Callable[..., SaveOptions]]] = {
    "NvcompCheckpointIO": (
        tuple(f.name for f in dataclasses.fields(SaveOptions)),
        lambda **kw: lightning_nvcomp.NvcompCheckpointIO(**kw).writer.options,
    ),
    "attach": (
        tuple(f.name for f in dataclasses.fields(SaveOptions)),
        lambda **kw: _attached(**kw),
    ),
    "NvcompFileSystemWriter": (
        ("codec", "staging_mb", "remote", "delta"),
        lambda **kw: NvcompFileSystemWriter("ckpt", **kw).options,
    ),
    "NvcompFSDPStrategy": (
        ("codec", "staging_mb", "gpu_hour_usd", "delta"),
        lambda **kw: NvcompFSDPStrategy(**kw).options,
    ),
    "NvcompModelParallelStrategy": (
        ("codec", "staging_mb", "gpu_hour_usd", "delta"),
        lambda **kw: NvcompModelParallelStrategy(**kw).options,
    ),
}

#: A value other than the default for every field.
OTHER = dict(
    codec=Codec.NONE,
    async_save=True,
    staging_mb=2,
    probe_mb=1,
    interval_s=30.0,
    gpu_hour_usd=4.4,
    remote=RemoteOptions(max_parallel=2),
    durable=Durability.OS,
    host_buffer_mb=8,
    delta=DeltaOptions(keyframe_every=4),
)


def _attached(**kw: Any) -> SaveOptions:
    attachment = attach(R.build(seed=1).accelerator, **kw)
    attachment.detach()
    return attachment.writer.options


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_takes_options_and_the_same_keywords(tmp_path, monkeypatch, entry: str) -> None:
    monkeypatch.chdir(tmp_path)
    uses, make = ENTRY_POINTS[entry]
    given = {name: OTHER[name] for name in uses}
    expected = SaveOptions(**given)
    assert make(**given) == expected  # as keywords
    assert make(options=expected) == expected  # as one object
    # a keyword beside options= overrides that field only
    assert make(options=expected, codec="zstd") == dataclasses.replace(expected, codec=Codec.ZSTD)


@pytest.mark.parametrize("entry", [e for e, (uses, _) in ENTRY_POINTS.items() if "async_save" not in uses])
def test_an_option_an_entry_point_does_not_use_is_refused(tmp_path, monkeypatch, entry: str) -> None:
    """The DCP writer and the sharded strategies save synchronously: ``async_save`` would be ignored, so it is
    refused, naming it, before anything is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"{entry} does not use async_save"):
        ENTRY_POINTS[entry][1](options=SaveOptions(codec="zstd", async_save=True))
    assert os.listdir(tmp_path) == []


# -- real saves through each entry point, with options= ----------------------------------------------------------


def test_save_takes_options_and_its_keywords(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = _state()
    stats = lightning_nvcomp.save(state, "a.ckpt", options=SaveOptions(codec="zstd", staging_mb=1 / 8))
    stats_kw = lightning_nvcomp.save(state, "b.ckpt", "zstd", staging_mb=1 / 8)
    for path in ("a.ckpt", "b.ckpt"):
        assert "zstd" in _codecs(path)
        assert fileformat.describe(path)["w"].record["segment"] == MiB // 8  # coded in pieces of staging_mb
        assert_tree_bit_exact(lightning_nvcomp.load(path), state)
    assert stats.codec is stats_kw.codec is Codec.ZSTD


def test_every_entry_point_codes_in_the_pieces_save_does_by_default(tmp_path, monkeypatch) -> None:
    """One default everywhere: the plugin (and attach, the DCP writer: the same options) codes in the pieces
    ``save`` does, the coder's own per device, where it used to code 256 MiB pieces on the CPU too."""
    monkeypatch.chdir(tmp_path)
    state = _state()
    lightning_nvcomp.save(state, "save.ckpt", "zstd")
    io = lightning_nvcomp.NvcompCheckpointIO(codec="zstd", probe_mb=1)
    try:
        io.save_checkpoint(state, "plugin.ckpt")
    finally:
        io.teardown()
    segment = fileformat.describe("save.ckpt")["w"].record["segment"]
    assert fileformat.describe("plugin.ckpt")["w"].record["segment"] == segment
    assert NvcompFileSystemWriter("ckpt").staging_nbytes is None


def test_save_refuses_what_it_does_not_do_and_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="save does not use async_save"):
        lightning_nvcomp.save(_state(), "a.ckpt", options=SaveOptions(async_save=True))
    with pytest.raises(ValueError, match="staging_mb must be a positive number of MiB"):
        lightning_nvcomp.save(_state(), "a.ckpt", staging_mb=0)
    assert os.listdir(tmp_path) == []


def test_the_plugin_refuses_a_staging_size_the_coder_cannot_use(tmp_path, monkeypatch) -> None:
    """0.3 MiB is not a whole number of bytes, let alone of 512-byte blocks: refused when the plugin is made, not at
    the first checkpoint."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="multiple of 512 bytes"):
        lightning_nvcomp.NvcompCheckpointIO(staging_mb=0.3)
    assert os.listdir(tmp_path) == []


def test_attach_saves_with_options(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = R.build(seed=2, project_dir="run")
    R.train(run, 2)
    attachment = attach(run.accelerator, options=SaveOptions(codec="zstd", probe_mb=1))
    try:
        run.accelerator.save_state("ck")
    finally:
        attachment.detach()
    assert "zstd" in _codecs(Path("ck") / "optimizer.bin")
    assert "zstd" in _codecs(Path("ck") / "pytorch_model.bin")


def test_the_dcp_writer_saves_with_options(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = {"w": trained_like(1 << 16, torch.float32, seed=5)}
    writer = NvcompFileSystemWriter("ckpt", options=SaveOptions(codec="zstd", staging_mb=1))
    dcp.save(state, storage_writer=writer)
    assert writer.stats is not None and writer.stats.codec is Codec.ZSTD
    loaded = zeros_like_state(state)
    dcp.load(loaded, checkpoint_id="ckpt")
    assert_state_equal(loaded, state)
    for entry in os.listdir("ckpt"):  # the enum never reaches a file: .metadata and the data files name codecs
        assert _OPTIONS_MODULE not in (Path("ckpt") / entry).read_bytes()


# -- LightningCLI: init_args as keywords, as options, or both -----------------------------------------------------

_CONFIG = """\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: 1
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  limit_val_batches: 0
  plugins:
    - class_path: lightning_nvcomp.NvcompCheckpointIO
      init_args:
{init_args}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        dirpath: ckpts
        save_top_k: -1
model:
  hidden: 12
"""


def _cli(config: str, tmp_path: Path) -> Any:
    from lightning.pytorch.cli import LightningCLI

    path = tmp_path / "config.yaml"
    path.write_text(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jsonargparse's and Lightning's own notices
        return LightningCLI(TinyModule, TinyData, run=False, args=["--config", str(path)], save_config_callback=None)


@pytest.mark.parametrize(
    "init_args",
    [
        {"codec": "zstd", "async_save": True, "probe_mb": 1},
        {"options": {"codec": "zstd", "async_save": True, "probe_mb": 1}},
        {"options": {"codec": "none", "probe_mb": 1}, "codec": "zstd", "async_save": True},
    ],
    ids=["keywords", "options", "options-and-keywords"],
)
def test_a_lightning_cli_config_gives_the_plugin_its_options(tmp_path, monkeypatch, init_args: dict) -> None:
    import yaml

    monkeypatch.chdir(tmp_path)
    block = textwrap.indent(yaml.safe_dump(init_args, default_flow_style=False), " " * 8)
    cli = _cli(_CONFIG.format(init_args=block.rstrip()), tmp_path)
    io = cli.trainer.strategy.checkpoint_io
    assert io.writer.options == SaveOptions(codec="zstd", async_save=True, probe_mb=1)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    (saved,) = os.listdir("ckpts")
    assert "zstd" in _codecs(Path("ckpts") / saved)
    _holds_no_enum(Path("ckpts") / saved)


@pytest.mark.parametrize("strategy", ["NvcompFSDPStrategy", "NvcompModelParallelStrategy"])
def test_a_lightning_cli_config_gives_a_sharded_strategy_its_options(tmp_path, monkeypatch, strategy: str) -> None:
    monkeypatch.chdir(tmp_path)
    config = _CONFIG.format(init_args="        codec: zstd").replace(
        "  plugins:",
        f"  strategy:\n    class_path: lightning_nvcomp.{strategy}\n    init_args:\n"
        "      options: {codec: zstd, staging_mb: 8}\n      gpu_hour_usd: 2.5\n  plugins:",
    )
    cli = _cli(config, tmp_path)
    assert type(cli.trainer.strategy).__name__ == strategy
    assert cli.trainer.strategy.options == SaveOptions(codec="zstd", staging_mb=8, gpu_hour_usd=2.5)


# -- deprecated spellings ------------------------------------------------------------------------------------------


def test_the_dcp_writers_staging_nbytes_warns_and_still_works(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = {"w": trained_like(1 << 14, torch.float32, seed=6)}
    with pytest.warns(DeprecationWarning, match=r"staging_nbytes=\.\.\.\) is deprecated.*staging_mb=0\.5"):
        writer = NvcompFileSystemWriter("ckpt", codec="zstd", staging_nbytes=MiB // 2)
    assert writer.staging_nbytes == MiB // 2 and writer.options.staging_mb == 0.5
    dcp.save(state, storage_writer=writer)
    loaded = zeros_like_state(state)
    dcp.load(loaded, checkpoint_id="ckpt")
    assert_state_equal(loaded, state)
    with pytest.raises(ValueError, match="give staging_mb only"):
        NvcompFileSystemWriter("other", staging_nbytes=MiB, staging_mb=1)


def test_saves_staging_nbytes_warns_and_still_works(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = _state()
    with pytest.warns(DeprecationWarning, match=r"save\(staging_nbytes=\.\.\.\) is deprecated") as caught:
        lightning_nvcomp.save(state, "a.ckpt", "zstd", staging_nbytes=MiB // 8)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert fileformat.describe("a.ckpt")["w"].record["segment"] == MiB // 8
    assert_tree_bit_exact(lightning_nvcomp.load("a.ckpt"), state)


# -- the codec is a Codec wherever a save reports it, and never in a file -----------------------------------------


def test_auto_reports_its_choice_as_codecs_and_writes_none_of_them(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = _state()
    stats = lightning_nvcomp.save(state, "auto.ckpt")  # codec: the default, auto
    assert isinstance(stats.codec, Codec) and stats.prediction is not None
    assert stats.prediction.codec is stats.codec
    assert stats.prediction.alternatives and all(isinstance(p.codec, Codec) for p in stats.prediction.alternatives)
    _holds_no_enum("auto.ckpt")
    assert_tree_bit_exact(torch.load("auto.ckpt", weights_only=True), state)


# -- load's decode bound: None is the default, math.inf none, nothing boolean --------------------------------------


@pytest.fixture
def small_file(tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    lightning_nvcomp.save({"w": trained_like(1 << 14, torch.float32, seed=8)}, "small.ckpt", "zstd")
    return "small.ckpt"


def test_none_is_the_default_bound_which_the_environment_sets(small_file, monkeypatch) -> None:
    monkeypatch.setenv(DECODE_LIMIT_ENV, "1000")
    with pytest.raises(DecodeLimitError, match="math.inf for no bound"):
        lightning_nvcomp.load(small_file, max_decoded_nbytes=None)
    assert lightning_nvcomp.load(small_file, max_decoded_nbytes=math.inf)["w"].numel() == 1 << 14


@pytest.mark.parametrize("bound", [-1, True, "unlimited"])
def test_a_bound_that_is_no_number_of_bytes_is_refused(small_file, bound: object) -> None:
    with pytest.raises(ValueError, match="max_decoded_nbytes must be a number of bytes"):
        lightning_nvcomp.load(small_file, max_decoded_nbytes=bound)  # type: ignore[arg-type]


def test_the_old_default_spelling_warns(small_file) -> None:
    with pytest.warns(DeprecationWarning, match=r"max_decoded_nbytes=False\) is deprecated"):
        loaded = lightning_nvcomp.load(small_file, max_decoded_nbytes=False)
    assert loaded["w"].numel() == 1 << 14


def test_save_options_of_warns_and_makes_the_same_options() -> None:
    with pytest.warns(DeprecationWarning, match=r"SaveOptions\.of\(\.\.\.\) is deprecated") as caught:
        made = SaveOptions.of(codec="zstd", staging_mb=64, durable="sync")
    assert caught[0].filename == __file__
    assert made == SaveOptions(codec="zstd", staging_mb=64, durable="sync")
