"""The checkpoint file: save/load round trips, torch.load compatibility, describe, SaveStats."""

from __future__ import annotations

import dataclasses
import gc
import io
import os
import pickle
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightning_nvcomp
from lightning_nvcomp import format as fileformat
from lightning_nvcomp.codec import engines, layouts, record
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError
from lightning_nvcomp.format import DTYPES, TensorInfo, describe
from lightning_nvcomp.format import plan as record_plan
from lightning_nvcomp.format import writer as format_writer
from lightning_nvcomp.format.sink import ArchiveSink
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.options import Codec
from lightning_nvcomp.storage import local as storage
from lightning_nvcomp.storage import temp_names
from lightning_nvcomp.telemetry.stats import SaveStats

from tests.helpers.collector import collections_within
from tests.helpers.files import tensor_data_entries
from tests.helpers.processes import CHILD_DIGEST_SRC, child_json, python_child, tensor_digest
from tests.helpers.states import assert_bit_exact, assert_tree_bit_exact, random_tensor, special_floats, trained_like


def _weights_only_loads_bytes() -> bool:
    """Whether torch's ``weights_only`` unpickler loads ``bytes`` values: from torch 2.5 (it allows ``_codecs.encode``,
    which a pickled bytes object calls); torch 2.4 refuses them like any global it does not know."""
    buf = io.BytesIO()
    torch.save({"b": b"\x00\xff"}, buf)
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
    except pickle.UnpicklingError:
        return False
    return True


#: torch 2.5+: bytes values round-trip through weights_only loads (the default of lightning_nvcomp.load)
WEIGHTS_ONLY_BYTES = _weights_only_loads_bytes()
SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
GRAD_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64}


@dataclasses.dataclass
class Holder:
    """A custom object holding tensors (only loadable with weights_only=False)."""

    label: str
    weight: torch.Tensor
    extras: list


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# ------------------------------------------------------------------------------------------ object strategy


@st.composite
def tensor_dicts(draw):
    """A dict of tensors of every dtype and shape, with non-contiguous tensors, views sharing storages,
    parameters, nested containers and plain values. Returns (obj, pairs of keys whose tensors share storage)."""
    obj: dict = {}
    shared: list[tuple[str, str]] = []
    n = draw(st.integers(1, 6))
    for i in range(n):
        dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
        base = random_tensor(shape, dtype, seed=draw(st.integers(0, 2**31)))
        kind = draw(st.sampled_from(["plain", "transposed", "stepped", "views", "param", "grad", "expanded", "nested"]))
        key = f"t{i}"
        if kind == "transposed" and base.dim() >= 2:
            obj[key] = base.transpose(0, -1)
        elif kind == "stepped" and base.dim() >= 1:
            obj[key] = base[1::2] if base.dim() == 1 else base[::2, ..., 1::2]
        elif kind == "views" and base.numel() >= 2:
            flat = base.reshape(-1)
            obj[key], obj[key + "v"] = base, flat[1:]
            shared.append((key, key + "v"))
            if base.dim() >= 2:
                obj[key + "w"] = base.transpose(0, 1)[:, 1:]
                shared.append((key, key + "w"))
        elif kind == "param":
            obj[key] = torch.nn.Parameter(base, requires_grad=dtype in GRAD_DTYPES and draw(st.booleans()))
        elif kind == "grad" and dtype in GRAD_DTYPES:
            obj[key] = base.clone().requires_grad_(True)
        elif kind == "expanded" and base.dim() >= 1:
            obj[key] = base[:1].expand(3, *base.shape[1:]) if base.shape[0] else base
        elif kind == "nested":
            obj[key] = [base, (base.reshape(-1)[:0], {"inner": base.reshape(-1)[::3]}), 7]
        else:
            obj[key] = base
    obj["meta"] = {
        "epoch": draw(st.integers(-5, 10**12)),
        "name": draw(st.text(max_size=8)),
        "none": None,
        "ratio": 0.5,
        "flags": (True, False),
    }
    if WEIGHTS_ONLY_BYTES:  # torch 2.4: see test_bytes_values_where_weights_only_refuses_them
        obj["meta"]["bytes"] = b"\x00\xff"
    return obj, shared


def obj_leaves(obj: object):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from obj_leaves(v)
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, TensorInfo):
        for v in obj:
            yield from obj_leaves(v)
    else:
        yield obj


def check_roundtrip(obj: dict, shared: list, loaded: object) -> None:
    assert_tree_bit_exact(obj, loaded, check_type=True)
    for a, b in shared:
        assert storage_key(loaded[a]) == storage_key(loaded[b]), f"{a} and {b} no longer share their storage"


@SETTINGS
@given(case=tensor_dicts(), codec=st.sampled_from(["zstd", "none"]), small_groups=st.booleans())
def test_roundtrip_hypothesis(case, codec, small_groups):
    obj, shared = case
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        if small_groups:  # many records (storages above 64 bytes alone, groups of <= 256 bytes), many segments
            mp.setattr(record_plan, "_SMALL_NBYTES", 64)
            mp.setattr(record_plan, "_GROUP_NBYTES", 256)
            mp.setattr(engines, "SEGMENT_NBYTES", 1024)
            for key in list(layouts.CHUNK_NBYTES):
                mp.setitem(layouts.CHUNK_NBYTES, key, 128)
        path = Path(tmp) / "ck.pt"
        stats = lightning_nvcomp.save(obj, path, codec=codec)
        assert stats.codec == codec and stats.file_nbytes == path.stat().st_size
        check_roundtrip(obj, shared, lightning_nvcomp.load(path))
        check_roundtrip(obj, shared, torch.load(path, weights_only=True))
        if small_groups and codec == "zstd":  # the small layout really reached the file
            infos = [v for v in obj_leaves(describe(path)) if isinstance(v, TensorInfo)]
            assert all(info.record["segment"] == 1024 for info in infos)


@pytest.mark.parametrize("codec", ["zstd", "none"])
@pytest.mark.parametrize(
    "how",
    ["package", "weights_only", "unsafe", "mmap", "mmap_unsafe", "map_cpu", "map_callable", "map_dict", "map_device"],
)
def test_torch_load_variants(tmp_path, codec, how):
    base = random_tensor((6, 10), torch.float32, 1)
    obj = {
        "w": torch.nn.Parameter(trained_like(4000, torch.bfloat16).reshape(40, 100)),
        "base": base,
        "view": base.t()[2:, ::3],
        "big": trained_like(300_000, torch.float32),  # 1.2 MB
        "big_view": None,
        "scalar": torch.tensor(3, dtype=torch.int64),
        "empty": torch.empty(0, 3, dtype=torch.float16),
        "specials": special_floats(torch.float32),
        "list": [torch.arange(5), (torch.ones(2, dtype=torch.bool),)],
        "step": 17,
    }
    obj["big_view"] = obj["big"][1000:2000:7]
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save(obj, path, codec=codec)
    loaders = {
        "package": lambda: lightning_nvcomp.load(path),
        "weights_only": lambda: torch.load(path, weights_only=True),
        "unsafe": lambda: torch.load(path, weights_only=False),
        "mmap": lambda: torch.load(path, weights_only=True, mmap=True),
        "mmap_unsafe": lambda: lightning_nvcomp.load(path, weights_only=False, mmap=True),
        "map_cpu": lambda: torch.load(path, map_location="cpu", weights_only=True),
        "map_callable": lambda: torch.load(path, map_location=lambda storage, loc: storage, weights_only=True),
        "map_dict": lambda: lightning_nvcomp.load(path, map_location={"cpu": "cpu"}),
        "map_device": lambda: lightning_nvcomp.load(path, map_location=torch.device("cpu")),
    }
    loaded = loaders[how]()
    assert_tree_bit_exact(obj, loaded, check_type=True)
    assert storage_key(loaded["base"]) == storage_key(loaded["view"])
    assert storage_key(loaded["big"]) == storage_key(loaded["big_view"])
    assert type(loaded["w"]) is torch.nn.Parameter and loaded["w"].requires_grad


def test_loaded_views_alias_like_torch_save(tmp_path):
    base = torch.arange(12, dtype=torch.float32)
    obj = {"a": base, "b": base.view(3, 4).t(), "c": base[3:7]}
    lightning_nvcomp.save(obj, tmp_path / "ck.pt", codec="zstd")
    loaded = lightning_nvcomp.load(tmp_path / "ck.pt")
    loaded["a"][4] = -1.0  # a write through one view shows through the others, as after torch.load
    assert loaded["c"][1].item() == -1.0 and loaded["b"][0, 1].item() == -1.0


def test_custom_objects_need_weights_only_false(tmp_path):
    w = trained_like(500, torch.float32).reshape(20, 25)
    obj = {"holder": Holder("layer", w, [w.t(), torch.arange(3)]), "plain": w[::2]}
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save(obj, path, codec="zstd")
    loaded = lightning_nvcomp.load(path, weights_only=False)
    holder = loaded["holder"]
    assert isinstance(holder, Holder) and holder.label == "layer"
    assert_bit_exact(holder.weight, w)
    assert_bit_exact(holder.extras[0], w.t())
    assert_bit_exact(holder.extras[1], torch.arange(3))
    assert_bit_exact(loaded["plain"], w[::2])
    assert storage_key(holder.weight) == storage_key(holder.extras[0]) == storage_key(loaded["plain"])
    with pytest.raises(Exception, match="Holder"):  # weights_only refuses the custom class, naming it
        lightning_nvcomp.load(path, weights_only=True)


def test_plain_torch_save_files_load_through_the_package(tmp_path):
    obj = {"w": random_tensor((7, 3), torch.bfloat16, 4), "n": [1, "two"]}
    torch.save(obj, tmp_path / "plain.pt")
    assert_tree_bit_exact(obj, lightning_nvcomp.load(tmp_path / "plain.pt"))


def test_tensors_the_codec_does_not_handle_are_saved_by_torch(tmp_path):
    c = torch.randn(5, dtype=torch.complex64)
    obj = {
        "sparse": torch.randn(4, 4).relu().to_sparse(),
        "conj": c.conj(),
        "plain": torch.randn(3),
    }
    lightning_nvcomp.save(obj, tmp_path / "ck.pt", codec="zstd")
    loaded = lightning_nvcomp.load(tmp_path / "ck.pt")
    assert loaded["sparse"].is_sparse
    assert_bit_exact(loaded["sparse"].to_dense(), obj["sparse"].to_dense())
    assert loaded["conj"].is_conj()
    assert_bit_exact(loaded["conj"].resolve_conj(), obj["conj"].resolve_conj())
    assert_bit_exact(loaded["plain"], obj["plain"])


def test_same_storage_as_two_dtypes_is_refused_and_writes_nothing(tmp_path):
    t = torch.randn(8)
    path = tmp_path / "ck.pt"
    with pytest.raises(CheckpointError, match="same storage"):
        lightning_nvcomp.save({"f": t, "i": t.view(torch.int32)}, path, codec="zstd")
    assert os.listdir(tmp_path) == []


def test_unknown_codec_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="codec"):
        lightning_nvcomp.save({"x": torch.ones(2)}, tmp_path / "ck.pt", codec="lz4")
    assert os.listdir(tmp_path) == []


def test_overwrite_replaces_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save({"x": torch.ones(3)}, path, codec="zstd")
    new = {"y": random_tensor((100,), torch.float64, 9)}
    lightning_nvcomp.save(new, path, codec="zstd")
    assert_tree_bit_exact(new, lightning_nvcomp.load(path))
    storage.wait_for_discards()  # the old file is freed on a background thread
    assert os.listdir(tmp_path) == ["ck.pt"]


def test_replaced_and_discarded_files_are_freed_and_stale_names_swept(tmp_path):
    path, pruned = tmp_path / "last.ckpt", tmp_path / "epoch=0.ckpt"
    lightning_nvcomp.save({"x": torch.ones(3)}, path, codec="zstd")
    lightning_nvcomp.save({"x": torch.ones(3)}, pruned, codec="zstd")
    old_inode = path.stat().st_ino
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process id that no longer runs: the stale name below is of a process of this host that died
    stale = tmp_path / f".epoch=7.ckpt.lnv-{temp_names.HOST_ID}-{dead.pid}-0123abcd.lnv-old"
    stale.write_bytes(b"old checkpoint")
    storage.discard(pruned)
    assert not pruned.exists()  # the name is gone at once
    lightning_nvcomp.save({"y": torch.zeros(2)}, path, codec="zstd")
    assert path.stat().st_ino != old_inode
    storage.wait_for_discards()
    assert os.listdir(tmp_path) == ["last.ckpt"]
    assert_tree_bit_exact({"y": torch.zeros(2)}, lightning_nvcomp.load(path))


def test_layouts_are_chosen_once_per_record_across_saves(tmp_path, monkeypatch):
    """A run saves the same tensors again and again: the byte layout of each record is chosen (sampled) once."""
    chosen = []
    choose = layouts.choose_layout
    monkeypatch.setattr(record, "choose_layout", lambda *args: chosen.append(args[2]) or choose(*args))
    state = {"w": random_tensor((300_000,), torch.float32, 1), "b": random_tensor((1000,), torch.bfloat16, 2)}
    lightning_nvcomp.save(state, tmp_path / "a.ckpt", codec="zstd")
    first = len(chosen)
    assert first == 2  # one record per dtype
    state["w"].mul_(2)  # training changes values, not the memory the tensors live in
    lightning_nvcomp.save(state, tmp_path / "b.ckpt", codec="zstd")
    assert len(chosen) == first
    assert_tree_bit_exact(state, lightning_nvcomp.load(tmp_path / "b.ckpt"))
    state["w"] = random_tensor((300_001,), torch.float32, 3)  # new memory: a new choice
    lightning_nvcomp.save(state, tmp_path / "c.ckpt", codec="zstd")
    assert len(chosen) == first + 1


class _RecordingSink:
    """A sink that hands each segment to an archive sink and notes its key and a weak reference to its blob."""

    def __init__(self, inner):
        self.inner, self.keys, self.blobs = inner, [], []

    def put(self, key, segment):
        self.keys.append(key)
        self.blobs.append(weakref.ref(segment.blob))
        self.inner.put(key, segment)


def test_segments_go_to_the_sink_in_order_and_are_not_kept(tmp_path):
    """The save is one loop: each coded segment goes into the sink as it is ready (keys in order), the snapshot keeps
    none of their bytes (a sync save never holds the whole compressed checkpoint), and the file equals the one a
    snapshot kept in memory writes."""
    state = {"w": trained_like(300_000, torch.float32), "b": random_tensor((70_000,), torch.bfloat16, 2), "n": 3}
    streamed, kept = tmp_path / "streamed.pt", tmp_path / "kept.pt"
    with open(streamed, "wb") as f:
        writer = ArchiveWriter(f)
        with ArchiveSink(writer) as archive:
            recording = _RecordingSink(archive)
            snap = format_writer.snapshot(state, "zstd", staging_nbytes=64 << 10, sink=recording)
        snap.write_to(writer)
    assert len(recording.keys) > 4 and recording.keys == [str(i) for i in range(len(recording.keys))]
    gc.collect()
    assert all(ref() is None for ref in recording.blobs), "a written segment is still held"
    with open(kept, "wb") as f:
        format_writer.snapshot(state, "zstd", staging_nbytes=64 << 10).write_to(ArchiveWriter(f))
    for path in (streamed, kept):
        assert_tree_bit_exact(state, lightning_nvcomp.load(path))
    assert tensor_data_entries(streamed) == tensor_data_entries(kept)


class _FailingFile(io.BytesIO):
    def write(self, data):
        if self.tell() > 100_000:
            raise OSError(28, "No space left on device")
        return super().write(data)


def test_a_failed_segment_write_is_raised_by_the_sink():
    state = {"w": trained_like(300_000, torch.float32)}
    writer = ArchiveWriter(_FailingFile())
    with pytest.raises(OSError, match="No space left"):
        with ArchiveSink(writer) as sink:
            format_writer.snapshot(state, "none", staging_nbytes=64 << 10, sink=sink)


def test_saved_file_permissions_match_torch_save(tmp_path):
    """A drop-in torch.save writes files with the umask's permissions (0644 by default), not mkstemp's 0600."""
    torch.save({"x": torch.ones(2)}, tmp_path / "plain.pt")
    lightning_nvcomp.save({"x": torch.ones(2)}, tmp_path / "ours.pt", codec="zstd")
    lightning_nvcomp.save({"x": torch.ones(2)}, tmp_path / "none.pt", codec="none")
    want = (tmp_path / "plain.pt").stat().st_mode & 0o777
    assert oct((tmp_path / "ours.pt").stat().st_mode & 0o777) == oct(want)
    assert oct((tmp_path / "none.pt").stat().st_mode & 0o777) == oct(want)


# -------------------------------------------------------------------------------------- real training state


def make_training_state(steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(50, 16),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 4, 32),
        torch.nn.BatchNorm1d(32),  # num_batches_tracked: an int64 0-d tensor
        torch.nn.GELU(),
        torch.nn.Linear(32, 8),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)  # step: a float32 0-d tensor
    gen = torch.Generator().manual_seed(1)

    def step():
        x = torch.randint(0, 50, (16, 4), generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(steps):
        step()
    return model, opt, step


def test_module_and_adamw_state_roundtrip(tmp_path):
    model, opt, _ = make_training_state()
    ckpt = {
        "state_dict": model.state_dict(),
        "optimizer_states": [opt.state_dict()],
        "epoch": 2,
        "global_step": 3,
        "step_tensor": torch.tensor(3),
    }
    steps = [s["step"] for s in opt.state_dict()["state"].values()]
    assert steps and all(isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.dim() == 0 for s in steps)
    assert model.state_dict()["3.num_batches_tracked"].dtype == torch.int64
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save(ckpt, path, codec="zstd")
    for loaded in (lightning_nvcomp.load(path), torch.load(path, weights_only=True, mmap=True)):
        assert_tree_bit_exact(ckpt, loaded, check_type=True)


def test_resumed_training_continues_bit_exactly(tmp_path):
    model, opt, step = make_training_state()
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save({"model": model.state_dict(), "opt": opt.state_dict()}, path, codec="zstd")
    model2, opt2, _ = make_training_state(steps=0)
    loaded = lightning_nvcomp.load(path)
    model2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["opt"])
    gen_state = torch.Generator().manual_seed(5)
    x = torch.randint(0, 50, (16, 4), generator=gen_state)
    for m, o in ((model, opt), (model2, opt2)):
        loss = m(x).pow(2).mean()
        o.zero_grad()
        loss.backward()
        o.step()
    assert_tree_bit_exact(model.state_dict(), model2.state_dict())
    assert_tree_bit_exact(opt.state_dict()["state"], opt2.state_dict()["state"])


# ------------------------------------------------------------------------------------------ child processes


def test_convert_to_torch_writes_a_plain_file_loadable_without_the_package(tmp_path):
    """codec="none" files are checksummed records (they need the package); `convert --codec torch` is the way to a
    file that needs nothing but torch."""
    from lightning_nvcomp import cli

    obj = {"w": trained_like(1000, torch.bfloat16), "i": torch.arange(7), "v": None}
    obj["wv"] = obj["w"][::5]
    ours, path = tmp_path / "none.pt", tmp_path / "plain.pt"
    lightning_nvcomp.save(obj, ours, codec="none")
    assert cli.main(["convert", str(ours), str(path), "--codec", "torch", "-q"]) == 0
    code = (
        CHILD_DIGEST_SRC
        + """
import json, sys
obj = torch.load(sys.argv[1], weights_only=True)
assert "lightning_nvcomp" not in sys.modules, "loading imported lightning_nvcomp"
shared = obj["w"].untyped_storage().data_ptr() == obj["wv"].untyped_storage().data_ptr()
print(json.dumps({"digests": {k: tensor_digest(v) for k, v in obj.items() if v is not None}, "v": obj["v"],
                  "shared": shared}))
"""
    )
    out = child_json(python_child(code, str(path), check=True))
    assert out["digests"] == {k: tensor_digest(v) for k, v in obj.items() if v is not None}
    assert out["v"] is None and out["shared"]
    unchecked = python_child(code, str(ours))
    assert unchecked.returncode != 0 and "lightning_nvcomp.decode_tensor" in unchecked.stderr


LOAD_IN_CHILD = (
    CHILD_DIGEST_SRC
    + """
import json, sys
if sys.argv[2] == "import":
    import lightning_nvcomp
weights_only = sys.argv[3] == "weights_only"
try:
    obj = torch.load(sys.argv[1], weights_only=weights_only)
except Exception as err:
    print(json.dumps({"error": type(err).__name__, "message": str(err)}))
else:
    print(json.dumps({"digests": {k: tensor_digest(v) for k, v in obj.items()}}))
"""
)


@pytest.fixture(scope="module")
def compressed_file(tmp_path_factory):
    obj = {"w": torch.nn.Parameter(trained_like(5000, torch.bfloat16)), "b": random_tensor((3, 3), torch.int8, 2)}
    path = tmp_path_factory.mktemp("child") / "ck.pt"
    lightning_nvcomp.save(obj, path, codec="zstd")
    return path, {k: tensor_digest(v) for k, v in obj.items()}


def test_plain_torch_load_without_import_names_the_package(compressed_file):
    path, _ = compressed_file
    out = child_json(python_child(LOAD_IN_CHILD, str(path), "no-import", "weights_only"))
    assert "error" in out, "torch.load(weights_only=True) decoded without lightning_nvcomp imported?"
    assert "lightning_nvcomp" in out["message"]


def test_plain_torch_load_after_import_works(compressed_file):
    path, digests = compressed_file
    out = child_json(python_child(LOAD_IN_CHILD, str(path), "import", "weights_only"))
    assert out.get("digests") == digests, out


def test_plain_torch_load_weights_only_false_imports_the_decoder_itself(compressed_file):
    path, digests = compressed_file
    out = child_json(python_child(LOAD_IN_CHILD, str(path), "no-import", "unsafe"))
    assert out.get("digests") == digests, out


# ----------------------------------------------------------------------------------------------- describe


def test_describe_names_shapes_and_decodes_nothing(tmp_path):
    w = trained_like(6000, torch.float32).reshape(60, 100)
    obj = {
        "model": {"layer": {"weight": w, "bias": torch.zeros(60, dtype=torch.bfloat16)}},
        "opt": [{"exp_avg": w.t()}],
        "epoch": 4,
    }
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save(obj, path, codec="zstd")
    decoded = []
    with fileformat.decode_progress(decoded.append):
        info = describe(path)
        assert decoded == [], "describe decoded records"
        lightning_nvcomp.load(path)
        assert decoded, "the progress hook never fired, so the check above proves nothing"
    calls = len(decoded)
    lightning_nvcomp.load(path)
    assert len(decoded) == calls, "the hook outlived its block"
    weight = info["model"]["layer"]["weight"]
    assert isinstance(weight, TensorInfo)
    assert weight.name == "model.layer.weight" and weight.dtype == "float32" and weight.shape == (60, 100)
    bias = info["model"]["layer"]["bias"]
    assert bias.name == "model.layer.bias" and bias.dtype == "bfloat16" and bias.shape == (60,)
    assert info["opt"][0]["exp_avg"].name == "opt.0.exp_avg" and info["opt"][0]["exp_avg"].shape == (100, 60)
    assert info["epoch"] == 4
    assert 0 < weight.stored_nbytes < w.numel() * 4
    assert weight.record["dtype"] == "float32"


def test_describe_reads_a_checkpoint_with_damaged_tensor_data(tmp_path):
    obj = {"model": {"w": trained_like(4000, torch.float32)}}
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save(obj, path, codec="zstd")
    ((start, size),) = tensor_data_entries(path).values()
    raw = bytearray(path.read_bytes())
    raw[start + size // 2] ^= 0xFF
    path.write_bytes(raw)
    assert describe(path)["model"]["w"].name == "model.w"  # nothing decoded, so nothing noticed
    with pytest.raises(CheckpointError):
        lightning_nvcomp.load(path)


def test_bytes_values_load_as_torchs_weights_only_allows(tmp_path):
    """A ``bytes`` value loads with ``weights_only=True`` exactly where torch's own ``weights_only`` load takes it
    (torch 2.5+); on torch 2.4, which refuses it, ``load`` says so as a refusal (a ``CheckpointError`` that is not
    damage, naming ``weights_only``) and ``weights_only=False`` loads it. (Asked of torch now, not at import: on
    torch 2.4 each Accelerate ``load_state`` leaves ``_codecs.encode`` among torch's safe globals.)"""
    obj = {"w": trained_like(300, torch.float32), "blob": b"\x00\xff\x80"}
    path = tmp_path / "ck.pt"
    lightning_nvcomp.save(obj, path, codec="zstd")
    assert_tree_bit_exact(obj, lightning_nvcomp.load(path, weights_only=False))
    if _weights_only_loads_bytes():
        assert_tree_bit_exact(obj, lightning_nvcomp.load(path))
        return
    with pytest.raises(CheckpointError, match="weights_only=True does not load") as info:
        lightning_nvcomp.load(path)
    assert not isinstance(info.value, CorruptCheckpointError), info.value


# ------------------------------------------------------------------------------------------------- stats


def test_save_stats(tmp_path):
    w = trained_like(1 << 20, torch.bfloat16)
    obj = {"w": w, "w2": w[10:], "b": torch.zeros(100)}
    path = tmp_path / "ck.pt"
    stats = lightning_nvcomp.save(obj, path, codec="zstd")
    assert isinstance(stats, SaveStats)
    assert stats.path == str(path) and stats.codec == "zstd"
    assert stats.raw_nbytes == w.numel() * 2 + 400  # the shared storage counts once
    assert stats.file_nbytes == path.stat().st_size
    assert stats.ratio == pytest.approx(stats.raw_nbytes / stats.file_nbytes)
    assert stats.ratio > 1.1, stats
    assert 0 < stats.seconds < 60

    plain = lightning_nvcomp.save(obj, tmp_path / "plain.pt", codec="none")
    assert plain.codec == "none" and plain.raw_nbytes == stats.raw_nbytes
    assert plain.file_nbytes == (tmp_path / "plain.pt").stat().st_size > stats.file_nbytes


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("this object does not pickle")


def test_a_save_runs_no_garbage_collection_and_leaves_the_collector_as_it_was(tmp_path):
    """A save (what training waits for) runs with the collector paused, even set to run at every allocation; it is
    on again after the save and after a failed one."""
    obj = {f"layer{i}": {"w": trained_like(4096, torch.float32, i), "b": torch.zeros(8)} for i in range(50)}
    _, collections = collections_within("save_file", lambda: lightning_nvcomp.save(obj, tmp_path / "ck.pt", "zstd"))
    assert collections == [] and gc.isenabled()
    with pytest.raises(RuntimeError, match="does not pickle"):
        lightning_nvcomp.save({"f": _Unpicklable(), **obj}, tmp_path / "bad.pt", codec="zstd")
    assert gc.isenabled() and not (tmp_path / "bad.pt").exists()
    assert_tree_bit_exact(lightning_nvcomp.load(tmp_path / "ck.pt"), obj)


def test_auto_codec_without_gpu_measures_and_never_picks_ans(tmp_path):
    if lightning_nvcomp.codec.gpu_available():
        pytest.skip("this machine has a GPU")
    stats = lightning_nvcomp.save({"x": torch.ones(10)}, tmp_path / "ck.pt")
    assert stats.codec in ("zstd", "none")
    assert stats.prediction is not None and stats.prediction.codec == stats.codec
    assert_bit_exact(lightning_nvcomp.load(tmp_path / "ck.pt")["x"], torch.ones(10))


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_isolated_snapshot_is_unaffected_by_later_training(tmp_path, codec):
    from lightning_nvcomp.format import find_contents
    from lightning_nvcomp.saving.single_file import Held, write_file
    from lightning_nvcomp.storage import Storage

    w = torch.randn(1000)
    state = {"w": w, "view": w[10:20]}
    before = {k: v.clone() for k, v in state.items()}
    held = Held(state, find_contents(state), Codec(codec), None)  # an async save's coding
    w.add_(1.0)  # training goes on before the background write
    write_file(held, str(tmp_path / "ck.pt"), Storage())
    loaded = lightning_nvcomp.load(tmp_path / "ck.pt")
    assert_bit_exact(loaded["w"], before["w"])
    assert_bit_exact(loaded["view"], before["view"])
    assert loaded["view"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr()


def test_resumed_optimizer_state_does_not_hold_or_resave_the_whole_record(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    first = lightning_nvcomp.save(state, tmp_path / "a.ckpt", codec="zstd")
    loaded = lightning_nvcomp.load(tmp_path / "a.ckpt")
    opt.load_state_dict(loaded["optimizer"])
    model.load_state_dict(loaded["model"])
    for moments in opt.state.values():  # each tensor has its own storage, not a slice of a shared record
        assert moments["exp_avg"].untyped_storage().nbytes() == moments["exp_avg"].numel() * 4
    again = lightning_nvcomp.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "b.ckpt", codec="zstd"
    )
    assert again.raw_nbytes == first.raw_nbytes


def test_shared_resources_are_made_once_and_reset_together(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from lightning_nvcomp import _process as resources
    from lightning_nvcomp.codec import checksum

    lightning_nvcomp.save({"w": trained_like(1000, torch.float32)}, tmp_path / "a.pt", codec="zstd")
    pool = checksum._pool()
    assert checksum._pool() is pool and isinstance(pool, ThreadPoolExecutor)
    resources.reset()
    assert pool._shutdown and checksum._pool() is not pool  # a fresh pool after reset; the old one shut down
    lightning_nvcomp.save({"w": trained_like(1000, torch.float32)}, tmp_path / "b.pt", codec="zstd")
    assert_bit_exact(lightning_nvcomp.load(tmp_path / "b.pt")["w"], trained_like(1000, torch.float32))
