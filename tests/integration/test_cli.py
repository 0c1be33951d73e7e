"""The command line: inspect, verify and convert on real checkpoint files (CPU zstd), exit codes, messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lightning_nvcomp
from lightning_nvcomp import format as fileformat
from lightning_nvcomp.cli import main
from lightning_nvcomp.codec import record
from lightning_nvcomp.errors import CodecUnavailableError

from tests.helpers.files import tensor_data_entries
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import CHILD_DIGEST_SRC, child_json, python_child, tensor_digest
from tests.helpers.states import assert_tree_bit_exact, trained_like

#: The tensors of the training state below: 4 of the model, 3 per parameter in AdamW's state.
STATE_TENSORS = 16


@pytest.fixture
def state() -> dict:
    """A small model's state dict and AdamW's state after one step, like a Lightning checkpoint's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).square().mean().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}


@pytest.fixture
def zstd_ckpt(tmp_path: Path, state: dict) -> Path:
    path = tmp_path / "state.ckpt"
    lightning_nvcomp.save(state, path, codec="zstd")
    return path


@pytest.fixture
def big_ckpt(tmp_path: Path) -> Path:
    """One 2 MB tensor of trained-like bf16 weights: most of the file is its compressed blob."""
    path = tmp_path / "big.ckpt"
    lightning_nvcomp.save({"w": trained_like(1 << 20, torch.bfloat16)}, path, codec="zstd")
    return path


def run(capsys: pytest.CaptureFixture, *argv: object) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (exit status, stdout, stderr)."""
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def digests(obj: object, path: str = "") -> dict[str, list]:
    """Every tensor in nested dicts / lists / tuples by dotted path -> its bit-exact digest."""
    if isinstance(obj, torch.Tensor):
        return {path: tensor_digest(obj)}
    if isinstance(obj, dict):
        pairs = obj.items()
    elif isinstance(obj, (list, tuple)):
        pairs = enumerate(obj)
    else:
        return {}
    return {k: v for key, value in pairs for k, v in digests(value, f"{path}.{key}").items()}


def test_inspect_lists_tensors_codecs_and_totals(capsys, zstd_ckpt):
    status, out, err = run(capsys, "inspect", zstd_ckpt)
    assert status == 0 and err == ""
    for name in ["model.0.weight", "model.2.bias", "optimizer.state.0.exp_avg", "optimizer.state.3.step"]:
        assert name in out
    assert "[64, 32]" in out and "zstd 4 planes" in out
    totals = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("float32", "total"))}
    assert totals["float32"][1] == totals["total"][1] == str(STATE_TENSORS)
    assert f"file: {zstd_ckpt}" in out and "nvCOMP" not in out


def test_inspect_plain_torch_save_file(capsys, tmp_path, state):
    path = tmp_path / "plain.pt"
    torch.save(state, path)
    status, out, _ = run(capsys, "inspect", path)
    assert status == 0
    assert "model.0.weight" in out and "torch" in out and "zstd" not in out
    assert any(line.split()[:2] == ["total", str(STATE_TENSORS)] for line in out.splitlines())


def test_inspect_shows_the_largest_tensors_unless_all(capsys, tmp_path):
    path = tmp_path / "many.ckpt"
    lightning_nvcomp.save({f"t{i}": torch.zeros(i + 1) for i in range(45)}, path, codec="zstd")
    _, out, _ = run(capsys, "inspect", path)
    assert "t44 " in out and "t0 " not in out and "5 smaller tensors not shown" in out
    _, out, _ = run(capsys, "inspect", path, "--all")
    assert "t0 " in out and "not shown" not in out


def test_verify_ok(capsys, zstd_ckpt):
    status, out, err = run(capsys, "verify", zstd_ckpt)
    assert status == 0 and err == ""  # no progress bar when stderr is not a terminal
    assert out.startswith(f"OK: {STATE_TENSORS} tensors,") and "checksums and decode verified" in out
    assert fileformat.load_context.active() is None  # the progress bar's setting ended with the command


def test_verify_damaged_blob_exits_1_naming_file_and_tensor(capsys, big_ckpt):
    offset, size = max(tensor_data_entries(big_ckpt).values(), key=lambda entry: entry[1])
    data = bytearray(big_ckpt.read_bytes())
    assert size > len(data) // 2
    middle = offset + size // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    big_ckpt.write_bytes(data)
    status, out, err = run(capsys, "verify", big_ckpt)
    assert status == 1 and out == ""
    assert str(big_ckpt) in err and "'w'" in err


def test_verify_truncated_file_exits_1(capsys, big_ckpt):
    data = big_ckpt.read_bytes()
    big_ckpt.write_bytes(data[: len(data) // 2])
    status, _, err = run(capsys, "verify", big_ckpt)
    assert status == 1 and str(big_ckpt) in err


def test_verify_exits_2_when_a_codec_cannot_run_here(capsys, monkeypatch, zstd_ckpt):
    def no_gpu(*args, **kwargs):
        raise CodecUnavailableError("data compressed with gANS needs a CUDA GPU; lightning-nvcomp convert IN OUT")

    monkeypatch.setattr(record, "decode", no_gpu)
    monkeypatch.setattr(record, "decode_into", no_gpu)
    status, _, err = run(capsys, "verify", zstd_ckpt)
    assert status == 2 and str(zstd_ckpt) in err and "convert" in err


@pytest.mark.parametrize("command", [["inspect"], ["verify"], ["convert", "--codec", "zstd"]])
def test_missing_file_exits_1_naming_it(capsys, tmp_path, command):
    missing = tmp_path / "missing.ckpt"
    extra = [tmp_path / "out.ckpt"] if command[0] == "convert" else []
    status, _, err = run(capsys, *command, missing, *extra)
    assert status == 1 and str(missing) in err and "truncated" not in err
    assert not (tmp_path / "out.ckpt").exists()


def test_convert_zstd_to_torch_loads_with_plain_torch(capsys, tmp_path, zstd_ckpt, state):
    out_path = tmp_path / "plain.pt"
    status, out, _ = run(capsys, "convert", zstd_ckpt, out_path, "--codec", "torch")
    assert status == 0 and out.startswith(f"converted {zstd_ckpt} -> {out_path} (plain torch.save)")
    child = python_child(
        CHILD_DIGEST_SRC
        + """
import json, sys
def digests(obj, path=""):
    if isinstance(obj, torch.Tensor):
        return {path: tensor_digest(obj)}
    pairs = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else []
    return {k: v for key, value in pairs for k, v in digests(value, f"{path}.{key}").items()}
obj = torch.load(sys.argv[1], weights_only=True)
print(json.dumps({"imported": "lightning_nvcomp" in sys.modules, "epoch": obj["epoch"], "tensors": digests(obj)}))
""",
        str(out_path),
        check=True,
    )
    result = child_json(child)
    assert result["imported"] is False and result["epoch"] == 3
    assert result["tensors"] == digests(state) and len(result["tensors"]) == STATE_TENSORS
    assert_tree_bit_exact(state, torch.load(out_path, weights_only=True))


def test_convert_none_to_zstd_is_smaller_and_bit_exact(capsys, tmp_path):
    weights = {"w": trained_like(1 << 19, torch.bfloat16), "b": trained_like(1000, torch.bfloat16, seed=1)}
    src, dst = tmp_path / "plain.pt", tmp_path / "small.ckpt"
    torch.save(weights, src)
    status, out, _ = run(capsys, "convert", src, dst, "--codec", "zstd", "--quiet")
    assert status == 0 and "(zstd)" in out
    assert dst.stat().st_size < 0.8 * src.stat().st_size
    assert_tree_bit_exact(weights, lightning_nvcomp.load(dst))


def test_convert_refuses_to_overwrite_its_input(capsys, tmp_path, zstd_ckpt):
    before = zstd_ckpt.read_bytes()
    link = tmp_path / "link.ckpt"
    link.symlink_to(zstd_ckpt)
    for target in (zstd_ckpt, link):
        status, out, err = run(capsys, "convert", zstd_ckpt, target, "--codec", "none")
        assert status == 1 and out == "" and "same file" in err
    assert zstd_ckpt.read_bytes() == before


def test_unknown_codec_is_a_usage_error(capsys, tmp_path, zstd_ckpt):
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(zstd_ckpt), str(tmp_path / "out.ckpt"), "--codec", "lz4"])
    assert exc.value.code == 2 and "invalid choice: 'lz4'" in capsys.readouterr().err


def test_python_m_runs_the_command_line(zstd_ckpt):
    def python_m(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "lightning_nvcomp", *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=os.environ)

    version = python_m("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"lightning-nvcomp {lightning_nvcomp.__version__}"
    zstd_ckpt.write_bytes(zstd_ckpt.read_bytes()[:-100])
    verify = python_m("verify", str(zstd_ckpt))
    assert verify.returncode == 1 and str(zstd_ckpt) in verify.stderr and "Traceback" not in verify.stderr
