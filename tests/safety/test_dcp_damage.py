"""Issue 12, item 8: the attacks on DCP checkpoints (lightning_nvcomp.dcp), with real files and real processes.

* A damage campaign: sampled single-bit flips, zeroed 16-byte ranges and truncations over ``.metadata`` and over
  every item of the ``.distcp`` file (zip header, pickle, tensor bytes or compressed segments, small entries, zip
  directory), for codecs ``zstd`` and ``none``, each damaged copy loaded through ``NvcompFileSystemReader`` and DCP's
  default reader. Each load is an ``error``, ``equal`` (bit-identical: the damage hit padding) or ``silent`` (loaded,
  a tensor differs) - ``silent_value`` when only a non-tensor value (``step``...) differs.
* Hostile storage infos (offsets past the end, huge lengths, paths out of the directory, unknown codecs).
* A rank killed (``os._exit(9)``) mid-save into a directory holding a checkpoint: that checkpoint survives.
* Remote paths refused at construction.

Tensors are compared by their bytes, never by value.
"""

from __future__ import annotations

import collections
import hashlib
import io
import os
import pickle
import pickletools
import struct
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata

from lightning_nvcomp.dcp import (
    NvcompFileSystemReader,
    NvcompFileSystemWriter,
    NvcompStorageInfo,
    _checked_metadata,
    _CheckedMetadata,
)
from lightning_nvcomp.errors import CorruptCheckpointError

from tests.helpers import dcp_damage_workers as D
from tests.helpers.states import assert_state_equal, trained_like, zeros_like_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


# -- the damage campaign ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("campaign")
    results, codes = D.spawn("campaign", 1, root, str(root), 1234, timeout=240)
    assert results[0].get("campaign") == "ok", results[0].get("<job>", results[0])
    cases = results[0]["cases"]
    counts = collections.Counter()
    for case in cases:
        kind = "metadata" if case["file"] == ".metadata" else "distcp"
        for reader in ("ours", "default"):
            counts[(case["codec"], kind, reader, case[reader])] += 1
            counts[(case["codec"], kind, reader, "cases")] += 1
    for codec in ("zstd", "none"):
        for kind in ("metadata", "distcp"):
            for reader in ("ours", "default"):
                c = {k[3]: v for k, v in counts.items() if k[:3] == (codec, kind, reader)}
                print(
                    f"DCP damage {codec:4} .{kind:8} {reader:7}: {c['cases']} cases / {c.get('error', 0)} errors / "
                    f"{c.get('equal', 0)} equal / {c.get('silent', 0)} silent / "
                    f"{c.get('silent_value', 0)} silent non-tensor values"
                )
    print(f"DCP damage campaign: {len(cases)} cases, {results[0]['seconds']:.1f} s")
    return cases


def _show(cases: list[dict]) -> str:
    return "\n".join(
        f"{c['codec']} {c['file']} item {c['item']!r} {c['kind']} in {c['region']} at {c['pos']}: ours {c['ours']}, "
        f"default {c['default']}"
        for c in cases[:20]
    )


def _none_payload(case: dict) -> bool:
    """Damage inside the stored bytes of an uncompressed (codec "none") tensor record."""
    return case["codec"] == "none" and case["region"] == "data" and case["file"] != ".metadata"


def test_campaign_covers_every_part(campaign):
    """Both codecs, .metadata and every kind of region of the items, every kind of damage; ~300 cases."""
    assert 150 <= len(campaign) <= 400, len(campaign)
    for codec in ("zstd", "none"):
        regions = {c["region"] for c in campaign if c["codec"] == codec}
        assert {"metadata", "header", "pickle", "data", "small", "directory", "end"} <= regions, regions
        items = {c["item"] for c in campaign if c["codec"] == codec and c["file"] != ".metadata"}
        assert {"w", "m", "h", "idx", "mask", "d", "step", "extra.lr", "extra.name"} <= items, items
    assert {c["kind"] for c in campaign} == {"flip", "zero16", "truncate"}


def test_campaign_our_reader_is_never_silently_wrong(campaign):
    """NvcompFileSystemReader: no damaged copy loads as a wrong tensor or a wrong value (the uncompressed payloads
    of codec "none" are asserted by the next test); every failure names the file and, for damage in an item, that
    item; damage in a data file raises CorruptCheckpointError; damage in .metadata is reported as such (DCP
    re-raises read_metadata's error inside its own AssertionError)."""
    silent = [c for c in campaign if c["ours"] in ("silent", "silent_value") and not _none_payload(c)]
    assert not silent, f"{len(silent)} damaged checkpoints loaded silently wrong through our reader:\n{_show(silent)}"
    for case in campaign:
        if case["ours"] != "error":
            continue
        message = case["ours_msg"]
        if case["file"] == ".metadata":  # (the format version int lies outside the CRC: damaged, or newer)
            assert (
                ".metadata: the checkpoint metadata is damaged" in message
                or ".metadata: the checkpoint metadata has format version" in message
            ), message
        else:
            assert case["ours_type"] == "CorruptCheckpointError", (case["ours_type"], message)
            assert f"{case['file']}: item " in message, message
            if case["kind"] != "truncate":  # a truncation fails the first item read past the cut
                assert f"item {case['item']!r}" in message, message


def test_campaign_codec_none_payload_needs_container_crcs(campaign):
    """Damage inside the bytes of codec "none" records (both readers). Caught since format 2's records
    carry CRCs for uncompressed records too (issue 12 item 1): with the v0.1 format, these load silently wrong. Not weakened: 0 silent is the guarantee."""
    cases = [c for c in campaign if _none_payload(c)]
    assert len(cases) >= 10, len(cases)
    silent = [c for c in cases if c["ours"] != "error" or c["default"] in ("silent", "silent_value")]
    assert not silent, (
        f"{len(silent)} of {len(cases)} damaged codec-'none' payloads were not caught (needs format 2's CRCs "
        f"over uncompressed records, issue 12 item 1):\n{_show(silent)}"
    )


def test_campaign_default_reader_tensors_and_metadata(campaign):
    """DCP's default reader (``dcp.load(state, checkpoint_id=path)``): no wrong tensor for any damage, and every
    damaged .metadata fails (its CRC). What it cannot catch: a damaged non-tensor item (``step``, ``extra.lr``...):
    DCP's planner ``torch.load``s byte items, and torch.load checks no zip CRC - only NvcompFileSystemReader does
    (the previous test)."""
    silent = [c for c in campaign if c["default"] == "silent" and not _none_payload(c)]
    assert not silent, f"{len(silent)} wrong tensors through DCP's default reader:\n{_show(silent)}"
    metadata = [c for c in campaign if c["file"] == ".metadata"]
    assert all(c["default"] == "error" for c in metadata), _show([c for c in metadata if c["default"] != "error"])
    values = [c for c in campaign if c["default"] == "silent_value"]
    tensors = {"w", "m", "h", "idx", "mask", "d"}
    assert all(c["item"] not in tensors and c["file"] != ".metadata" for c in values), (
        "a silently wrong value through the default reader outside the non-tensor items:\n" + _show(values)
    )


# -- the checked .metadata --------------------------------------------------------------------------------------


def _state(seed: int = 0) -> dict:
    return {
        "w": trained_like(64 * 64, torch.bfloat16, seed).reshape(64, 64),
        "m": trained_like(300, torch.float32, seed + 1),
        "idx": torch.arange(37, dtype=torch.int32),
        "step": 12,
    }


def _readers(path: Path):
    yield "ours", lambda target: dcp.load(target, storage_reader=NvcompFileSystemReader(path))
    yield "default", lambda target: dcp.load(target, checkpoint_id=path)


def test_metadata_is_checked_and_read_by_every_reader(tmp_path):
    """.metadata is a pickle of (``_checked_metadata``, (payload, crc, version)): plain ``pickle.load`` (what DCP's
    default reader does) returns the verified Metadata; both readers load bit-exactly; a flip inside the payload is
    a CorruptCheckpointError naming .metadata, for every reader."""
    state = _state(1)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="zstd"))
    raw = (tmp_path / ".metadata").read_bytes()
    assert b"_checked_metadata" in raw and b"lightning_nvcomp.dcp" in raw
    meta = pickle.loads(raw)
    assert isinstance(meta, Metadata)
    assert all(isinstance(i, NvcompStorageInfo) for k, i in meta.storage_data.items() if k.fqn != "step")
    for _, load in _readers(tmp_path):
        target = zeros_like_state(state)
        load(target)
        assert_state_equal(target, state)
    payload = next(
        arg for op, arg, _ in pickletools.genops(raw) if op.name.endswith("BINBYTES8") or op.name.endswith("BINBYTES")
    )  # DCP's own pickle of the Metadata
    assert pickle.loads(payload).storage_data == meta.storage_data
    at = raw.index(payload) + len(payload) // 2
    damaged = bytearray(raw)
    damaged[at] ^= 0x10
    (tmp_path / ".metadata").write_bytes(bytes(damaged))
    with pytest.raises(CorruptCheckpointError, match=r"^\.metadata: the checkpoint metadata is damaged \(CRC-32"):
        pickle.loads(bytes(damaged))
    for name, load in _readers(tmp_path):
        with pytest.raises(BaseException, match="metadata is damaged") as caught:  # DCP: CheckpointException
            load(zeros_like_state(state))
        assert ".metadata" in str(caught.value), (name, caught.value)
    with pytest.raises(CorruptCheckpointError, match="damaged"):
        _checked_metadata(b"x" + payload[1:], _CheckedMetadata(meta).crc)


def test_plain_pickled_metadata_of_earlier_versions_still_loads(tmp_path):
    """A .metadata that is a plain pickle of Metadata (what this package wrote before, and DCP writes) loads through
    both readers; a truncated one is a CorruptCheckpointError naming it through ours."""
    state = _state(2)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path, codec="none"))
    with open(tmp_path / ".metadata", "rb") as f:
        meta = pickle.load(f)
    legacy = pickle.dumps(meta)
    (tmp_path / ".metadata").write_bytes(legacy)
    for _, load in _readers(tmp_path):
        target = zeros_like_state(state)
        load(target)
        assert_state_equal(target, state)
    (tmp_path / ".metadata").write_bytes(legacy[: len(legacy) // 2])
    with pytest.raises(BaseException, match=r"\.metadata: the checkpoint metadata is damaged or truncated"):
        dcp.load(zeros_like_state(state), storage_reader=NvcompFileSystemReader(tmp_path))


# -- hostile storage infos --------------------------------------------------------------------------------------


class _SpyFileSystem(FileSystem):
    """DCP's local FileSystem, recording every path it opens."""

    def __init__(self) -> None:
        self.opened: list[Path] = []

    def create_stream(self, path, mode):
        self.opened.append(Path(path))
        return super().create_stream(path, mode)


def _hostile(data_file: str) -> dict[str, dict]:
    return {
        "offset past the end": dict(offset=10**6),
        "length 2**60": dict(length=2**60),
        "length 2**63": dict(length=2**63),
        "negative offset": dict(offset=-8),
        "offset not an int": dict(offset="0"),
        "length a bool": dict(length=True),
        "relative_path ../../etc/passwd": dict(relative_path="../../etc/passwd"),
        "relative_path ../outside copy": dict(relative_path=f"../outside/{data_file}"),
        "absolute relative_path": dict(relative_path="/etc/passwd"),
        "relative_path with NUL": dict(relative_path=data_file + "\x00x"),
        "unknown codec": dict(codec="lz77"),
        "raw size negative": dict(raw_nbytes=-1),
    }


HOSTILE = list(_hostile("__0_0.distcp"))
EXPECT = {
    "offset past the end": "lies at bytes 1000000..",
    "length 2**60": "but the file has 14",
    "length 2**63": f"has length {2**63}",
    "negative offset": "has offset -8",
    "offset not an int": "has offset '0'",
    "length a bool": "has length True",
    "relative_path ../../etc/passwd": "lies outside the checkpoint directory",
    "relative_path ../outside copy": "lies outside the checkpoint directory",
    "absolute relative_path": "lies outside the checkpoint directory",
    "relative_path with NUL": "is not a file name",
    "unknown codec": "unknown codec 'lz77'",
    "raw size negative": "has raw size -1",
}


@pytest.mark.parametrize("legacy", [False, True], ids=["checked", "plain-pickle"])
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_storage_info_is_refused(tmp_path, case, legacy):
    """A crafted storage info for item 'w' (in a checked .metadata, whose CRC then matches, or a plain pickled one):
    a CorruptCheckpointError naming the item and what is wrong, no crash, nothing opened outside the checkpoint
    directory (a valid copy of the data file sits outside it: it is not read either)."""
    ckpt = tmp_path / "ckpt"
    state = _state(3)
    dcp.save(state, storage_writer=NvcompFileSystemWriter(ckpt, codec="zstd"))
    (tmp_path / "outside").mkdir()
    (data_file,) = (p.name for p in ckpt.glob("*.distcp"))
    (tmp_path / "outside" / data_file).write_bytes((ckpt / data_file).read_bytes())
    with open(ckpt / ".metadata", "rb") as f:
        meta = pickle.load(f)
    key = next(k for k in meta.storage_data if k.fqn == "w")
    for field, value in _hostile(data_file)[case].items():
        setattr(meta.storage_data[key], field, value)
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta if legacy else _CheckedMetadata(meta)))
    reader = NvcompFileSystemReader(ckpt)
    reader.fs = spy = _SpyFileSystem()
    with pytest.raises(BaseException) as caught:  # DCP wraps it in a CheckpointException
        dcp.load(zeros_like_state(state), storage_reader=reader)
    inner = [e for e, _ in getattr(caught.value, "failures", {}).values()] or [caught.value]
    assert isinstance(inner[0], CorruptCheckpointError), repr(inner[0])
    message = str(inner[0])
    assert "item 'w'" in message and EXPECT[case] in message, message
    root = ckpt.resolve()
    assert spy.opened and all(root in p.resolve().parents or p.resolve() == root for p in spy.opened), spy.opened


# -- a rank killed mid-save -------------------------------------------------------------------------------------


def test_rank_killed_mid_save_keeps_previous_checkpoint(tmp_path):
    """2 gloo ranks save checkpoint A, then B into the same directory; rank 1 dies (os._exit(9)) inside write_data
    with its data file half written; rank 0 fails in the collective or hangs and is killed. Then, in fresh
    processes: the directory loads as A bit-exactly through both readers, .metadata is A's byte for byte, no
    temporary .metadata is left; and the next save there succeeds and removes the partial files."""
    ckpt = tmp_path / "ckpt"
    (tmp_path / "kill").mkdir()
    results, codes = D.spawn("kill_mid_save", 2, tmp_path / "kill", str(ckpt), timeout=90)
    assert results[0].get("A") == "ok", results[0]
    assert codes[1] == 9, (codes, results)
    assert results[0].get("B") != "completed" and results[1].get("B") == "started", results
    assert hashlib.sha256((ckpt / ".metadata").read_bytes()).hexdigest() == results[0]["A_metadata"]
    left = sorted(os.listdir(ckpt))
    assert [n for n in left if "metadata" in n] == [".metadata"], left  # no temporary or partial .metadata
    partial = sorted(set(left) - set(results[0]["A_files"]))
    assert partial and all(n.endswith(".distcp") for n in partial), (left, results[0]["A_files"])
    (tmp_path / "load").mkdir()
    results, codes = D.spawn("load_after_kill", 2, tmp_path / "load", str(ckpt), timeout=120)
    for rank, res in enumerate(results):
        for name in ("ours", "default", "C"):
            assert res.get(name) == "ok", f"rank {rank}, {name}: {res.get(name) or res.get('<job>')}"
    assert not set(partial) & set(os.listdir(ckpt)), (partial, os.listdir(ckpt))


# -- URL-like paths ---------------------------------------------------------------------------------------------


def test_a_pathlib_path_made_from_a_url_is_refused(tmp_path, monkeypatch):
    """``Path("s3://b/k")`` (which pathlib collapses to ``s3:/b/k``) is refused at construction and as DCP's
    checkpoint_id, naming it; no local directory appears. (URLs themselves are remote storage:
    tests/integration/test_remote.py.)"""
    monkeypatch.chdir(tmp_path)
    url = Path("s3://b/k")
    for make in (NvcompFileSystemWriter, NvcompFileSystemReader):
        with pytest.raises(ValueError, match="pathlib") as caught:
            make(url)
        assert str(url) in str(caught.value)
    with pytest.raises(ValueError, match="pathlib"):
        dcp.save(_state(), storage_writer=NvcompFileSystemWriter(tmp_path / "local", codec="none"), checkpoint_id=url)
    with pytest.raises(ValueError, match="pathlib"):
        dcp.load(
            zeros_like_state(_state()), storage_reader=NvcompFileSystemReader(tmp_path / "local"), checkpoint_id=url
        )
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)
    NvcompFileSystemWriter("C:/not/a/url", codec="none")  # a Windows drive letter is not a scheme


@pytest.mark.parametrize("where", ["tensor bytes", "pickle"])
def test_our_reader_checks_every_byte_of_a_plain_dcp_checkpoint(tmp_path, where):
    """A checkpoint of DCP's own writer, read through ours: intact, it loads bit-exactly (torch.load reads each item
    in place, its CRC-32 checked over the loaded bytes); one flipped bit in an item's tensor bytes or pickle fails
    the load naming the data file and the item, where DCP's reader would return the wrong tensor or fail bare."""
    state = _state()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path))
    loaded = zeros_like_state(state)
    dcp.load(loaded, storage_reader=NvcompFileSystemReader(tmp_path))
    assert_state_equal(loaded, state)

    reader = dcp.FileSystemReader(tmp_path)
    info = reader.read_metadata().storage_data
    fqn, item = next((k.fqn, v) for k, v in info.items() if k.fqn == "w")
    data_file = tmp_path / item.relative_path
    blob = bytearray(data_file.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(blob[item.offset : item.offset + item.length]))) as archive:
        entry = next(
            i for i in archive.infolist() if i.filename.endswith("/data/0" if where == "tensor bytes" else "data.pkl")
        )
    local = item.offset + entry.header_offset
    name_len, extra_len = struct.unpack("<HH", bytes(blob[local + 26 : local + 30]))
    blob[local + 30 + name_len + extra_len + entry.file_size // 2] ^= 0x10
    data_file.write_bytes(bytes(blob))
    with pytest.raises(BaseException) as caught:  # DCP wraps it in a CheckpointException
        dcp.load(zeros_like_state(state), storage_reader=NvcompFileSystemReader(tmp_path))
    inner = [e for e, _ in getattr(caught.value, "failures", {}).values()] or [caught.value]
    assert isinstance(inner[0], CorruptCheckpointError), repr(inner[0])
    assert str(inner[0]).startswith(f"{item.relative_path}: item '{fqn}': ") and "damaged" in str(inner[0])
