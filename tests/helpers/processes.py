"""Child processes of the tests: a fresh interpreter of this venv, ``torch.distributed.run`` launches, and what a child
reports back (a JSON line, tensor digests the parent compares bit-exactly).

Children run in this checkout (:data:`~tests.helpers.paths.REPO_ROOT`), where ``lightning_nvcomp`` and the
``tests`` package are importable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import torch

from tests.helpers.paths import REPO_ROOT
from tests.helpers.states import tensor_bytes


def python_child(
    code: str, *args: str, timeout: float = 120, env: dict | None = None, check: bool = False, **kwargs
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this venv (``sys.executable``); ``args`` become ``sys.argv[1:]``."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=str(REPO_ROOT),
        **kwargs,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def child_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object a child printed as its last stdout line."""
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"child printed nothing (rc {proc.returncode}):\n{proc.stderr}"
    return json.loads(lines[-1])


def tensor_digest(t: torch.Tensor) -> list:
    """What a child process can report about a tensor so the parent can compare it bit-exactly."""
    import hashlib

    return [str(t.dtype), list(t.shape), list(t.stride()), hashlib.sha256(tensor_bytes(t.detach()).numpy()).hexdigest()]


#: Source of ``tensor_digest`` / ``tensor_bytes`` for child processes (they must not import the tests package).
CHILD_DIGEST_SRC = """
import hashlib, torch
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
def tensor_digest(t):
    t = t.detach()
    r = torch.view_as_real(t) if t.is_complex() else t
    ints = r.view(_BITS[r.dtype.itemsize])
    data = torch.empty(ints.numel(), dtype=ints.dtype).copy_(ints.reshape(-1)).view(torch.uint8)
    return [str(t.dtype), list(t.shape), list(t.stride()), hashlib.sha256(data.numpy()).hexdigest()]
"""


def torchrun(
    nproc: int, script: Path, args: list[str], env: Mapping[str, str], timeout_s: float, label: str
) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone`` of ``script`` on ``nproc`` ranks (see :func:`run_killable`),
    with ``env`` less any launcher variables of an outer run."""
    child_env = dict(env)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        child_env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(script)]
    return run_killable([*cmd, *args], child_env, REPO_ROOT, timeout_s, label)


def run_killable(
    cmd: list[str], env: Mapping[str, str], cwd: Path, timeout_s: float, label: str
) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own; after ``timeout_s`` kill it with every process it started (a launcher and
    its ranks) and raise an AssertionError naming ``label``, with the output so far."""
    proc = subprocess.Popen(
        cmd,
        cwd=str(cwd),
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{label} run hung:\n{stdout[-3000:]}\n{stderr[-12000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
