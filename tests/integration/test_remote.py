"""Remote storage through fsspec (issue 16): a real S3 server on localhost (moto's ThreadedMotoServer over HTTP, the
s3fs client) and ``memory://``. No mocks: the uploads, listings and ranged reads are real requests.

What is shown: saves and loads bit-exact at URLs (multipart, put, rename uploads); a failed upload and a server
stopped mid-upload leave the previous checkpoint intact and no partial object or multipart upload; a Lightning fit
with ``default_root_dir="s3://..."`` (compressed objects, top-k pruning, resume from ``last.ckpt``,
``load_from_checkpoint``, ``lightning_nvcomp.load``, the CLI); DCP on one process and on two gloo ranks; the
Accelerate hook; the probe's objects cleaned up.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import multiprocessing
import os
import re
import socket
import traceback
from pathlib import Path

import pytest
import torch

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import fsspec  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

import lightning_nvcomp  # noqa: E402
from lightning_nvcomp import cli  # noqa: E402
from lightning_nvcomp.auto.policy import CodecPolicy  # noqa: E402
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter  # noqa: E402
from lightning_nvcomp.errors import MissingExtraError  # noqa: E402
from lightning_nvcomp.storage import storage_for  # noqa: E402
from lightning_nvcomp.storage.remote import RemoteOptions  # noqa: E402
from lightning_nvcomp.storage.remote.multipart import retry_failed_aborts  # noqa: E402

from tests.helpers.processes import python_child  # noqa: E402
from tests.helpers.states import assert_tree_bit_exact, trained_like  # noqa: E402

MiB = 1 << 20
#: The smallest S3 part: a few MB of state makes multipart uploads of several parts.
SMALL_PARTS = RemoteOptions(part_nbytes=5 * MiB, max_parallel=3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int) -> ThreadedMotoServer:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server on a free localhost port, and the environment that points boto at it (also for children)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = _start(port)
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        # fsspec keeps S3 file systems by their options, not the environment: one made against an earlier module's
        # server (another port) would be reused
        fsspec.get_filesystem_class("s3").clear_instance_cache()
        yield endpoint
    server.stop()


_BUCKETS = iter(range(1_000_000))


@pytest.fixture
def bucket(s3_endpoint):
    """A fresh bucket on the moto server: ``(name, s3fs file system)``."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, client_kwargs={"endpoint_url": s3_endpoint})
    name = f"lnv-test-{os.getpid()}-{next(_BUCKETS)}"
    fs.mkdir(name)
    return name, fs


def objects(fs, bucket: str) -> dict[str, int]:
    """Every object of the bucket and its size (list_objects_v2, no cache)."""
    listed = fs.call_s3("list_objects_v2", Bucket=bucket)
    return {o["Key"]: o["Size"] for o in listed.get("Contents", [])}


def uploads(fs, bucket: str) -> list[str]:
    """The keys of the bucket's multipart uploads in progress (list_multipart_uploads)."""
    return [u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])]


def object_bytes(fs, bucket: str, key: str) -> bytes:
    return fs.cat_file(f"{bucket}/{key}")


def state(seed: int = 0, numel: int = 3_000_000) -> dict:
    """A trained-like state of about 12 MB (several 5 MiB parts once compressed) and some plain values."""
    return {
        "w": trained_like(numel, torch.float32, seed),
        "h": trained_like(numel // 4, torch.bfloat16, seed + 1),
        "i": torch.arange(1000, dtype=torch.int64) * (seed + 1),
        "step": 10 + seed,
        "name": "run",
    }


# -- save / load at URLs -------------------------------------------------------------------------------------------


def test_s3_save_is_a_multipart_upload_and_loads_bit_exactly(bucket):
    name, fs = bucket
    url = f"s3://{name}/run/step-1.ckpt"
    storage = storage_for(url, SMALL_PARTS)
    saved = state(0)
    stats = lightning_nvcomp.save(saved, url, codec="zstd", storage=storage)
    assert stats.file_nbytes > 2 * SMALL_PARTS.part_nbytes  # several parts
    assert objects(fs, name) == {"run/step-1.ckpt": stats.file_nbytes}
    assert uploads(fs, name) == []
    assert_tree_bit_exact(saved, lightning_nvcomp.load(url, storage=storage))
    # plain torch.load of the object read through fsspec decodes it too
    with fsspec.open(url, "rb") as f:
        assert_tree_bit_exact(saved, torch.load(io.BytesIO(f.read()), weights_only=True))
    # a file smaller than one part is one PutObject
    small = {"b": torch.arange(10.0)}
    lightning_nvcomp.save(small, f"s3://{name}/run/small.ckpt", codec="none", storage=storage)
    assert_tree_bit_exact(small, lightning_nvcomp.load(f"s3://{name}/run/small.ckpt"))
    assert uploads(fs, name) == []


@pytest.mark.parametrize("upload", ["put", "rename"])
def test_memory_save_and_load(upload):
    url = f"memory://lnv-{upload}/run/model.ckpt"
    storage = storage_for(url, RemoteOptions(upload=upload))
    saved = state(1, numel=200_000)
    lightning_nvcomp.save(saved, url, codec="zstd", storage=storage)
    lightning_nvcomp.save(saved, url, codec="zstd", storage=storage)  # replaced
    assert_tree_bit_exact(saved, lightning_nvcomp.load(url, storage=storage))
    assert storage.listdir(f"memory://lnv-{upload}/run") == ["model.ckpt"]  # no temporary names left


def test_a_pathlib_path_made_from_a_url_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="pathlib"):
        lightning_nvcomp.save({"w": torch.ones(2)}, Path("s3://bucket/x.ckpt"), codec="none")
    assert os.listdir(tmp_path) == []


def test_an_unknown_protocol_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="nosuchfs://b/x.ckpt"):
        lightning_nvcomp.save({"w": torch.ones(2)}, "nosuchfs://b/x.ckpt", codec="none")
    assert os.listdir(tmp_path) == []


def test_a_backend_not_installed_names_its_extra():
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here")
    with pytest.raises(MissingExtraError, match=re.escape("lightning-nvcomp[gcs]")):
        lightning_nvcomp.save({"w": torch.ones(2)}, "gs://bucket/x.ckpt", codec="none")


def test_range_reader_reads_every_range_right_and_fetches_ahead_in_parallel():
    """The reader under every load at a URL, over an in-memory object: any seek and read returns the right bytes;
    a small object is fetched once, whole; a large one in blocks, each fetched once on a sequential read, with
    several in flight at once and at most about 2 x max_parallel kept."""
    import random
    import threading
    import time

    from lightning_nvcomp.storage.remote.ranges import RangeReader

    data = bytes(random.Random(0).randbytes(3 * MiB + 12345))
    fetched: list[tuple[int, int]] = []
    active, peak = [0], [0]
    lock = threading.Lock()

    def fetch(start: int, end: int) -> bytes:
        with lock:
            fetched.append((start, end))
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.01)
        with lock:
            active[0] -= 1
        return data[start:end]

    with RangeReader(fetch, len(data), "memory://x", 1 * MiB, 8) as small:  # 4 blocks <= 8: fetched whole
        for start, n in [(len(data) - 22, 22), (0, 4), (2 * MiB - 10, 300_000), (100, 3 * MiB)]:
            small.seek(start)
            assert small.read(n) == data[start : start + n]
    assert sorted(fetched) == [(i * MiB, min(len(data), (i + 1) * MiB)) for i in range(4)]

    fetched.clear()
    with RangeReader(fetch, len(data), "memory://x", 256 << 10, 4) as large:  # 13 blocks > 4
        assert large.read(30) == data[:30]  # a small window
        large.seek(len(data) - 100)
        assert large.read() == data[-100:]
        large.seek(0)
        got = bytearray()
        while chunk := large.read(300_000):  # sequential large reads, as a load's records
            got += chunk
        assert bytes(got) == data
        block = 256 << 10
        blocks = [(a, b) for a, b in fetched if a % block == 0 and b == min(len(data), a + block)]
        assert len(blocks) == len(set(blocks)) == 13  # every block once
        assert peak[0] > 1  # in parallel
        assert len(large._blocks) <= 2 * 4 + 2


def test_the_core_imports_without_fsspec():
    """With fsspec unimportable, the core, the DCP storage and local saves work; a URL names the extra."""
    code = """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "fsspec" or name.startswith(("fsspec.", "s3fs")):
                    raise ImportError(f"blocked: {name}")
        sys.meta_path.insert(0, Block())
        import torch, lightning_nvcomp, lightning_nvcomp.dcp, lightning_nvcomp.saving.writer
        lightning_nvcomp.save({"w": torch.ones(3)}, sys.argv[1], codec="zstd")
        assert torch.equal(lightning_nvcomp.load(sys.argv[1])["w"], torch.ones(3))
        try:
            lightning_nvcomp.save({"w": torch.ones(3)}, "memory://b/x.ckpt", codec="zstd")
        except ImportError as err:
            print("MISSING", type(err).__name__, err)
        print("FSSPEC", "fsspec" in sys.modules)
    """
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        proc = python_child(code, os.path.join(directory, "x.ckpt"), check=True)
    assert (
        'MISSING MissingExtraError remote storage (memory://b/x.ckpt) needs fsspec: pip install "lightning-nvcomp[remote]"'
        in proc.stdout
    ), proc.stdout
    assert "FSSPEC False" in proc.stdout


# -- failures ------------------------------------------------------------------------------------------------------


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("this object refuses to be pickled")


def test_a_failed_upload_leaves_the_previous_checkpoint_and_no_partial_object(bucket):
    name, fs = bucket
    url = f"s3://{name}/run/last.ckpt"
    storage = storage_for(url, SMALL_PARTS)
    lightning_nvcomp.save(state(0), url, codec="zstd", storage=storage)
    before = object_bytes(fs, name, "run/last.ckpt")

    def fail_after_three_parts(f) -> None:
        for _ in range(3):
            f.write(b"\x01" * SMALL_PARTS.part_nbytes)
        assert uploads(fs, name) == ["run/last.ckpt"]  # the parts went up
        raise RuntimeError("the writer fails mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        storage.write(url, fail_after_three_parts)
    # the save itself failing after its segments were uploaded (the pickle is written last)
    with pytest.raises(Exception, match="refuses to be pickled"):
        lightning_nvcomp.save({**state(1), "bad": _Unpicklable()}, url, codec="zstd", storage=storage)
    assert objects(fs, name) == {"run/last.ckpt": len(before)}
    assert object_bytes(fs, name, "run/last.ckpt") == before
    assert uploads(fs, name) == []  # aborted
    assert_tree_bit_exact(state(0), lightning_nvcomp.load(url))


def test_a_server_stopped_mid_upload_leaves_the_previous_checkpoint(s3_endpoint):
    """A server of its own, stopped while the parts of a save go up: the save fails, and once the server is back the
    previous object is intact, no partial object exists, and the abort that failed is retried."""
    port = _free_port()
    server = _start(port)
    options = RemoteOptions(
        storage_options={
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 5},
            "skip_instance_cache": True,
        },
        part_nbytes=5 * MiB,
        max_parallel=2,
    )
    name = f"lnv-stopped-{os.getpid()}"
    url = f"s3://{name}/run/last.ckpt"
    storage = storage_for(url, options)
    fs = storage.fs  # type: ignore[attr-defined]
    try:
        fs.mkdir(name)
        lightning_nvcomp.save(state(0), url, codec="zstd", storage=storage)
        before = object_bytes(fs, name, "run/last.ckpt")

        def stop_mid_upload(f) -> None:
            for _ in range(2):
                f.write(b"\x02" * options.part_nbytes)
            server.stop()
            for _ in range(4):
                f.write(b"\x03" * options.part_nbytes)

        with pytest.raises(Exception):  # noqa: B017 - whatever the client raises for a refused connection
            storage.write(url, stop_mid_upload)
        server = _start(port)  # the same in-process backend: what the server held is still there
        assert objects(fs, name) == {"run/last.ckpt": len(before)}
        assert object_bytes(fs, name, "run/last.ckpt") == before
        assert uploads(fs, name) == ["run/last.ckpt"]  # the abort could not reach the server
        retry_failed_aborts()  # what the next upload of this process does first
        assert uploads(fs, name) == []
        assert_tree_bit_exact(state(0), lightning_nvcomp.load(url, storage=storage))
    finally:
        server.stop()


# -- the probe and auto --------------------------------------------------------------------------------------------


def test_the_probe_writes_through_s3_and_cleans_up(bucket):
    name, fs = bucket
    directory = f"s3://{name}/run"
    policy = CodecPolicy(probe_nbytes=12 * MiB, remote=SMALL_PARTS)
    gbps = policy.write_gbps(directory, 12 * MiB)
    assert 0 < gbps < 1000 and not policy.bandwidth_assumed(directory)
    assert objects(fs, name) == {} and uploads(fs, name) == []  # the probe object was deleted
    stats = lightning_nvcomp.save(state(0), f"{directory}/a.ckpt", codec="auto", policy=policy)
    assert stats.prediction is not None and stats.codec == stats.prediction.codec
    assert list(objects(fs, name)) == ["run/a.ckpt"]


# -- Lightning -----------------------------------------------------------------------------------------------------


def _trainer(root: str, **kwargs):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_nvcomp import NvcompCheckpointIO

    from tests.helpers.lightning_models import quiet_trainer

    checkpoint = ModelCheckpoint(filename="{epoch}-{step}", monitor="step", mode="max", save_top_k=2, save_last=True)
    options = dict(max_epochs=3, plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4)], callbacks=[checkpoint])
    return quiet_trainer(root, **{**options, **kwargs})


def _is_compressed(url: str) -> bool:
    described = lightning_nvcomp.format.describe(url)
    infos = [v for v in described["state_dict"].values() if isinstance(v, lightning_nvcomp.format.TensorInfo)]
    return bool(infos) and any(set(i.record["codecs"]) - {"raw"} for i in infos)


def test_lightning_fit_on_s3_prunes_resumes_and_loads_bit_exactly(bucket, tmp_path, monkeypatch, capsys):
    from tests.helpers.lightning_models import TinyData, TinyModule

    name, fs = bucket
    monkeypatch.chdir(tmp_path)
    root = f"s3://{name}/run"
    torch.manual_seed(0)
    full_model = TinyModule()
    full = _trainer(root, max_epochs=3)
    full.fit(full_model, datamodule=TinyData())
    keys = sorted(objects(fs, name))
    # top 2 by step, the others pruned (deleted), plus last.ckpt; nothing else (no probe, no temporary object)
    assert keys == [
        "run/checkpoints/epoch=1-step=8.ckpt",
        "run/checkpoints/epoch=2-step=12.ckpt",
        "run/checkpoints/last.ckpt",
    ]
    assert uploads(fs, name) == []
    assert all(_is_compressed(f"s3://{name}/{k}") for k in keys)
    assert os.listdir(tmp_path) == []  # nothing local (no "s3:" folder)

    # resume from s3://.../last.ckpt of a 2-epoch run: ends bit-exactly where the uninterrupted run did
    torch.manual_seed(0)
    short = _trainer(f"s3://{name}/short", max_epochs=2)
    short.fit(TinyModule(), datamodule=TinyData())
    torch.manual_seed(1)
    resumed_model = TinyModule()  # other weights: all must come from the checkpoint
    resumed = _trainer(f"s3://{name}/resumed", max_epochs=3)
    resumed.fit(resumed_model, datamodule=TinyData(), ckpt_path=f"s3://{name}/short/checkpoints/last.ckpt")
    assert resumed.global_step == full.global_step == 12
    assert_tree_bit_exact(full_model.state_dict(), resumed_model.state_dict())
    assert_tree_bit_exact(full.optimizers[0].state_dict(), resumed.optimizers[0].state_dict())

    last = f"s3://{name}/run/checkpoints/last.ckpt"
    loaded = TinyModule.load_from_checkpoint(last)  # Lightning's own fsspec read, then torch.load
    assert_tree_bit_exact(full_model.state_dict(), loaded.state_dict())
    ckpt = lightning_nvcomp.load(last)
    assert_tree_bit_exact(full_model.state_dict(), ckpt["state_dict"])
    assert_tree_bit_exact(full.optimizers[0].state_dict(), ckpt["optimizer_states"][0])

    capsys.readouterr()
    assert cli.main(["inspect", last]) == 0
    assert "zstd" in capsys.readouterr().out
    assert cli.main(["verify", last, "-q"]) == 0
    assert "OK:" in capsys.readouterr().out
    converted = f"s3://{name}/converted.pt"
    assert cli.main(["convert", last, converted, "--codec", "torch", "-q"]) == 0
    with fsspec.open(converted, "rb") as f:
        plain = torch.load(io.BytesIO(f.read()), weights_only=False)
    assert_tree_bit_exact(full_model.state_dict(), plain["state_dict"])
    # a damaged object fails verify (exit 1)
    data = bytearray(object_bytes(fs, name, "run/checkpoints/epoch=1-step=8.ckpt"))
    data[len(data) // 2] ^= 0x40
    fs.pipe_file(f"{name}/damaged.ckpt", bytes(data))
    assert cli.main(["verify", f"s3://{name}/damaged.ckpt", "-q"]) == 1


# -- DCP -----------------------------------------------------------------------------------------------------------


def test_dcp_on_s3_single_process(bucket):
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    name, fs = bucket
    url = f"s3://{name}/dcp/step-1"
    saved = state(2)
    writer = NvcompFileSystemWriter(url, codec="zstd", remote=SMALL_PARTS)
    dcp.save(saved, storage_writer=writer)
    assert writer.stats is not None and writer.stats.items == 3
    first = sorted(objects(fs, name))
    assert ".metadata" in {k.rsplit("/", 1)[-1] for k in first} and uploads(fs, name) == []

    def target() -> dict:
        return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in saved.items()}

    for reader in (NvcompFileSystemReader(url, remote=SMALL_PARTS), FsspecReader(url)):
        got = target()
        dcp.load(got, storage_reader=reader)
        assert_tree_bit_exact(
            {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}, {k: got[k] for k in ("w", "h", "i")}
        )
        assert got["step"] == saved["step"] and got["name"] == "run"
    # overwritten in place: the new data file never reuses the old name, the old one is deleted after .metadata
    newer = state(3)
    dcp.save(newer, storage_writer=NvcompFileSystemWriter(url, codec="zstd", remote=SMALL_PARTS))
    second = sorted(objects(fs, name))
    assert len(second) == len(first) and set(second) != set(first)
    got = target()
    dcp.load(got, storage_reader=NvcompFileSystemReader(url))
    assert_tree_bit_exact(newer["w"], got["w"])


def _dcp_rank(rank: int, world_size: int, port: int, url: str, out: str) -> None:
    """One gloo rank: save a sharded state at ``url``, load it back into zeros, check it (dcp_workers' state)."""
    import json

    import torch.distributed as dist

    from tests.helpers import dcp_workers as D

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    result = "ok"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        mesh = D._mesh()
        writer = NvcompFileSystemWriter(url, codec="zstd", remote=SMALL_PARTS)
        dcp.save(D.sharded_state(mesh, 0), storage_writer=writer)
        got = D.sharded_state(mesh, 0, zeros=True)
        dcp.load(got, storage_reader=NvcompFileSystemReader(url))
        D.check_state(got, 0)
        stats = writer.gather_stats()
        assert len(stats.ranks) == world_size and all(r.file_nbytes > 0 for r in stats.ranks), stats
    except BaseException:
        result = traceback.format_exc()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def test_dcp_on_s3_two_gloo_ranks(bucket, tmp_path):
    import json

    name, fs = bucket
    url = f"s3://{name}/sharded/step-1"
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_dcp_rank, args=(r, 2, port, url, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = [
        json.loads((tmp_path / f"rank{r}.json").read_text()) if (tmp_path / f"rank{r}.json").exists() else "no result"
        for r in range(2)
    ]
    assert results == ["ok", "ok"], "\n".join(map(str, results))
    names = {k.rsplit("/", 1)[-1] for k in objects(fs, name)}
    assert (
        ".metadata" in names and any(n.startswith("__0_") for n in names) and any(n.startswith("__1_") for n in names)
    )
    assert uploads(fs, name) == []


# -- Accelerate ----------------------------------------------------------------------------------------------------


def test_accelerate_save_state_to_s3_and_back(bucket, tmp_path, monkeypatch):
    import copy

    from lightning_nvcomp.integrations.accelerate.attach import attach

    from tests.helpers import accelerate_runs as R

    name, fs = bucket
    monkeypatch.chdir(tmp_path)
    run = R.build(seed=5)
    R.train(run, 3)
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4, remote=SMALL_PARTS)
    try:
        url = f"s3://{name}/acc/checkpoint_0"
        assert run.accelerator.save_state(url) == url
        saved = copy.deepcopy(R.states(run))
        after_save = R.draws()
        keys = {k.rsplit("/", 1)[-1] for k in objects(fs, name)}
        assert {"pytorch_model.bin", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= keys, keys
        assert lightning_nvcomp.format.describe(f"{url}/optimizer.bin") is not None
        R.train(run, 2)  # move away from the saved state
        run.accelerator.load_state(url)
        assert_tree_bit_exact(saved, R.states(run))
        assert R.draws() == after_save  # the RNG states came back from the URL too
        with pytest.raises(ValueError, match="automatic checkpoint naming"):
            run.accelerator.project_configuration.automatic_checkpoint_naming = True
            run.accelerator.project_configuration.project_dir = f"s3://{name}/auto"
            run.accelerator.save_state()
    finally:
        attachment.detach()
    assert os.listdir(tmp_path) == []
