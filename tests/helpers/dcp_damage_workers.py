"""Multi-process jobs for tests/safety/test_dcp_damage.py: real processes (spawn), a gloo process group, real files.

The helpers of tests/helpers/dcp_workers.py (states, bit comparisons, ``scenario``) are reused; this module has its own
entry point and ``spawn`` because its jobs need a process-group timeout, a rank that kills itself (``os._exit``) and
results that are not only "ok" or a traceback.

* ``campaign``: on 1 rank, saves a small state (tensors of several dtypes, a DTensor, non-tensor values) with codec
  ``zstd`` and ``none``, then damages copies of ``.metadata`` and of every item of the ``.distcp`` file (sampled
  single-bit flips, zeroed 16-byte ranges, truncations) and loads each through :class:`NvcompFileSystemReader` and
  through DCP's default reader (``dcp.load(..., checkpoint_id=...)``), classifying each load (see :func:`classify`).
* ``kill_mid_save``: on 2 ranks, saves checkpoint A, then saves checkpoint B into the same directory while rank 1
  dies (``os._exit(9)``) inside ``write_data`` after writing part of its file.
* ``load_after_kill``: on 2 ranks, in fresh processes: the directory loads as checkpoint A (both readers); then a
  new save there succeeds and sweeps the partial files.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import time
import traceback
import zipfile
from pathlib import Path

import torch
import torch.distributed as dist

from tests.helpers import dcp_workers as W

# -- processes ----------------------------------------------------------------------------------------------------


def _entry(rank: int, world_size: int, port: int, job: str, out: str, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.CRITICAL)  # DCP logs every failed load, with its traceback, on the root logger
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=30),
    )
    results: dict = {}
    try:
        JOBS[job](results, out, *args)
    except BaseException:
        results["<job>"] = traceback.format_exc()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def spawn(job: str, world_size: int, out: str | os.PathLike, *args, timeout: float = 120) -> tuple[list[dict], list]:
    """Run ``JOBS[job](results, out, *args)`` on ``world_size`` spawned ranks; a rank still alive after ``timeout``
    seconds (all ranks together) is killed. Returns each rank's results and exit code."""
    ctx = multiprocessing.get_context("spawn")
    port = W.free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, job, str(out), args)) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = []
    for r, p in enumerate(procs):
        path = Path(out, f"rank{r}.json")
        results.append(json.loads(path.read_text()) if path.exists() else {"<job>": f"no results (exit {p.exitcode})"})
    return results, [p.exitcode for p in procs]


# -- the damage campaign ----------------------------------------------------------------------------------------


def campaign_state(zeros: bool = False) -> dict:
    """A small state: tensors of several dtypes, a DTensor (Shard(0) on the 1-rank mesh), non-tensor values."""
    from torch.distributed.device_mesh import init_device_mesh

    Shard, distribute_tensor = W.dtensor_api().Shard, W.dtensor_api().distribute_tensor

    gen = torch.Generator().manual_seed(12)

    def t(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x) if zeros else x

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return {
        "w": t((torch.randn(48, 40, generator=gen) * 0.02).to(torch.bfloat16)),
        "m": t(torch.randn(30, 7, generator=gen) * 0.02),
        "h": t((torch.randn(9, 11, generator=gen)).to(torch.float16)),
        "idx": t(torch.randint(-(2**62), 2**62, (17,), generator=gen, dtype=torch.int64)),
        "mask": t(torch.rand(23, generator=gen) > 0.5),
        "d": distribute_tensor(t(torch.randn(12, 5, generator=gen)), mesh, [Shard(0)]),
        "step": 0 if zeros else 7,
        "extra": {"lr": 0.0 if zeros else 0.125, "name": "" if zeros else "run"},
    }


def _leaves(state: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _bits(value) -> torch.Tensor:
    DTensor = W.dtensor_api().DTensor

    if isinstance(value, DTensor):
        value = value.to_local()
    return W.bits(value)


def classify(loaded: dict, expected: dict) -> str:
    """``equal`` (every tensor bit-identical, every value equal), ``silent`` (a tensor differs: dtype, shape or
    bytes) or ``silent_value`` (only a non-tensor value differs)."""
    got, want = _leaves(loaded), _leaves(expected)
    value_differs = False
    for key, value in want.items():
        other = got.get(key)
        if isinstance(value, torch.Tensor):
            if not isinstance(other, torch.Tensor) or other.dtype != value.dtype or other.shape != value.shape:
                return "silent"
            if not torch.equal(_bits(other), _bits(value)):
                return "silent"
        elif type(other) is not type(value) or other != value:
            value_differs = True
    return "silent_value" if value_differs else "equal"


def _regions(item: bytes) -> list[tuple[str, int, int]]:
    """The parts of one stored item (a torch.save zip): each entry's local header and data, the central directory
    and end records. Labels: ``header``, ``pickle`` (data.pkl), ``data`` (tensor bytes or compressed segments),
    ``small`` (byteorder, version...), ``directory``."""
    import io

    regions = []
    with zipfile.ZipFile(io.BytesIO(item)) as z:
        infos = sorted(z.infolist(), key=lambda i: i.header_offset)
        directory = z.start_dir
    for n, info in enumerate(infos):
        name_len = int.from_bytes(item[info.header_offset + 26 : info.header_offset + 28], "little")
        extra_len = int.from_bytes(item[info.header_offset + 28 : info.header_offset + 30], "little")
        start = info.header_offset + 30 + name_len + extra_len
        if n == 0:
            regions.append(("header", info.header_offset, start))
        if info.file_size:
            if info.filename.endswith("/data.pkl"):
                label = "pickle"
            elif "/data/" in info.filename:
                label = "data"
            else:
                label = "small"
            regions.append((label, start, start + info.file_size))
    regions.append(("directory", directory, len(item)))
    return regions


def _cases(
    rng: random.Random,
    span: tuple[int, int],
    regions: list[tuple[str, int, int]],
    per_region: dict[str, int],
    zeros: dict[str, int],
    truncations: int,
) -> list[tuple[str, str, int, int]]:
    """``(kind, region, position, bit)`` damage cases: flips (``bit`` 0-7) and zeroed 16 bytes sampled in each
    region, truncations at a position in ``span``."""
    cases = []
    merged: dict[str, list[tuple[int, int]]] = {}
    for label, start, end in regions:
        if end > start:
            merged.setdefault(label, []).append((start, end))
    for label, spans in merged.items():
        for kind, count in (("flip", per_region.get(label, 1)), ("zero16", zeros.get(label, 0))):
            for _ in range(count):
                start, end = rng.choice(spans)
                cases.append((kind, label, rng.randrange(start, end), rng.randrange(8)))
    for _ in range(truncations):
        cases.append(("truncate", "end", rng.randrange(*span), 0))
    return cases


def _damage(data: bytes, kind: str, pos: int, bit: int) -> bytes:
    buf = bytearray(data)
    if kind == "flip":
        buf[pos] ^= 1 << bit
        return bytes(buf)
    if kind == "zero16":
        end = min(len(buf), pos + 16)
        if buf[pos:end] == bytes(end - pos):  # already zero: zero the 16 bytes before it instead (a real change)
            pos, end = max(0, pos - 16), pos
        buf[pos:end] = bytes(end - pos)
        return bytes(buf)
    return bytes(buf[:pos])


def _load(reader: str, path: str) -> tuple[str, str, str]:
    """(outcome, error type, message) of loading ``path`` into a zeroed state."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemReader

    target = campaign_state(zeros=True)
    try:
        if reader == "ours":
            dcp.load(target, storage_reader=NvcompFileSystemReader(path))
        else:
            dcp.load(target, checkpoint_id=path)  # DCP picks its default FileSystemReader
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # DCP wraps failures in CheckpointException (a BaseException)
        inner = [e for e, _ in getattr(err, "failures", {}).values()] or [err]
        return "error", type(inner[0]).__name__, str(err)[-2000:]
    return classify(target, campaign_state()), "", ""


def job_campaign(results: dict, out: str, root: str, seed: int) -> None:
    """Save one checkpoint per codec, damage copies, load each through both readers; ``results["cases"]`` lists
    ``{codec, file, item, kind, region, pos, ours, ours_type, ours_msg, default, default_type}``."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemWriter, _load_metadata

    rng = random.Random(seed)
    cases: list[dict] = []
    begin = time.perf_counter()
    for codec in ("zstd", "none"):
        clean = Path(root, codec)
        dcp.save(campaign_state(), storage_writer=NvcompFileSystemWriter(clean, codec=codec))
        for reader in ("ours", "default"):
            outcome = _load(reader, str(clean))
            assert outcome[0] == "equal", (codec, reader, outcome)
        files = {name: (clean / name).read_bytes() for name in os.listdir(clean)}
        metadata = _load_metadata(files[".metadata"], ".metadata")
        data_files = sorted(n for n in files if n.endswith(".distcp"))
        assert [n.split(".")[0] for n in data_files] == ["__0_0"], data_files  # __0_0.<checkpoint id>.distcp
        plan = [
            (".metadata", ".metadata", c)
            for c in _cases(
                rng,
                (0, len(files[".metadata"])),
                [("metadata", 0, len(files[".metadata"]))],
                {"metadata": 24},
                {"metadata": 8},
                6,
            )
        ]
        for index, info in sorted(metadata.storage_data.items(), key=lambda kv: kv[1].offset):
            item = files[info.relative_path][info.offset : info.offset + info.length]
            regions = [(label, info.offset + s, info.offset + e) for label, s, e in _regions(item)]
            plan += [
                (info.relative_path, index.fqn, c)
                for c in _cases(
                    rng,
                    (info.offset, info.offset + info.length),
                    regions,
                    {"pickle": 3, "data": 3, "header": 1, "small": 1, "directory": 2},
                    {"pickle": 1, "data": 1},
                    1,
                )
            ]
        work = Path(root, f"{codec}-damaged")
        for name, fqn, (kind, region, pos, bit) in plan:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            for other, data in files.items():
                (work / other).write_bytes(_damage(data, kind, pos, bit) if other == name else data)
            ours, ours_type, ours_msg = _load("ours", str(work))
            default, default_type, _ = _load("default", str(work))
            cases.append(
                {
                    "codec": codec,
                    "file": name,
                    "item": fqn,
                    "kind": kind,
                    "region": region,
                    "pos": pos,
                    "ours": ours,
                    "ours_type": ours_type,
                    "ours_msg": ours_msg,
                    "default": default,
                    "default_type": default_type,
                }
            )
    results["cases"] = cases
    results["seconds"] = time.perf_counter() - begin
    results["campaign"] = "ok"


# -- a rank killed mid-save -------------------------------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def job_kill_mid_save(results: dict, out: str, path: str) -> None:
    """Checkpoint A (version 0), then B (version 1) into the same directory: rank 1 dies inside write_data after
    its first item is written (its data file is partial). Rank 0 records the digest of A's ``.metadata``."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemWriter
    from lightning_nvcomp.format import items

    write_tensor = items.write_tensor
    calls = [0]

    def dying_write_tensor(*args, **kwargs):
        calls[0] += 1
        if dist.get_rank() == 1 and calls[0] == 3:  # items 1 and 2 are in the file: a partial data file
            Path(out, "rank1.json").write_text(json.dumps(results))  # os._exit skips every finally
            os._exit(9)
        return write_tensor(*args, **kwargs)

    class DyingWriter(NvcompFileSystemWriter):
        """Used only here: rank 1 exits (as if killed) in the middle of writing its data file."""

        def write_data(self, plan, planner):
            items.write_tensor = dying_write_tensor
            try:
                return super().write_data(plan, planner)
            finally:
                items.write_tensor = write_tensor

    def save_a() -> None:
        W._save_load(path, {"codec": "zstd"}, version=0)
        dist.barrier()
        if dist.get_rank() == 0:
            results["A_metadata"] = _digest(Path(path, ".metadata"))
            results["A_files"] = sorted(os.listdir(path))

    W.scenario(results, "A", save_a)
    results["B"] = "started"
    mesh = W._mesh()
    try:
        dcp.save(W.sharded_state(mesh, version=1), storage_writer=DyingWriter(path, codec="zstd"))
    except BaseException as err:  # rank 0: the collective fails when rank 1's connection drops
        results["B"] = f"failed: {type(err).__name__}"
        return
    results["B"] = "completed"  # must not happen


def job_load_after_kill(results: dict, out: str, path: str) -> None:
    """Fresh processes: the directory holds checkpoint A (both readers, bit-exact); a new save (version 2) there
    succeeds and leaves only its own files."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemReader

    def load(reader: str) -> None:
        target = W.sharded_state(W._mesh(), zeros=True)
        if reader == "ours":
            dcp.load(target, storage_reader=NvcompFileSystemReader(path))
        else:
            dcp.load(target, checkpoint_id=path)
        W.check_state(target, version=0)

    W.scenario(results, "ours", lambda: load("ours"))
    W.scenario(results, "default", lambda: load("default"))
    dist.barrier()

    def save_c() -> None:
        W._save_load(path, {"codec": "zstd"}, version=2)  # also loads it back with our reader
        dist.barrier()
        if dist.get_rank() == 0:
            import pickle

            with open(Path(path, ".metadata"), "rb") as f:
                referenced = {i.relative_path for i in pickle.load(f).storage_data.values()}
            left = set(os.listdir(path))
            assert left == referenced | {".metadata"}, (sorted(left), sorted(referenced))

    W.scenario(results, "C", save_c)


JOBS = {
    "campaign": job_campaign,
    "kill_mid_save": job_kill_mid_save,
    "load_after_kill": job_load_after_kill,
}
