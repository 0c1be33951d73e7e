"""The command line reads everything the package writes, and tells the machine's limits from damage.

``inspect`` and ``verify`` of DCP checkpoint directories (real ``dcp.save`` through ``NvcompFileSystemWriter``, on
one process and on two gloo ranks), of a DCP data file given alone, of Accelerate ``save_state`` directories (a real
``Accelerator`` with ``attach``); exit statuses under real thread (``RLIMIT_NPROC``) and memory (``RLIMIT_AS``)
limits, set on a child running the command line; the GPU / nvCOMP messages; ``bench --dir`` of a file; ``env``.
Every command runs as users type it: bare names in the working directory.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import inspect
import os
import re
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import lightning_nvcomp
from lightning_nvcomp.cli import main
from lightning_nvcomp.codec.gpu import GpuSupport, gpu_support, nvcomp_module
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter
from lightning_nvcomp.errors import CodecUnavailableError
from lightning_nvcomp.integrations.accelerate.attach import attach
from lightning_nvcomp.options import SaveOptions

from tests.helpers import accelerate_runs as R
from tests.helpers import dcp_workers
from tests.helpers.files import tensor_data_entries
from tests.helpers.paths import FIXTURES, REPO_ROOT
from tests.helpers.states import trained_like

# dcp.save takes no_dist= from torch 2.7; torch 2.4-2.6 infer it (no process group: one process)
NO_DIST = {"no_dist": True} if "no_dist" in inspect.signature(dcp.save).parameters else {}
#: The files ``save_state`` writes for one model, optimizer, scheduler and registered object on one process.
ACCELERATE_FILES = [
    "custom_checkpoint_0.pkl",
    "optimizer.bin",
    "pytorch_model.bin",
    "random_states_0.pkl",
    "scheduler.bin",
]


def run(capsys: pytest.CaptureFixture, *argv: object) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (exit status, stdout, stderr)."""
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def flip(path: Path, offset: int, count: int = 16) -> None:
    """Invert ``count`` bytes of ``path`` from ``offset`` on."""
    data = bytearray(path.read_bytes())
    data[offset : offset + count] = bytes(b ^ 0xFF for b in data[offset : offset + count])
    path.write_bytes(bytes(data))


def training_state(seed: int = 0) -> dict:
    """A small model's state dict and AdamW's state after one step, and plain values, as a DCP save holds them."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).square().mean().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 7, "w16": torch.randn(300).bfloat16()}


def not_called_damaged(message: str) -> bool:
    """Whether ``message`` says "damaged" only to say nothing shows it."""
    return "damaged" not in re.sub(r"nothing shows (the file|it) is damaged", "", message)


def dcp_save(path: str, state: dict | None = None) -> None:
    """``dcp.save`` on this one process through our writer, as a sharded Lightning or Accelerate save does."""
    dcp.save(state or training_state(), storage_writer=NvcompFileSystemWriter(path, codec="zstd"), **NO_DIST)


def storage_data(path: str) -> dict:
    """The checkpoint's items (``.metadata``'s storage records), read by the package's reader."""
    return NvcompFileSystemReader(path).read_metadata().storage_data


def data_file(path: str) -> str:
    """The name of the one data file of a checkpoint saved on one process."""
    (name,) = {info.relative_path for info in storage_data(path).values()}
    return name


# ---------------------------------------------------------------------------------------------------------------
# DCP checkpoint directories
# ---------------------------------------------------------------------------------------------------------------


def test_verify_and_inspect_a_dcp_checkpoint_directory(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dcp_save("ck")
    items = storage_data("ck")
    status, out, err = run(capsys, "verify", "ck", "-q")
    assert (status, err) == (0, ""), err
    assert out.startswith(f"OK: ck: DCP checkpoint, {len(items)} items in 1 data file (rank 0)"), out
    assert "every item decoded and checked" in out

    status, out, err = run(capsys, "inspect", "ck", "--all")
    assert (status, err) == (0, ""), err
    listed = {line.split()[0] for line in out.splitlines() if line and not line.startswith(("item", "rank"))}
    assert {index.fqn for index in items} <= listed
    weight = next(line for line in out.splitlines() if line.startswith("model.0.weight "))
    assert weight.split()[1:6] == ["float32", "[256,", "64]", "0", data_file("ck")] and "zstd" in weight
    info = items[next(i for i in items if i.fqn == "model.0.weight")]
    assert weight.split()[-1] == f"{info.raw_nbytes / info.length:.2f}"  # the item's ratio, from its record
    ranks = [line.split() for line in out.splitlines() if re.match(r"(\d+|total)\s", line)]
    assert [row[0] for row in ranks] == ["0", "total"] and ranks[0][2] == str(len(items))


@pytest.mark.slow
def test_a_two_rank_dcp_checkpoint_per_rank(capsys, tmp_path, monkeypatch):
    """Two gloo ranks save DTensor shards and plain values (``dcp_workers``' ``save`` job); inspect shows each rank's
    items, codecs and ratio, verify checks both ranks' data files."""
    results = dcp_workers.spawn("save", 2, tmp_path, str(tmp_path / "ck"))
    assert all(r.get("save") == "ok" for r in results), results
    monkeypatch.chdir(tmp_path)
    items = storage_data("ck")
    status, out, err = run(capsys, "inspect", "ck", "--all")
    assert (status, err) == (0, ""), err
    ranks = {
        row[0]: row for row in (line.split() for line in out.splitlines()) if row and row[0] in ("0", "1", "total")
    }
    files = {i.relative_path for i in items.values()}
    for rank in ("0", "1"):
        mine = [i for i in items.values() if i.relative_path.startswith(f"__{rank}_")]
        assert ranks[rank][2] == str(len(mine)) and "zstd" in ranks[rank][3:]
    assert ranks["total"][1:3] == [str(len(files)), str(len(items))]
    status, out, err = run(capsys, "verify", "ck", "-q")
    assert (status, err) == (0, ""), err
    assert f"{len(items)} items in {len(files)} data files (ranks 0, 1)" in out


def test_a_dcp_data_file_given_alone_is_verified_against_its_metadata(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dcp_save("ck")
    items, name = storage_data("ck"), data_file("ck")
    status, out, err = run(capsys, "verify", f"ck/{name}", "-q")
    assert (status, err) == (0, ""), err
    assert out.startswith(f"OK: ck/{name}: data file of the DCP checkpoint") and f"{len(items)} items" in out
    status, out, err = run(capsys, "inspect", f"ck/{name}")
    assert (status, err) == (0, ""), err
    assert f"data file {name} of the DCP checkpoint" in out and "model.0.weight" in out


def test_a_dcp_data_file_that_cannot_be_read_alone_is_never_called_damaged(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dcp_save("ck")
    name = data_file("ck")
    os.mkdir("copy")
    Path("copy", name).write_bytes(Path("ck", name).read_bytes())  # without its .metadata
    Path("ck/__5_0.distcp").write_bytes(Path("ck", name).read_bytes())  # named by no .metadata
    for command in ("verify", "inspect"):
        status, out, err = run(capsys, command, f"copy/{name}")
        assert (status, out) == (2, ""), err
        assert f"copy/{name}" in err and "has none" in err and not_called_damaged(err)
        status, out, err = run(capsys, command, "ck/__5_0.distcp")
        assert (status, out) == (2, ""), err
        assert "__5_0.distcp is not one of the data files" in err and "Give the checkpoint instead" in err
        assert not_called_damaged(err)
    status, _, err = run(capsys, "verify", "copy", "-q")  # a directory holding only that data file: no checkpoint
    assert status == 1 and "holds no checkpoint" in err and f"{name}: a DCP data file with no .metadata" in err


def test_a_damaged_dcp_item_exits_1_naming_the_file_and_the_item(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dcp_save("ck")
    index, info = max(storage_data("ck").items(), key=lambda pair: pair[1].length)
    flip(Path("ck", info.relative_path), info.offset + info.length // 2)
    for target in ("ck", f"ck/{info.relative_path}"):
        status, out, err = run(capsys, "verify", target, "-q")
        assert (status, out) == (1, ""), err
        assert f"ck: {info.relative_path}: item {index.fqn!r}" in err and "damaged" in err
    status, _, err = run(capsys, "inspect", "ck")  # reads the metadata only: the damage is not its business
    assert (status, err) == (0, "")


@pytest.mark.parametrize("fixture", ["v0.1/dcp_zstd", "v0.1/dcp_none", "v0.2-dev/dcp_zstd", "v0.2-dev/dcp_none"])
def test_dcp_checkpoints_of_earlier_versions_verify(capsys, fixture):
    status, out, err = run(capsys, "verify", FIXTURES / fixture, "-q")
    assert (status, err) == (0, ""), err
    assert "every item decoded and checked" in out


# ---------------------------------------------------------------------------------------------------------------
# Accelerate save_state directories
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def accelerate_dir(tmp_path, monkeypatch) -> Path:
    """``save_state("ck")`` of a real Accelerator with our hook attached, in the working directory ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    run_ = R.build(seed=4)
    R.train(run_, 2)
    attachment = attach(run_.accelerator, codec="zstd", probe_mb=4)
    run_.accelerator.save_state("ck")
    attachment.detach()
    assert sorted(os.listdir("ck")) == ACCELERATE_FILES
    return Path("ck")


def test_an_accelerate_checkpoint_directory_is_verified_file_by_file(capsys, accelerate_dir):
    Path("ck/notes.txt").write_text("run notes")
    dcp_save("ck/pytorch_model_fsdp_0")  # where Accelerate's FSDP save_state puts a sharded model
    status, out, err = run(capsys, "verify", "ck", "-q")
    assert (status, err) == (0, ""), err
    lines = {line.split()[1].rstrip(":"): line for line in out.splitlines()[:-1]}
    for name in ["custom_checkpoint_0.pkl", "optimizer.bin", "pytorch_model.bin", "scheduler.bin"]:
        assert lines[name].startswith("OK "), lines[name]
    assert "checksums and decode verified" in lines["optimizer.bin"]
    rng = lines["random_states_0.pkl"]  # Accelerate's own torch.save of numpy RNG states
    assert rng.startswith("OK ") and "zip checksums verified; not loaded" in rng and "numpy" in rng
    assert lines["pytorch_model_fsdp_0/"].startswith("OK ") and "DCP checkpoint" in lines["pytorch_model_fsdp_0/"]
    assert lines["notes.txt"].startswith("skipped ") and "not a torch checkpoint" in lines["notes.txt"]
    assert out.splitlines()[-1] == "OK: ck: 6 checkpoints verified"

    status, out, err = run(capsys, "inspect", "ck")
    assert (status, err) == (0, ""), err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line}
    assert rows["optimizer.bin"][1] == "lightning-nvcomp" and "zstd" in rows["optimizer.bin"]
    assert rows["pytorch_model_fsdp_0/"][1:3] == ["DCP,", "1"]
    assert "random_states_0.pkl: not read: it holds numpy" in out and "not a checkpoint: notes.txt" in out


@pytest.mark.parametrize("damaged", ["optimizer.bin", "random_states_0.pkl"])
def test_damage_in_one_file_of_an_accelerate_directory_exits_1_naming_it(capsys, accelerate_dir, damaged):
    offset, size = max(tensor_data_entries(accelerate_dir / damaged).values(), key=lambda entry: entry[1])
    flip(accelerate_dir / damaged, offset + size // 2)
    status, out, err = run(capsys, "verify", "ck", "-q")
    assert status == 1, (out, err)
    line = next(line for line in out.splitlines() if f" {damaged}:" in line)
    assert line.startswith("DAMAGED ") and f"ck/{damaged}" in line, line
    assert sum(line.startswith("OK ") for line in out.splitlines()) == len(ACCELERATE_FILES) - 1
    assert err.strip().endswith(f"ck: not every checkpoint in it is intact: {damaged}")


def test_a_directory_without_checkpoints_exits_1(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("empty")
    for command in ("verify", "inspect"):
        status, out, err = run(capsys, command, "empty")
        assert (status, out) == (1, "") and "empty is a directory that holds no checkpoint (it is empty)" in err


# ---------------------------------------------------------------------------------------------------------------
# the machine's limits: real RLIMIT_NPROC and RLIMIT_AS on a child running the command line
# ---------------------------------------------------------------------------------------------------------------

#: The child's thread counts, the same on every machine: torch's OpenMP team, the CPU coder's and CRC's pools.
CHILD_THREADS = {"OMP_NUM_THREADS": "2", "LIGHTNING_NVCOMP_THREADS": "2"}
PR_CAPBSET_DROP, CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 24, 21, 24


def cli_child(args: list[str], cwd: Path, preexec=None) -> subprocess.CompletedProcess:
    """``python -m lightning_nvcomp ARGS`` in ``cwd``, this checkout's package first on the path."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1", **CHILD_THREADS)
    return subprocess.run(
        [sys.executable, "-m", "lightning_nvcomp", *args],
        cwd=cwd,
        env=env,
        preexec_fn=preexec,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _unused_uid() -> int:
    """A user id no process on this machine runs as."""
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        used.add(int(re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1)))
    return next(uid for uid in range(50000, 60000) if uid not in used)


def thread_limit(threads: int):
    """A ``preexec_fn`` that lets the child start at most ``threads`` threads (``RLIMIT_NPROC`` counts a user's
    processes and threads). Root is exempt from that limit, so as root the child runs under a real user id of its
    own (its effective id stays 0: it reads the files) without the capabilities that lift the limit."""
    uid = _unused_uid() if os.geteuid() == 0 else None

    def limit() -> None:
        count = 0  # as another user, the processes and threads of that user are unknown: no thread at all
        if uid is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            for capability in (CAP_SYS_ADMIN, CAP_SYS_RESOURCE):
                if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0):
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
            os.setresuid(uid, 0, 0)
            count = 1 + threads  # the child itself and its threads
        resource.setrlimit(resource.RLIMIT_NPROC, (count, count))

    return limit


def assert_machine_limit(proc: subprocess.CompletedProcess, name: str) -> None:
    """The child exited 2 with a message that names the file and says the machine, not the file, is at fault."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    message = proc.stderr.splitlines()[-1]
    assert message.startswith(f"lightning-nvcomp: error: {name}: "), message
    assert "a limit of the machine, not damage to the file" in message and not_called_damaged(message), message


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(resource, "RLIMIT_NPROC") or not Path("/proc").is_dir(), reason="needs Linux")
def test_verify_under_a_thread_limit_exits_2_never_1(tmp_path):
    """For every number of threads the child may start, from none up to what verify needs: 2 naming threads, or 0.
    (OpenMP that cannot start a thread used to end the process with status 1, "damaged".)"""
    lightning_nvcomp.save({"w": trained_like(4 << 20, torch.float32), "b": torch.randn(64)}, tmp_path / "ck.pt", "zstd")
    assert cli_child(["verify", "ck.pt"], tmp_path).returncode == 0
    failed = []
    budgets = range(64) if os.geteuid() == 0 else [0]
    for threads in budgets:
        try:
            proc = cli_child(["verify", "ck.pt"], tmp_path, thread_limit(threads))
        except subprocess.SubprocessError as err:  # the preexec_fn failed: this machine forbids it
            pytest.skip(f"cannot limit a child's threads here: {err}")
        if proc.returncode == 0:
            break
        failed.append(proc)
    assert failed, "verify needed no thread"
    assert [p.returncode for p in failed] == [2] * len(failed), [p.stderr[-500:] for p in failed]
    for proc in failed:
        assert_machine_limit(proc, "ck.pt")
        assert "cannot start another thread" in proc.stderr.splitlines()[-1]
    dcp_save(str(tmp_path / "dcp"))  # and a DCP checkpoint, whose reader starts threads of its own
    proc = cli_child(["verify", "dcp"], tmp_path, thread_limit(0))
    assert proc.returncode == 2 and not_called_damaged(proc.stderr), proc.stderr[-3000:]
    assert f"dcp/{data_file(str(tmp_path / 'dcp'))}: this process cannot start another thread" in proc.stderr


def _vm_peak(proc: subprocess.CompletedProcess) -> int:
    """The peak address-space size (bytes) a child wrapped by :data:`PEAK` printed last on stderr."""
    return int(re.findall(r"VmPeak:\s+(\d+) kB", proc.stderr)[-1]) << 10


#: Runs the command line (``sys.argv[1:]``) and prints its peak address-space size on the way out.
PEAK = """
import atexit, runpy, sys
atexit.register(lambda: print(open("/proc/self/status").read(), file=sys.stderr))
sys.argv[0] = "lightning-nvcomp"
runpy.run_module("lightning_nvcomp", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to size the limits")
@pytest.mark.parametrize("kind", ["zstd", "legacy torch.save"])
def test_verify_under_a_memory_limit_exits_2_never_1(tmp_path, kind):
    """Address-space limits from the command line's start-up size to what verify of a 96 MB state needs: every
    one exits 2, naming the file and the machine's memory or threads, or 0 (a legacy torch file that ran out of
    memory used to be called damaged)."""
    state = {"w": trained_like(24 << 20, torch.float32)}
    if kind == "zstd":
        lightning_nvcomp.save(state, tmp_path / "ck.pt", "zstd")
    else:
        torch.save(state, tmp_path / "ck.pt", _use_new_zipfile_serialization=False)
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, **CHILD_THREADS)
    measured = [
        subprocess.run([sys.executable, "-c", PEAK, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        for args in (["--version"], ["verify", "ck.pt", "-q"])
    ]
    assert [p.returncode for p in measured] == [0, 0], [p.stderr[-2000:] for p in measured]
    start, peak = (_vm_peak(p) for p in measured)
    assert peak > start + (64 << 20), (start, peak)  # the decode needs memory of its own
    limits = [start + int((peak - start) * fraction) for fraction in (0.1, 0.3, 0.5, 0.7, 0.9)]
    runs = [
        cli_child(["verify", "ck.pt", "-q"], tmp_path, lambda n=limit: resource.setrlimit(resource.RLIMIT_AS, (n, n)))
        for limit in limits
    ]
    assert all(p.returncode in (0, 2) for p in runs), [(p.returncode, p.stderr[-500:]) for p in runs]
    failed = [p for p in runs if p.returncode]
    for proc in failed:
        assert_machine_limit(proc, "ck.pt")
    assert any("out of memory" in p.stderr for p in failed), [p.stderr[-500:] for p in failed]


# ---------------------------------------------------------------------------------------------------------------
# which of the GPU and nvCOMP is missing, and the install line that fits torch
# ---------------------------------------------------------------------------------------------------------------


def expected_install(torch_cuda: str | None) -> list[str]:
    """What the install advice must name for torch built for ``torch_cuda``: the one extra that fits it."""
    if torch_cuda is None:
        return [
            "install a CUDA build of torch",
            '"lightning-nvcomp[cu12]" (CUDA 12)',
            '"lightning-nvcomp[cu13]" (CUDA 13)',
        ]
    major = torch_cuda.split(".")[0]
    if major in ("12", "13"):
        return [f'pip install "lightning-nvcomp[cu{major}]" (nvidia-nvcomp-cu{major}, for torch\'s CUDA {torch_cuda})']
    return ["install a torch built for CUDA 12 or 13"]


@pytest.mark.parametrize(
    ("torch_cuda", "cuda", "nvcomp", "missing"),
    [
        ("12.8", False, "6.0.0", ["sees no CUDA GPU", "nvCOMP 6.0.0 is installed"]),  # nvCOMP, no GPU
        ("13.0", True, None, ["there is a CUDA GPU but nvCOMP is not installed"]),  # GPU, no nvCOMP
        ("12.4", False, None, ["sees no CUDA GPU", "and nvCOMP is not installed"]),  # neither
        (None, False, None, ["there is no CUDA GPU (torch 2.9.0 is a CPU-only build) and nvCOMP is not installed"]),
        (None, False, "6.0.0", ["there is no CUDA GPU (torch 2.9.0 is a CPU-only build); nvCOMP 6.0.0 is installed"]),
        ("11.8", True, None, ["there is a CUDA GPU but nvCOMP is not installed"]),  # no nvCOMP wheel for CUDA 11
    ],
)
def test_the_message_says_which_of_gpu_and_nvcomp_is_missing_and_what_to_install(torch_cuda, cuda, nvcomp, missing):
    found = GpuSupport("2.9.0", torch_cuda, cuda, nvcomp).missing()
    assert found is not None and all(part in found for part in missing), found
    if nvcomp is None or torch_cuda is None:  # something to install: the line that fits this torch
        assert all(part in found for part in expected_install(torch_cuda)), found
        other = {"12": "13", "13": "12"}.get((torch_cuda or "").split(".")[0])
        assert other is None or f"cu{other}" not in found, found
    assert GpuSupport("2.9.0", "12.8", True, "6.0.0").missing() is None


def test_gans_errors_here_say_what_this_machine_lacks(capsys, tmp_path, monkeypatch):
    """On this machine, whatever it lacks: the options check, the decoder and the command line say which of the
    GPU and nvCOMP is missing, and the install line that fits the installed torch."""
    loads = nvcomp_module() is not None
    installed = any(list(importlib.metadata.distributions(name=f"nvidia-nvcomp-cu{major}")) for major in (12, 13))
    if torch.cuda.is_available() and loads:
        pytest.skip("gANS runs here")
    expected = []
    if not torch.cuda.is_available():
        expected.append("there is no CUDA GPU" if torch.version.cuda is None else "sees no CUDA GPU")
    if not loads:
        expected.append("nvCOMP is installed but fails" if installed else "nvCOMP is not installed")
        expected += expected_install(torch.version.cuda)
    with pytest.raises(CodecUnavailableError) as raised:
        SaveOptions(codec="ans")
    monkeypatch.chdir(tmp_path)
    Path("ans.pt").write_bytes((FIXTURES / "v0.1" / "ans.pt").read_bytes())  # gANS records, written on a GPU
    with pytest.raises(CodecUnavailableError) as decoding:
        lightning_nvcomp.load("ans.pt")
    status, out, err = run(capsys, "verify", "ans.pt", "-q")
    assert (status, out) == (2, "") and err.startswith("lightning-nvcomp: error: ans.pt: ")
    for message in (str(raised.value), str(decoding.value), err):
        assert all(part in message for part in expected), (message, expected)


# ---------------------------------------------------------------------------------------------------------------
# bench --dir, env
# ---------------------------------------------------------------------------------------------------------------


def test_bench_dir_of_a_file_is_a_bad_argument_naming_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a-file").write_text("not a directory")
    status, out, err = run(capsys, "bench", "--dir", "a-file", "--no-measure", "--rounds", "1")
    assert (status, out) == (2, "")
    assert "bench --dir a-file: not a directory" in err and "does not exist" not in err
    assert Path("a-file").read_text() == "not a directory"


def test_env_reports_the_environment_and_the_install_line_that_fits(capsys):
    status, out, err = run(capsys, "env")
    assert (status, err) == (0, ""), err
    rows = dict(cells for line in out.splitlines() if len(cells := re.split(r"\s{2,}", line, maxsplit=1)) == 2)
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    assert rows["torch"] == f"{torch.__version__} ({build})"
    assert rows["zstandard"] == importlib.metadata.version("zstandard")
    for name in ("lightning", "accelerate"):
        assert rows[name] == importlib.metadata.version(name)
    assert rows["CUDA GPU"].startswith(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
    support = gpu_support()
    assert rows["nvCOMP"].startswith(support.nvcomp_version or "not installed")
    install = next(line for line in out.splitlines() if line.startswith("install: "))
    if support.nvcomp_version is None or torch.version.cuda is None:
        assert all(part in install for part in expected_install(torch.version.cuda)), install
    codecs = next(line for line in out.splitlines() if line.startswith("codecs here: "))
    assert ("ans and zstd on the GPU" in codecs) == (support.missing() is None)


@pytest.mark.parametrize("kind", ["nested", "quantized per tensor", "quantized per channel"])
def test_inspect_and_verify_read_tensors_rebuilt_from_other_tensors(capsys, tmp_path, monkeypatch, kind):
    """A nested tensor (rebuilt from its buffer and sizes) or a quantized one (from its storage and scales) cannot be
    described without decoding its parts: inspect lists the file, verify checks it, neither crashes."""
    monkeypatch.chdir(tmp_path)
    gen = torch.Generator().manual_seed(0)
    made = {
        "nested": lambda: torch.nested.nested_tensor([torch.randn(3, generator=gen), torch.randn(5, generator=gen)]),
        "quantized per tensor": lambda: torch.quantize_per_tensor(torch.randn(64, generator=gen), 0.1, 0, torch.qint8),
        "quantized per channel": lambda: torch.quantize_per_channel(
            torch.randn(4, 64, generator=gen),
            torch.rand(4, generator=gen) + 0.1,
            torch.zeros(4, dtype=torch.long),
            0,
            torch.qint8,
        ),
    }
    with warnings.catch_warnings():  # torch's prototype and deprecation warnings for these kinds
        warnings.simplefilter("ignore")
        state = {"x": made[kind](), "w": torch.randn(256, generator=gen)}
    lightning_nvcomp.save(state, "kinds.ckpt", codec="zstd")
    assert main(["inspect", "kinds.ckpt"]) == 0
    assert "kinds.ckpt" in capsys.readouterr().out
    assert main(["verify", "kinds.ckpt"]) == 0
    assert capsys.readouterr().out.startswith("OK: ")
