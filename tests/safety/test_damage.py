"""Bad input and durability: truncated and bit-flipped files, hostile pickles, failing and interrupted saves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

import lightning_nvcomp
from lightning_nvcomp import decode_tensor
from lightning_nvcomp import format as fileformat
from lightning_nvcomp.codec import record, schema
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.errors import (
    CheckpointError,
    CodecUnavailableError,
    CorruptCheckpointError,
    UnsupportedFormatError,
)

from tests.helpers.files import temp_files, tensor_data_entries, zip_entries
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import child_json, python_child
from tests.helpers.states import assert_bit_exact, assert_tree_bit_exact, tensor_bytes, trained_like

no_gpu = pytest.mark.skipif(gpu_available(), reason="checks the behaviour of a machine without a usable GPU")


def sample_state() -> dict:
    """A small checkpoint: two records' worth of tensors, a view, a parameter, a scalar and plain values."""
    w = trained_like(3000, torch.bfloat16).reshape(30, 100)
    return {
        "w": torch.nn.Parameter(w),
        "w_t": w.t(),
        "big": trained_like(300_000, torch.float32),  # 1.2 MB
        "ints": torch.arange(40, dtype=torch.int64),
        "step": torch.tensor(12.0),
        "epoch": 3,
        "name": "run",
    }


def small_state() -> dict:
    """Like sample_state without the big record: cheap to load hundreds of times."""
    w = trained_like(300, torch.bfloat16).reshape(3, 100)
    return {"w": torch.nn.Parameter(w), "w_t": w.t(), "ints": torch.arange(40), "step": torch.tensor(12.0), "epoch": 3}


@pytest.fixture(scope="module")
def saved_small(tmp_path_factory):
    obj = small_state()
    path = tmp_path_factory.mktemp("damage-small") / "ck.pt"
    lightning_nvcomp.save(obj, path, codec="zstd")
    return path, obj, path.read_bytes()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A valid compressed checkpoint: (path, the object saved, the file's bytes)."""
    obj = sample_state()
    path = tmp_path_factory.mktemp("damage") / "ck.pt"
    lightning_nvcomp.save(obj, path, codec="zstd")
    return path, obj, path.read_bytes()


def write_damaged(directory: Path, data: bytes | bytearray, name: str = "damaged.pt") -> Path:
    path = directory / name
    path.write_bytes(bytes(data))
    return path


def outcome(path: Path, obj: dict) -> str:
    """'error' (CheckpointError naming the path), 'exact' (loads bit-exactly) or a description of what is wrong."""
    try:
        loaded = lightning_nvcomp.load(path)
    except CheckpointError as err:
        return "error" if str(path) in str(err) else f"CheckpointError not naming the path: {err}"
    except Exception as err:  # noqa: BLE001 - anything else is what the tests report
        return f"{type(err).__name__}: {str(err)[:200]}"
    try:
        assert_tree_bit_exact(obj, loaded, check_type=True)
    except AssertionError as err:
        return f"SILENTLY DIFFERENT: {err}"
    return "exact"


# -------------------------------------------------------------------------------------------- truncation


@pytest.mark.parametrize("cut", [0, 1, 30, 0.1, 0.25, 0.5, 0.75, 0.9, -200, -22, -1])
def test_truncated_file_raises_checkpoint_error_naming_the_path(saved, tmp_path, cut):
    path, obj, raw = saved
    n = int(cut * len(raw)) if isinstance(cut, float) else cut % len(raw) if cut < 0 else cut
    damaged = write_damaged(tmp_path, raw[:n])
    with pytest.raises(CheckpointError) as info:
        lightning_nvcomp.load(damaged)
    assert str(damaged) in str(info.value)


def test_truncated_file_never_returns_tensors(saved, tmp_path):
    """Whatever a cut gives, it is an exception: never a (partial) object."""
    path, obj, raw = saved
    for n in range(0, len(raw), max(1, len(raw) // 97)):
        damaged = write_damaged(tmp_path, raw[:n])
        with pytest.raises(Exception):
            lightning_nvcomp.load(damaged)
        with pytest.raises(Exception):
            torch.load(damaged, weights_only=True)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", os.urandom(4096), b"PK\x03\x04" + bytes(100)])
def test_garbage_file_raises_checkpoint_error(tmp_path, content):
    damaged = write_damaged(tmp_path, content)
    for weights_only in (True, False):
        with pytest.raises(CheckpointError, match="damaged.pt"):
            lightning_nvcomp.load(damaged, weights_only=weights_only)


def test_missing_file_raises_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.pt"):
        lightning_nvcomp.load(tmp_path / "nothere.pt")


# ------------------------------------------------------------------------------------------------ bit flips


def test_flip_in_tensor_data_is_always_detected(saved, tmp_path):
    path, obj, raw = saved
    entries = tensor_data_entries(path)
    assert len(entries) >= 2
    checked = 0
    for start, size in entries.values():
        for i, pos in enumerate(
            sorted({start, start + 1, start + size - 1, *range(start, start + size, max(1, size // 16))})
        ):
            data = bytearray(raw)
            data[pos] ^= 0x80 if i % 2 else 0x01
            damaged = write_damaged(tmp_path, data)
            result = outcome(damaged, obj)
            assert result == "error", f"flip at byte {pos}: {result}"
            if i % 4 == 0:
                with pytest.raises(CorruptCheckpointError):  # plain torch.load too, once the package is imported
                    torch.load(damaged, weights_only=True)
            checked += 1
    assert checked > 50


def test_flip_in_zip_metadata_is_an_error_or_harmless(saved_small, tmp_path):
    """Flips outside the pickle and the tensor bytes (zip headers, small members, central directory)."""
    path, obj, raw = saved_small
    members = zip_entries(path)
    pickle_start, pickle_size = next(v for k, v in members.items() if k.endswith("data.pkl"))
    skip = [(pickle_start, pickle_start + pickle_size)] + [(s, s + n) for s, n in tensor_data_entries(path).values()]
    offsets = [i for i in range(len(raw)) if not any(a <= i < b for a, b in skip)]
    tail = offsets[-120:]  # central directory end: every byte
    positions = sorted(set(offsets[::7] + tail))
    bad = {}
    for pos in positions:
        data = bytearray(raw)
        data[pos] ^= 0x01
        result = outcome(write_damaged(tmp_path, data), obj)
        if result not in ("error", "exact"):
            bad[pos] = result
    assert not bad, f"{len(bad)} of {len(positions)} flips: {dict(list(bad.items())[:5])}"


def test_flip_in_pickle_raises_checkpoint_error_or_loads(saved_small, tmp_path):
    """A damaged pickle must surface as CheckpointError naming the file, not as KeyError/IndexError/TypeError."""
    path, obj, raw = saved_small
    start, size = next(v for k, v in zip_entries(path).items() if k.endswith("data.pkl"))
    bad = {}
    for pos in range(start, start + size):
        data = bytearray(raw)
        data[pos] ^= 0x01
        result = outcome(write_damaged(tmp_path, data), obj)
        if result != "error" and result != "exact" and not result.startswith("SILENTLY"):
            bad[pos - start] = result
    assert not bad, f"{len(bad)} of {size} pickle flips escaped as foreign errors: {dict(list(bad.items())[:6])}"


def test_flip_in_pickle_never_silently_changes_tensors(saved_small, tmp_path):
    """Shapes, strides, offsets and requires_grad live in the pickle: load must notice any damage there."""
    path, obj, raw = saved_small
    start, size = next(v for k, v in zip_entries(path).items() if k.endswith("data.pkl"))
    silent = {}
    for pos in range(start, start + size):
        data = bytearray(raw)
        data[pos] ^= 0x01
        result = outcome(write_damaged(tmp_path, data), obj)
        if result.startswith("SILENTLY"):
            silent[pos - start] = result
    assert not silent, f"{len(silent)} flips in data.pkl gave different data: {dict(list(silent.items())[:4])}"


# ----------------------------------------------------------------------------------------- hostile arguments


@pytest.fixture(scope="module")
def good_args():
    """Valid decode_tensor arguments for a 64-element float32 tensor in a one-storage record."""
    data = torch.arange(64, dtype=torch.float32)
    blobs, meta = record.encode(tensor_bytes(data), torch.float32, "zstd")
    meta["storages"] = [[0, 256]]
    meta["device"] = "cpu"
    return data, blobs, schema.seal(meta)


def forged_check(args: dict) -> int:
    """The check an attacker computes for any arguments (the checks guard against damage, not against forgery:
    hostile arguments must be refused by validation too)."""
    try:
        return fileformat.tensor_check(*list(args.values())[1:])
    except Exception:
        return 0


def decode_args(good_args, default_name: str, **kw) -> tuple:
    data, good_blobs, meta = good_args
    args = dict(
        blobs=good_blobs,
        rec=dict(meta),
        index=0,
        offset=0,
        size=(64,),
        stride=(1,),
        requires_grad=False,
        parameter=False,
        name=default_name,
    )
    check = kw.pop("check", None)
    args.update(kw)
    return (*args.values(), forged_check(args) if check is None else check)


def call(good_args, **kw):
    return decode_tensor(*decode_args(good_args, "x", **kw))


def with_meta(good_args, **changes) -> dict:
    """The good record with ``changes``, its own check forged to match."""
    rec = dict(good_args[2])
    rec.update(changes)
    try:
        rec["check"] = schema.record_check(rec)
    except Exception:
        pass
    return rec


def test_good_args_decode(good_args):
    assert_bit_exact(call(good_args), good_args[0])
    assert_bit_exact(call(good_args, size=(8, 4), stride=(4, 2), offset=1), good_args[0][1:].as_strided((8, 4), (4, 2)))


HOSTILE = {
    "negative offset": dict(offset=-1),
    "huge offset": dict(offset=1 << 70),
    "float offset": dict(offset=1.0),
    "bool offset": dict(offset=True),
    "offset past end": dict(offset=60, size=(5,)),
    "absurd offset of an empty view": dict(offset=1 << 50, size=(0,)),
    "stride overrun": dict(size=(8, 8), stride=(9, 1)),
    "size overrun": dict(size=(65,)),
    "huge stride": dict(size=(2,), stride=(1 << 70,)),
    "negative size": dict(size=(-1,)),
    "negative stride": dict(size=(4,), stride=(-1,)),
    "size/stride lengths differ": dict(stride=(1, 1)),
    "too many dims": dict(size=(1,) * 65, stride=(1,) * 65),
    "size not a tuple": dict(size="ab"),
    "size None": dict(size=None),
    "size of floats": dict(size=(64.0,)),
    "size of tensors": dict(size=(torch.tensor(64),)),
    "index negative": dict(index=-1),
    "index out of range": dict(index=1),
    "index huge": dict(index=1 << 70),
    "index string": dict(index="0"),
    "index bool": dict(index=True),
    "requires_grad int": dict(requires_grad=1),
    "parameter None": dict(parameter=None),
    "name not a string": dict(name=5),
    "blobs a tensor": dict(blobs="tensor"),
    "blobs of floats": dict(blobs="float"),
    "blobs 2-D": dict(blobs="2d"),
    "blobs holding None": dict(blobs="none-item"),
    "blobs None": dict(blobs=None),
    "rec a list": dict(rec=[1, 2]),
    "unknown dtype": dict(rec={"dtype": "float128"}),
    "dtype missing": dict(rec={"dtype": None}),
    "storage outside the record": dict(rec={"storages": [[0, 512]]}),
    "storage starts past the record": dict(rec={"storages": [[1 << 40, 4]]}),
    "storage negative": dict(rec={"storages": [[-4, 4]]}),
    "storage table not a list": dict(rec={"storages": "xx"}),
    "storage entry short": dict(rec={"storages": [[0]]}),
    "storage misaligned": dict(rec={"storages": [[2, 8]]}),
    "storage of floats": dict(rec={"storages": [[0.0, 256.0]]}),
    "nbytes huge": dict(rec={"nbytes": 1 << 70, "storages": [[0, 8]]}),
    "nbytes string": dict(rec={"nbytes": "256"}),
    "checksum wrong": dict(rec={"crc32c": "flip"}),
    "codec unknown": dict(rec={"codecs": "lz4"}),
    # reported bugs: these escape as TypeError/RuntimeError instead of CorruptCheckpointError
    "dtype unhashable (list)": dict(rec={"dtype": ["float32"]}),
    "dtype unhashable (dict)": dict(rec={"dtype": {}}),
    "size past int64 with stride 0": dict(size=(1 << 70,), stride=(0,)),
    "numel overflows int64 with stride 0": dict(size=(1 << 62, 1 << 62), stride=(0, 0)),
    "forged decode cache with a storage outside it": dict(
        size=(128,), rec={"storages": [[0, 1024]], "__decoded__": "forge"}
    ),
    "forged decode cache with a negative storage": dict(rec={"storages": [[-8, 512]], "__decoded__": "forge"}),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_decode_tensor_rejects_hostile_arguments(good_args, case):
    _, blobs, meta = good_args
    kw = dict(HOSTILE[case])
    if "rec" in kw and isinstance(kw["rec"], dict):
        changes = dict(kw["rec"])
        if changes.get("crc32c") == "flip":
            changes["crc32c"] = [meta["crc32c"][0] ^ 1]
        if changes.get("codecs") == "lz4":
            changes["codecs"] = ["lz4"] * meta["planes"]
        if changes.get("__decoded__") == "forge":
            changes["__decoded__"] = torch.zeros(meta["nbytes"], dtype=torch.uint8)
        kw["rec"] = with_meta(good_args, **changes)
    if kw.get("blobs") == "tensor":
        kw["blobs"] = blobs[0]
    elif kw.get("blobs") == "float":
        kw["blobs"] = [b.float() for b in blobs]
    elif kw.get("blobs") == "2d":
        kw["blobs"] = [b.view(1, -1) for b in blobs]
    elif kw.get("blobs") == "none-item":
        kw["blobs"] = [None]
    with pytest.raises(CorruptCheckpointError):
        call(good_args, **kw)


def test_newer_record_format_asks_for_an_upgrade(good_args):
    with pytest.raises(UnsupportedFormatError, match="(?i)upgrade"):
        call(good_args, rec=with_meta(good_args, format=schema.FORMAT_VERSION + 1))


class Reduce:
    """Pickles as a call of ``decode_tensor`` with any arguments: what a hostile or foreign file can hold."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return decode_tensor, self.args


def hand_built(path: Path, good_args, **kw) -> Path:
    """torch.save a file whose one tensor is a decode_tensor call with ``kw`` replacing good arguments (and a
    check forged to match them)."""
    torch.save({"evil": Reduce(*decode_args(good_args, "evil", **kw)), "fine": 1}, path)
    return path


def test_hand_built_file_with_good_arguments_loads(good_args, tmp_path):
    path = hand_built(tmp_path / "ok.pt", good_args)
    assert_bit_exact(lightning_nvcomp.load(path)["evil"], good_args[0])
    assert_bit_exact(torch.load(path, weights_only=True)["evil"], good_args[0])


HOSTILE_FILES = {
    "negative offset": dict(offset=-5),
    "stride overrun": dict(size=(64, 64), stride=(64, 1)),
    "index out of range": dict(index=7),
    "storage outside the record": dict(rec="outside"),
    "unknown dtype": dict(rec="dtype"),
    "blobs not uint8": dict(blobs="float"),
    "damaged blob": dict(blobs="flip"),
    "name not a string": dict(name=("a", "b")),
    # reported bug: escapes as TypeError
    "unhashable dtype": dict(rec="unhashable"),
}


@pytest.mark.parametrize("case", list(HOSTILE_FILES))
def test_hand_built_hostile_file_gives_a_clear_error(good_args, tmp_path, case):
    _, blobs, meta = good_args
    kw = dict(HOSTILE_FILES[case])
    rec_kind = kw.pop("rec", None)
    if rec_kind:
        kw["rec"] = {
            "outside": with_meta(good_args, storages=[[0, 1 << 20]]),
            "dtype": with_meta(good_args, dtype="float128"),
            "unhashable": with_meta(good_args, dtype=["float32"]),
        }[rec_kind]
    if kw.get("blobs") == "float":
        kw["blobs"] = [b.float() for b in blobs]
    elif kw.get("blobs") == "flip":
        damaged = [b.clone() for b in blobs]
        damaged[0][damaged[0].numel() // 2] ^= 0x40
        kw["blobs"] = damaged
    path = hand_built(tmp_path / "evil.pt", good_args, **kw)
    with pytest.raises(CorruptCheckpointError) as info:
        lightning_nvcomp.load(path)
    assert str(path) in str(info.value)
    if "name" not in kw:
        assert "'evil'" in str(info.value)  # the tensor at fault
    with pytest.raises(CorruptCheckpointError):
        torch.load(path, weights_only=True)


def test_hand_built_newer_format_asks_for_an_upgrade(good_args, tmp_path):
    path = hand_built(tmp_path / "future.pt", good_args, rec=with_meta(good_args, format=schema.FORMAT_VERSION + 1))
    with pytest.raises(UnsupportedFormatError, match="(?i)upgrade") as info:
        lightning_nvcomp.load(path)
    assert "future.pt" in str(info.value)


@no_gpu
def test_ans_record_on_a_machine_without_gpu(good_args, tmp_path):
    """A record coded with gANS (built by hand: no GPU here to write one) names what is needed and the fix."""
    data, blobs, meta = good_args
    rec = with_meta(good_args, codecs=["ans" if c == "zstd" else c for c in meta["codecs"]], nvcomp="5.0.0")
    assert "ans" in rec["codecs"]
    schema.validate(rec, [b.numel() for b in blobs])  # well-formed: only the codec is missing
    path = hand_built(tmp_path / "ans.pt", good_args, rec=rec)
    for load in (lambda: lightning_nvcomp.load(path), lambda: torch.load(path, weights_only=True)):
        with pytest.raises(CodecUnavailableError) as info:
            load()
        message = str(info.value)
        assert "GPU" in message
        assert "lightning-nvcomp convert" in message and "--codec zstd" in message
    with pytest.raises(CodecUnavailableError, match="ans.pt"):
        lightning_nvcomp.load(path)


# ------------------------------------------------------------------------------------------------- saving


def test_save_into_missing_directory_names_it(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError) as info:
        lightning_nvcomp.save({"x": torch.ones(3)}, missing / "ck.pt", codec="zstd")
    assert str(missing) in str(info.value)
    assert not (tmp_path / "no").exists()


READ_ONLY_CHILD = """
import json, os, sys, tempfile
import torch, lightning_nvcomp
directory, mode, codec = sys.argv[1:4]
# Warm up as we are (lazy imports happen now: the interpreter may live where `nobody` cannot read).
with tempfile.TemporaryDirectory() as warm:
    lightning_nvcomp.save({"x": torch.ones(3)}, os.path.join(warm, "w.pt"), codec=codec)
if mode == "drop":
    try:
        os.setgid(65534)
        os.setuid(65534)
    except OSError as err:
        print(json.dumps({"setup": repr(err)})); sys.exit(0)
target = os.path.join(directory, "ck.pt")
probe_ok = True
try:
    open(os.path.join(directory, ".probe"), "wb").close()
except OSError:
    probe_ok = False
try:
    lightning_nvcomp.save({"x": torch.ones(3)}, target, codec=codec)
except BaseException as err:
    print(json.dumps({"probe_ok": probe_ok, "error": type(err).__name__, "is_oserror": isinstance(err, OSError),
                      "message": str(err)}))
else:
    print(json.dumps({"probe_ok": probe_ok, "error": None}))
"""


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_save_into_read_only_directory_raises_oserror_naming_the_path(codec):
    # As root, chmod does not stop writes: the child drops to `nobody` in a directory only root may write.
    with tempfile.TemporaryDirectory(prefix="lnv-ro-") as tmp:
        directory = Path(tmp) / "ro"
        directory.mkdir()
        os.chmod(tmp, 0o755)
        if os.geteuid() == 0:
            os.chmod(directory, 0o755)
            mode = "drop"
        else:
            os.chmod(directory, 0o555)
            mode = "keep"
        try:
            out = child_json(python_child(READ_ONLY_CHILD, str(directory), mode, codec))
        finally:
            os.chmod(directory, 0o755)
        if "setup" in out:
            pytest.skip(f"the child cannot drop its privileges: {out['setup']}")
        if out["probe_ok"]:
            pytest.skip("this directory is writable for the child despite its permissions")
        assert out["is_oserror"], out
        assert str(directory / "ck.pt") in out["message"], out
        assert os.listdir(directory) == []


FULL_DISK_CHILD = """
import json, os, resource, signal, sys
import torch, lightning_nvcomp
path, codec = sys.argv[1], sys.argv[2]
state = {"noise": torch.randint(0, 256, (4 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing us
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    lightning_nvcomp.save(state, path, codec=codec)
except BaseException as err:
    chain, e = [], err
    while e is not None:
        chain.append([type(e).__name__, getattr(e, "errno", None), str(e)])
        e = e.__cause__ or e.__context__
    print(json.dumps({"error": type(err).__name__, "is_oserror": isinstance(err, OSError), "message": str(err),
                      "chain": chain}))
else:
    print(json.dumps({"error": None}))
"""


@pytest.fixture(scope="module", params=["zstd", "none"])
def full_disk(request, tmp_path_factory):
    """Save 4 MB over a valid checkpoint in a child whose files may not exceed 256 KiB (RLIMIT_FSIZE)."""
    directory = tmp_path_factory.mktemp(f"full-{request.param}")
    path = directory / "ck.pt"
    previous = {"w": trained_like(5000, torch.float32), "step": torch.tensor(7)}
    lightning_nvcomp.save(previous, path, codec="zstd")
    before = path.read_bytes()
    assert len(before) < 256 << 10
    proc = python_child(FULL_DISK_CHILD, str(path), request.param, str(256 << 10))
    return path, previous, before, child_json(proc), proc


def test_full_disk_keeps_the_previous_checkpoint_and_no_temp_file(full_disk):
    path, previous, before, out, proc = full_disk
    assert out["error"] is not None, "the save succeeded despite the file size limit"
    assert path.read_bytes() == before
    assert_tree_bit_exact(previous, lightning_nvcomp.load(path))
    assert temp_files(path.parent, path.name) == [], "a temp file was left behind"
    assert sorted(os.listdir(path.parent)) == ["ck.pt"]


def test_full_disk_raises_oserror_naming_the_path(full_disk):
    path, previous, before, out, proc = full_disk
    assert out["error"] is not None
    assert out["is_oserror"], f"{out['error']}: {out['message']} (chain {out['chain']})"
    assert str(path) in out["message"]


INTERRUPTED_CHILD = """
import sys, torch, lightning_nvcomp
gen = torch.Generator().manual_seed(1)
state = {f"layer{i}": torch.randn(5_000_000, generator=gen) for i in range(10)}  # 200 MB of float32
print("ready", flush=True)
lightning_nvcomp.save(state, sys.argv[1], codec="zstd")
print("done", flush=True)
"""


@pytest.mark.slow
def test_killed_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ck.pt"
    previous = sample_state()
    lightning_nvcomp.save(previous, path, codec="zstd")
    before = path.read_bytes()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(INTERRUPTED_CHILD), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
        env=env,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        deadline = time.monotonic() + 120
        seen = []
        while not seen and proc.poll() is None and time.monotonic() < deadline:
            seen = temp_files(tmp_path, path.name)
            if not seen:
                time.sleep(0.0005)
        assert seen, f"no temp file appeared (child rc {proc.poll()}): {proc.stderr.read() if proc.poll() else ''}"
        time.sleep(0.02)  # let it write some of the file
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the save finished before it was killed (rc {proc.returncode})"
    # the final name still holds the old file, whole; the new data is only in the temp file, never under it
    assert path.read_bytes() == before
    assert_tree_bit_exact(previous, lightning_nvcomp.load(path))
    leftovers = temp_files(tmp_path, path.name)
    assert leftovers, "no temp file left: was the save really interrupted mid-write?"
    assert set(os.listdir(tmp_path)) == {"ck.pt", *leftovers}
    with pytest.raises(CheckpointError):  # the temp file is a partial write: it must not load as a checkpoint
        lightning_nvcomp.load(tmp_path / leftovers[0])
