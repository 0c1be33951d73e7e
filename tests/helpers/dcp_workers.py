"""Multi-process jobs for tests/integration/test_dcp.py: real processes (spawn), a gloo process group, real files.

Each job runs named scenarios on every rank and writes, per rank, ``{scenario: "ok" | traceback}`` to
``<out>/rank<r>.json``: the tests assert on those. Every comparison of tensors is of their bits.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist

#: Full (unsharded) tensors every rank can rebuild: name -> (shape, dtype, kind).
FULL = {
    "w": ((64, 48), torch.bfloat16, "trained"),
    "m": ((30, 7), torch.float32, "trained"),  # 30 rows over 4 ranks: uneven shards
    "raw": ((12, 5), torch.float32, "bits"),  # every bit pattern: NaN payloads, infinities, denormals
    "r": ((40,), torch.float32, "trained"),  # replicated
    "plain": ((9, 3), torch.float64, "trained"),
    "idx": ((17,), torch.int64, "bits"),
}


def full_tensor(name: str, version: int = 0) -> torch.Tensor:
    shape, dtype, kind = FULL[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)) + 1000 * version)
    numel = 1
    for n in shape:
        numel *= n
    if kind == "trained":
        return (torch.randn(numel, generator=gen) * 0.02).to(dtype).reshape(shape)
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def dtensor_api() -> ModuleType:
    """DTensor's API (``DTensor``, ``distribute_tensor``, ``Shard``, ``Replicate``): public as
    ``torch.distributed.tensor`` from torch 2.5; torch 2.4 has the same names only in ``torch.distributed._tensor``."""
    import torch.distributed.tensor as public

    if hasattr(public, "distribute_tensor"):
        return public
    import torch.distributed._tensor as private

    return private


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8)


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (
        f"{what}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
    )
    assert torch.equal(bits(a), bits(b)), f"{what}: bytes differ"


def sharded_state(mesh, version: int = 0, zeros: bool = False) -> dict:
    """A state dict with DTensor (Shard(0), Replicate), ShardedTensor, plain tensors and non-tensor values."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    api = dtensor_api()
    Replicate, Shard, distribute_tensor = api.Replicate, api.Shard, api.distribute_tensor

    def make(name: str) -> torch.Tensor:
        t = full_tensor(name, version)
        return torch.zeros_like(t) if zeros else t

    ws = dist.get_world_size()
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(ws)])
    st = sharded_tensor.empty(spec, *FULL["raw"][0], dtype=FULL["raw"][1])
    full_raw = make("raw")
    for shard in st.local_shards():
        off, size = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
        shard.tensor.copy_(full_raw[off : off + size])
    return {
        "model": {
            "w": distribute_tensor(make("w"), mesh, [Shard(0)]),
            "m": distribute_tensor(make("m"), mesh, [Shard(0)]),
            "r": distribute_tensor(make("r"), mesh, [Replicate()]),
        },
        "st": st,
        "plain": make("plain"),
        "idx": make("idx"),
        "step": 0 if zeros else 7 + version,
        "extra": {"lr": 0.0 if zeros else 0.125, "name": "run"},
    }


def check_state(got: dict, version: int = 0) -> None:
    """``got`` (loaded into a sharded_state(zeros=True)) holds version ``version`` bit-exactly."""
    distribute_tensor = dtensor_api().distribute_tensor

    for name in ("w", "m", "r"):
        d = got["model"][name]
        expected = distribute_tensor(full_tensor(name, version), d.device_mesh, d.placements).to_local()
        assert_same(d.to_local(), expected, f"model.{name} (rank {dist.get_rank()})")
    full_raw = full_tensor("raw", version)
    for shard in got["st"].local_shards():
        off, size = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
        assert_same(shard.tensor, full_raw[off : off + size], "st")
    assert_same(got["plain"], full_tensor("plain", version), "plain")
    assert_same(got["idx"], full_tensor("idx", version), "idx")
    assert got["step"] == 7 + version, got["step"]
    assert got["extra"] == {"lr": 0.125, "name": "run"}, got["extra"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, job: str, out: str, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    results: dict[str, str] = {}
    try:
        JOBS[job](results, *args)
    except BaseException:
        results["<job>"] = traceback.format_exc()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def spawn(job: str, world_size: int, out: str | os.PathLike, *args, timeout: float = 120) -> list[dict]:
    """Run ``JOBS[job](results, *args)`` on ``world_size`` spawned ranks; return each rank's results."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, job, str(out), args)) for r in range(world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = []
    for r, p in enumerate(procs):
        path = Path(out, f"rank{r}.json")
        results.append(json.loads(path.read_text()) if path.exists() else {"<job>": f"no results (exit {p.exitcode})"})
    return results


def scenario(results: dict, name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
        results[name] = "ok"
    except BaseException:
        results[name] = traceback.format_exc()
        raise


# -- jobs ---------------------------------------------------------------------------------------------------------


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _save_load(path: str, writer_kwargs: dict, reader: str = "nvcomp", async_: bool = False, version: int = 0):
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

    mesh = _mesh()
    state = sharded_state(mesh, version)
    writer = NvcompFileSystemWriter(path, **writer_kwargs)
    if async_:
        future = dcp.async_save(state, storage_writer=writer)
        # Training goes on: the checkpoint must hold the state as it was when async_save returned.
        for t in (state["model"]["w"], state["model"]["m"], state["plain"]):
            t.add_(1)
        state["st"].local_shards()[0].tensor.fill_(0) if state["st"].local_shards() else None
        future.result()
    else:
        dcp.save(state, storage_writer=writer)
    target = sharded_state(mesh, zeros=True)
    storage_reader = NvcompFileSystemReader(path) if reader == "nvcomp" else dcp.FileSystemReader(path)
    dcp.load(target, storage_reader=storage_reader)
    check_state(target, version)
    return writer


def job_roundtrip(results: dict, root: str) -> None:
    """Sync save/load with each codec and reader, and async_save; sharded state on a world-size mesh."""
    from lightning_nvcomp.dcp import NvcompStorageInfo

    def zstd() -> None:
        writer = _save_load(f"{root}/zstd", {"codec": "zstd"})
        stats = writer.gather_stats()
        assert len(stats.ranks) == dist.get_world_size()
        assert all(r.codec == "zstd" for r in stats.ranks)
        assert stats.ranks[dist.get_rank()] == writer.stats, (stats, writer.stats)  # index = rank
        assert stats.raw_nbytes > 0 and stats.stored_nbytes > 0, stats  # tiny shards: zip headers dominate
        if dist.get_rank() == 0:
            assert writer.totals["raw_nbytes"] == stats.raw_nbytes, (writer.totals, stats)
            names = sorted(os.listdir(f"{root}/zstd"))
            # __<rank>_0.<checkpoint id>.distcp
            assert names[0] == ".metadata", names
            assert [n.split(".")[0] for n in names[1:]] == [f"__{r}_0" for r in range(dist.get_world_size())], names
            import pickle

            with open(f"{root}/zstd/.metadata", "rb") as f:
                meta = pickle.load(f)
            from torch.distributed.checkpoint.metadata import TensorStorageMetadata

            tensors = [
                i
                for k, i in meta.storage_data.items()
                if isinstance(meta.state_dict_metadata[k.fqn], TensorStorageMetadata)
            ]
            assert len(tensors) >= 6, meta.storage_data  # DTensor/ShardedTensor shards, plain tensors
            assert all(isinstance(i, NvcompStorageInfo) and i.codec == "zstd" and i.raw_nbytes for i in tensors), (
                tensors
            )

    scenario(results, "zstd", zstd)
    scenario(results, "plain_reader", lambda: _save_load(f"{root}/plain_reader", {"codec": "zstd"}, reader="plain"))
    scenario(results, "none", lambda: _save_load(f"{root}/none", {"codec": "none"}))
    scenario(results, "async_gpu", lambda: _save_load(f"{root}/async_gpu", {"codec": "zstd"}, async_=True))
    scenario(
        results,
        "async_stage_all",
        lambda: _save_load(f"{root}/async_all", {"codec": "zstd", "stage_compress": "all"}, async_=True),
    )


def job_auto(results: dict, root: str) -> None:
    """codec='auto': all ranks probe the storage together, rank 0 decides, every rank uses its choice."""
    from lightning_nvcomp.auto.calibration import CodecProfile
    from lightning_nvcomp.auto.policy import CodecPolicy

    def auto() -> None:
        rank = dist.get_rank()
        # Rank 0's measurements favour zstd, the others' favour none: the broadcast decides.
        profiles = (
            [CodecProfile("zstd", 3.0, 1000.0), CodecProfile("none", 1.0, float("inf"))]
            if rank == 0
            else [CodecProfile("zstd", 1.01, 0.001), CodecProfile("none", 1.0, float("inf"))]
        )
        policy = CodecPolicy(probe_nbytes=1 << 20, profiles=profiles, collective=True)
        writer = _save_load(f"{root}/auto", {"codec": "auto", "policy": policy})
        gathered = writer.gather_stats().ranks
        assert [r.codec for r in gathered] == ["zstd"] * dist.get_world_size()
        # rank 0's prediction, broadcast with the choice, is every rank's; it survives the gather as a Prediction
        assert all(r.prediction == gathered[0].prediction and r.prediction.codec == "zstd" for r in gathered), gathered
        assert gathered[rank] == writer.stats, (gathered, writer.stats)
        assert len(policy._bandwidth) == 1  # probed (together) once

    scenario(results, "auto", auto)


class _Failure(RuntimeError):
    pass


def job_failure(results: dict, root: str) -> None:
    """A save that fails on rank 1 in the middle of writing leaves the previous checkpoint loadable."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter
    from lightning_nvcomp.format import items

    write_tensor = items.write_tensor
    calls = [0]

    def failing_write_tensor(*args, **kwargs):
        calls[0] += 1
        if dist.get_rank() == 1 and calls[0] == 2:  # after its first item is written
            raise _Failure("injected failure")
        return write_tensor(*args, **kwargs)

    class FailingWriter(NvcompFileSystemWriter):
        """Rank 1 fails writing its second tensor item (the disk thread raises, as a full disk would)."""

        def write_data(self, plan, planner):
            calls[0] = 0
            items.write_tensor = failing_write_tensor
            try:
                return super().write_data(plan, planner)
            finally:
                items.write_tensor = write_tensor

    def load(path: str) -> dict:
        target = sharded_state(_mesh(), zeros=True)
        dcp.load(target, storage_reader=NvcompFileSystemReader(path))
        return target

    def same_dir() -> None:
        path = f"{root}/same"
        _save_load(path, {"codec": "zstd"}, version=0)
        try:
            dcp.save(sharded_state(_mesh(), version=1), storage_writer=FailingWriter(path, codec="zstd"))
        except BaseException as err:  # DCP's CheckpointException is a BaseException
            assert "injected failure" in str(err), err
        else:
            raise AssertionError("the failing save did not fail")
        check_state(load(path), version=0)
        dist.barrier()
        # The next successful save to the same directory replaces it and removes the stale files.
        _save_load(path, {"codec": "zstd"}, version=1)
        dist.barrier()
        if dist.get_rank() == 0:
            import pickle

            with open(f"{path}/.metadata", "rb") as f:
                referenced = {i.relative_path for i in pickle.load(f).storage_data.values()}
            assert set(os.listdir(path)) == referenced | {".metadata"}, (os.listdir(path), referenced)

    def new_dir() -> None:
        _save_load(f"{root}/prev", {"codec": "zstd"}, version=0)
        try:
            dcp.save(sharded_state(_mesh(), version=1), storage_writer=FailingWriter(f"{root}/next", codec="zstd"))
        except BaseException as err:  # DCP's CheckpointException is a BaseException
            assert "injected failure" in str(err), err
        else:
            raise AssertionError("the failing save did not fail")
        check_state(load(f"{root}/prev"), version=0)
        assert not os.path.exists(f"{root}/next/.metadata")
        try:
            load(f"{root}/next")
        except BaseException as err:
            assert ".metadata" in str(err), err
        else:
            raise AssertionError("a failed checkpoint loaded")

    scenario(results, "same_dir", same_dir)
    scenario(results, "new_dir", new_dir)


def job_save(results: dict, path: str) -> None:
    """Save version 0 (the 4-rank half of the resharding test) and load it back on the same ranks."""
    scenario(results, "save", lambda: _save_load(path, {"codec": "zstd"}))


def job_reshard_load(results: dict, path: str) -> None:
    """Load a checkpoint saved on another number of ranks: DTensor Shard(0) is resharded by DCP."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemReader

    def load() -> None:
        mesh = _mesh()
        full = sharded_state(mesh, zeros=True)
        target = {"model": full["model"], "plain": full["plain"], "idx": full["idx"], "step": 0, "extra": full["extra"]}
        dcp.load(target, storage_reader=NvcompFileSystemReader(path))
        distribute_tensor = dtensor_api().distribute_tensor

        for name in ("w", "m", "r"):
            d = target["model"][name]
            expected = distribute_tensor(full_tensor(name), d.device_mesh, d.placements).to_local()
            assert_same(d.to_local(), expected, f"model.{name}")
        assert_same(target["plain"], full_tensor("plain"), "plain")
        assert target["step"] == 7

    scenario(results, "reshard", load)


def job_two(results: dict, root: str) -> None:
    """Everything the 2-rank tests check, in one job (each process start costs seconds)."""
    job_roundtrip(results, f"{root}/roundtrip")
    job_auto(results, f"{root}/auto")
    job_failure(results, f"{root}/failure")


def _walked(name: str, version: int, shape: tuple[int, ...] = (96, 256)) -> torch.Tensor:
    """A weight as training leaves it ``version`` saves on: the same start, a small step each save (fp32)."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    start = torch.randn(shape, generator=gen) * 0.02
    steps = torch.randn((version + 1, *shape), generator=gen) * 1e-5
    return start + steps[1:].sum(0) if version else start


def job_delta(results: dict, root: str) -> None:
    """Deltas per rank (3 ranks): ranks 0 and 1 save twice as a group of 2 (the second save a delta), then all 3 ranks
    save with the same writers: a keyframe, though ranks 0 and 1 hold the same items (the world size changed); the
    next save is a delta again. Every checkpoint then loads bit-exactly on the 3 ranks."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp import DeltaOptions
    from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

    rank = dist.get_rank()
    pair = dist.new_group([0, 1])  # every rank makes it
    distribute_tensor, Shard = dtensor_api().distribute_tensor, dtensor_api().Shard

    def state(version: int, ranks: int) -> dict:
        own = {f"own{r}": _walked(f"own{r}", version) for r in range(ranks) if r == rank}
        if ranks == 3:
            own["w"] = distribute_tensor(_walked("w", version), _mesh(), [Shard(0)])
        return own

    def bases(step: int) -> dict:
        md = NvcompFileSystemReader(f"{root}/step-{step}").read_metadata()
        return {index.fqn: info.base for index, info in md.storage_data.items()}

    writer = NvcompFileSystemWriter(f"{root}/step-1", "zstd", delta=DeltaOptions(), process_group=pair)

    def pair_saves() -> None:
        if rank < 2:
            for step in (1, 2):
                dcp.save(state(step, 2), storage_writer=writer, checkpoint_id=f"{root}/step-{step}", process_group=pair)
            assert bases(1) == {"own0": None, "own1": None}, bases(1)
            assert bases(2) == {"own0": "../step-1", "own1": "../step-1"}, bases(2)
        dist.barrier()

    def world_saves() -> None:
        writer.process_group = None
        for step in (3, 4):
            dcp.save(state(step, 3), storage_writer=writer, checkpoint_id=f"{root}/step-{step}")
        found = bases(3)
        assert set(found) == {"own0", "own1", "own2", "w"} and not any(found.values()), found
        assert set(bases(4).values()) == {"../step-3"}, bases(4)

    def loads() -> None:
        for step, ranks in ((2, 2), (4, 3)):
            names = [f"own{r}" for r in range(ranks)]
            target = {n: torch.zeros(96, 256) for n in names}
            if ranks == 3:
                target["w"] = distribute_tensor(torch.zeros(96, 256), _mesh(), [Shard(0)])
            dcp.load(target, storage_reader=NvcompFileSystemReader(f"{root}/step-{step}"))
            for n in names:
                assert_same(target[n], _walked(n, step), f"step-{step} {n}")
            if ranks == 3:
                expected = distribute_tensor(_walked("w", step), _mesh(), [Shard(0)]).to_local()
                assert_same(target["w"].to_local(), expected, f"step-{step} w")

    scenario(results, "pair_saves", pair_saves)
    scenario(results, "world_saves", world_saves)
    scenario(results, "loads", loads)


JOBS = {
    "two": job_two,
    "roundtrip": job_roundtrip,
    "auto": job_auto,
    "failure": job_failure,
    "save": job_save,
    "reshard_load": job_reshard_load,
    "delta": job_delta,
}
