"""Issue "Nothing silently wrong": one test per failure the attack found, each on real files and processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lightning_nvcomp
from lightning_nvcomp import cli
from lightning_nvcomp import format as fileformat
from lightning_nvcomp.codec import record, schema
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, DecodeLimitError

from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import python_child
from tests.helpers.states import assert_bit_exact, tensor_bytes, trained_like
from tests.safety.test_damage import Reduce, good_args  # noqa: F401  (a fixture)


def test_two_dtypes_on_one_storage_are_refused_for_every_codec(tmp_path):
    x = torch.arange(16, dtype=torch.int32)
    for codec in ("none", "zstd"):
        with pytest.raises(CheckpointError, match="different types"):
            lightning_nvcomp.save({"i": x, "f": x.view(torch.float32)}, tmp_path / f"{codec}.pt", codec=codec)
        assert not (tmp_path / f"{codec}.pt").exists()
    with pytest.raises(RuntimeError):  # torch.save refuses it too
        torch.save({"i": x, "f": x.view(torch.float32)}, tmp_path / "torch.pt")


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_loaded_tensors_do_not_change_when_the_file_is_rewritten_in_place(tmp_path, codec):
    """Returned tensors own their memory (no mapped pages): rewriting or cutting the file later changes nothing
    and cannot kill the process (SIGBUS). Run in a child: a SIGBUS would take pytest down."""
    code = f"""
        import sys, torch, lightning_nvcomp
        path = sys.argv[1]
        lightning_nvcomp.save({{"w": torch.ones(1 << 16), "b": torch.arange(10.0)}}, path, codec="{codec}")
        back = lightning_nvcomp.load(path)
        with open(path, "r+b") as f:  # another program rewrites the file in place, then cuts it short
            f.write(b"\\x00" * 4096 * 16)
            f.truncate(100)
        assert torch.equal(back["w"], torch.ones(1 << 16)) and torch.equal(back["b"], torch.arange(10.0))
        print("unchanged")
    """
    proc = python_child(code, str(tmp_path / "ck.pt"))
    assert proc.returncode == 0 and "unchanged" in proc.stdout, proc.stderr


def test_plain_torch_files_load_copied_unless_mmap_is_asked_for(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(1000)}, path)
    back = lightning_nvcomp.load(path)
    path.write_bytes(b"\0" * path.stat().st_size)  # same inode, other bytes
    assert torch.equal(back["w"], torch.ones(1000))


RACE_WRITER = """
import sys, torch, lightning_nvcomp
path, codec, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(rounds):
    v = float(i % 2)
    lightning_nvcomp.save({"a": torch.full((50_000,), v), "b": torch.full((300,), v), "tag": i % 2}, path, codec=codec)
"""


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_load_racing_atomic_saves_reads_one_whole_file(tmp_path, codec):
    """A reader never sees a mix of the old and the new file, and never calls a healthy file damaged."""
    path = tmp_path / "last.ckpt"
    lightning_nvcomp.save({"a": torch.zeros(50_000), "b": torch.zeros(300), "tag": 0}, path, codec=codec)
    writer = subprocess.Popen([sys.executable, "-c", RACE_WRITER, str(path), codec, "60"], cwd=REPO_ROOT)
    loads = 0
    try:
        while writer.poll() is None and loads < 400:
            obj = lightning_nvcomp.load(path)
            v = float(obj["tag"])
            assert torch.equal(obj["a"], torch.full((50_000,), v)) and torch.equal(obj["b"], torch.full((300,), v))
            loads += 1
    finally:
        writer.kill()
        writer.wait()
    assert loads > 10


def test_copies_of_one_record_decode_once(good_args, tmp_path):
    """8 copies of one record (distinct dicts, the same blobs) decode to one storage: no 8x memory."""
    from tests.safety.test_damage import decode_args

    copies = {f"t{i}": Reduce(*decode_args(good_args, f"t{i}", rec=dict(good_args[2]))) for i in range(8)}
    path = tmp_path / "copies.pt"
    torch.save(copies, path)
    for load in (lambda: lightning_nvcomp.load(path), lambda: torch.load(path, weights_only=True)):
        back = load()
        assert len({t.untyped_storage().data_ptr() for t in back.values()}) == 1
        for t in back.values():
            assert_bit_exact(t, good_args[0])


def _bomb(path: Path, records: int, nbytes: int) -> None:
    """A small file whose ``records`` records each decode to ``nbytes`` of zeros (distinct blobs, so no dedup)."""
    blobs, meta = record.encode(torch.zeros(nbytes, dtype=torch.uint8), torch.uint8, "zstd")
    meta.update(storages=[[0, nbytes]], device="cpu")
    schema.seal(meta)
    calls = {}
    for i in range(records):
        own = [b.clone() for b in blobs]
        args = [own, meta, 0, 0, (nbytes,), (1,), False, False, f"z{i}"]
        calls[f"z{i}"] = Reduce(*args, fileformat.tensor_check(meta, *args[2:]))
    torch.save(calls, path)


def test_decompression_bomb_is_refused_with_a_way_out(tmp_path, monkeypatch):
    path = tmp_path / "bomb.pt"
    _bomb(path, records=6, nbytes=64 << 20)  # ~20 KB that would decode to 384 MiB
    assert path.stat().st_size < 100_000
    for load in (lambda: lightning_nvcomp.load(path), lambda: torch.load(path, weights_only=True)):
        with pytest.raises(DecodeLimitError) as info:
            load()
        message = str(info.value)
        assert "max_decoded_nbytes" in message and fileformat.DECODE_LIMIT_ENV in message
    assert cli.main(["verify", str(path), "-q"]) == 2  # not damage: cannot be checked within the limit
    back = lightning_nvcomp.load(path, max_decoded_nbytes=400 << 20)
    assert all(not t.any() for t in back.values())
    monkeypatch.setenv(fileformat.DECODE_LIMIT_ENV, "unlimited")
    assert len(torch.load(path, weights_only=True)) == 6
    monkeypatch.setenv(fileformat.DECODE_LIMIT_ENV, str(1 << 20))
    with pytest.raises(DecodeLimitError):
        lightning_nvcomp.load(tmp_path / "bomb.pt")


def test_a_record_with_a_start_offset_places_its_storage_there(good_args, tmp_path):
    data, blobs, meta = good_args
    rec = dict(meta, storages=[[64, 192]])
    rec["check"] = schema.record_check(rec)
    from tests.safety.test_damage import decode_args

    path = tmp_path / "offset.pt"
    torch.save({"t": Reduce(*decode_args(good_args, "t", rec=rec, size=(48,)))}, path)
    assert_bit_exact(lightning_nvcomp.load(path)["t"], data[16:])


def test_two_tensors_sharing_one_record_dict_each_have_their_blobs_checked(good_args, tmp_path):
    from tests.safety.test_damage import decode_args

    data, blobs, meta = good_args
    damaged = [b.clone() for b in blobs]
    damaged[0][damaged[0].numel() // 2] ^= 0x04
    rec = dict(meta)
    path = tmp_path / "shared.pt"
    torch.save(
        {
            "a": Reduce(*decode_args(good_args, "a", rec=rec)),
            "b": Reduce(*decode_args(good_args, "b", rec=rec, blobs=damaged)),
        },
        path,
    )
    for load in (lambda: lightning_nvcomp.load(path), lambda: torch.load(path, weights_only=True)):
        with pytest.raises(CorruptCheckpointError):
            load()


@pytest.mark.parametrize("cut", [0, 1, 2, 3])
def test_a_file_cut_to_a_few_bytes_says_so(tmp_path, cut):
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save({"w": torch.ones(10)}, path, codec="zstd")
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(CorruptCheckpointError) as info:
        lightning_nvcomp.load(path)
    message = str(info.value)
    assert str(path) in message and "not a checkpoint" in message and "weights_only" not in message
    assert cli.main(["verify", str(path), "-q"]) == 1


def test_damaged_first_bytes_name_the_damage(tmp_path):
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save({"w": torch.ones(10)}, path, codec="zstd")
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError) as info:
        lightning_nvcomp.load(path)
    assert "damaged" in str(info.value) and "_use_new_zipfile_serialization" not in str(info.value)
    assert "()" not in str(info.value)


def test_a_directory_is_not_called_missing(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        lightning_nvcomp.load(tmp_path)
    assert cli.main(["verify", str(tmp_path), "-q"]) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_wrong_map_location_is_not_called_damage(tmp_path):
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save({"w": torch.ones(10)}, path, codec="zstd")
    with pytest.raises(Exception) as info:
        lightning_nvcomp.load(path, map_location="cuda")
    assert not isinstance(info.value, CorruptCheckpointError), info.value
    assert str(path) in str(info.value)


def test_out_of_memory_is_not_called_damage(tmp_path):
    """A load that runs out of memory (a real limit on the child's address space) fails as that, and verify
    exits 2 for it, not 1."""
    path = tmp_path / "big.pt"
    lightning_nvcomp.save({"w": trained_like(64 << 20, torch.float32)}, path, codec="zstd")  # 256 MB raw
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to size the limit")
    code = """
        import resource, sys
        import torch, lightning_nvcomp
        from lightning_nvcomp import cli
        from lightning_nvcomp.errors import CorruptCheckpointError
        from lightning_nvcomp.codec.checksum import crc32
        crc32(torch.zeros(1 << 20, dtype=torch.uint8))  # start the checksum threads before the limit
        vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (128 << 20), vm + (128 << 20)))  # less than the 256 MB decode
        try:
            lightning_nvcomp.load(sys.argv[1])
        except CorruptCheckpointError as err:
            print("CORRUPT", err)
        except BaseException as err:
            print("OTHER", type(err).__name__, sys.argv[1] in str(err))
        else:
            print("LOADED")
        print("VERIFY", cli.main(["verify", sys.argv[1], "-q"]))
    """
    proc = python_child(code, str(path), env={"LIGHTNING_NVCOMP_THREADS": "1", "OMP_NUM_THREADS": "1"})
    out = proc.stdout
    if "LOADED" in out:
        pytest.skip(f"the load fit in the address-space limit here: {out}")
    assert "CORRUPT" not in out and "OTHER" in out, (out, proc.stderr[-2000:])
    assert "VERIFY 2" in out, out


def test_urls_go_to_remote_storage_and_write_nothing_locally(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = "memory://lnv-reliability/run/ck.pt"
    lightning_nvcomp.save({"w": torch.ones(2)}, url, codec="zstd")
    assert torch.equal(lightning_nvcomp.load(url)["w"], torch.ones(2))
    with pytest.raises(FileNotFoundError, match="memory://lnv-reliability/missing.pt"):
        lightning_nvcomp.load("memory://lnv-reliability/missing.pt")
    assert os.listdir(tmp_path) == []
    assert cli.main(["verify", url, "-q"]) == 0
    assert cli.main(["verify", "memory://lnv-reliability/missing.pt", "-q"]) == 1


def test_convert_refuses_damaged_input_and_writes_nothing(tmp_path):
    src, out = tmp_path / "none.pt", tmp_path / "out.pt"
    lightning_nvcomp.save({"w": torch.arange(5000.0)}, src, codec="none")
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor's bytes
    src.write_bytes(bytes(data))
    assert cli.main(["verify", str(src), "-q"]) == 1
    for codec in ("zstd", "none", "torch"):
        assert cli.main(["convert", str(src), str(out), "--codec", codec, "-q"]) == 1
        assert not out.exists()
