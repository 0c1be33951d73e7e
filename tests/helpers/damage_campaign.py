"""The damage campaign of tests/safety/test_damage_campaign.py: file regions, sampled damage, loaders and outcomes.

A checkpoint file is cut into regions by parsing its zip (local headers, ``data.pkl``, each ``data/N``, the small
metadata entries, the central directory, the end records, and whatever lies between: torch.save's data
descriptors). Damage is sampled per region with a fixed seed: single-bit flips, zeroed ranges of 1-64 bytes and
truncations; on top, flips in the pickle's numbers and bools (region ``data.pkl values``: shapes, strides, offsets,
storage indexes, record sizes), which uniform sampling over the pickle would rarely meet. Each damaged copy goes
through three loaders, and each load gets one outcome:

* ``error``: an exception (its type is recorded; for verify, exit status 1);
* ``equal``: the object returned is bit-identical to the one saved (the damage hit padding or unused bytes);
* ``silent-tensor``: it returned, and some tensor differs in bytes, dtype, shape, stride, storage offset or
  storage sharing;
* ``silent-other``: it returned, the tensors are right, something else differs (a non-tensor value, a key, the
  tree's structure, Parameter-ness or ``requires_grad``).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickletools
import random
import struct
import warnings
import zipfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

import lightning_nvcomp
import lightning_nvcomp.cli
from lightning_nvcomp.errors import CheckpointError

from tests.helpers.states import random_tensor, tensor_bytes, trained_like

#: The three file types of the campaign: what writes them.
FILE_KINDS = ("none", "zstd", "torch.save")
LOADERS = ("lightning_nvcomp.load", "torch.load", "verify")
SEED = 20240612

EQUAL, ERROR, SILENT_TENSOR, SILENT_OTHER = "equal", "error", "silent-tensor", "silent-other"


# ------------------------------------------------------------------------------------------------- the state


def campaign_state() -> dict:
    """Small tensors of several dtypes, a view sharing a storage, a parameter, a 0-d tensor, plain values."""
    w = trained_like(24 * 40, torch.bfloat16, seed=3).reshape(24, 40)
    x = random_tensor((64,), torch.float32, seed=4)  # random bits: NaN payloads, infinities, denormals
    return {
        "model": {
            "w": torch.nn.Parameter(w),
            "w_t": w.t(),  # non-contiguous view of the parameter's storage
            "x": x,
            "x_every5": x[3::5],  # offset and stride into x's storage
            "ids": torch.arange(32, dtype=torch.int64) * 7 - 50,
            "mask": random_tensor((50,), torch.bool, seed=5),
            "step": torch.tensor(12.5),  # 0-d
        },
        "epoch": 3,
        "name": "run-7",
        "optim": {"lr": 1e-3, "betas": (0.9, 0.999), "sched": {"step": 5, "kind": "cosine", "milestones": [10, 20]}},
    }


def write_file(kind: str, state: object, path: Path) -> Path:
    if kind == "torch.save":
        torch.save(state, path)
    else:
        lightning_nvcomp.save(state, path, codec=kind)
    return path


# ------------------------------------------------------------------------------------------------ regions


@dataclass
class Region:
    name: str
    ranges: list[tuple[int, int]] = field(default_factory=list)  # [start, end) byte ranges in the file

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def offset(self, i: int) -> int:
        """The file offset of the region's ``i``-th byte."""
        for a, b in self.ranges:
            if i < b - a:
                return a + i
            i -= b - a
        raise IndexError(i)


def _end_records(raw: bytes) -> tuple[int, int, int]:
    """(start of the end records, central directory offset, central directory size), from the end record(s)."""
    eocd = raw.rfind(b"PK\x05\x06", max(0, len(raw) - 22 - 65535))
    assert eocd >= 0, "no end of central directory record"
    cd_size, cd_offset = struct.unpack("<II", raw[eocd + 12 : eocd + 20])
    start = eocd
    locator = eocd - 20
    if locator >= 0 and raw[locator : locator + 4] == b"PK\x06\x07":
        (z64,) = struct.unpack("<Q", raw[locator + 8 : locator + 16])
        assert raw[z64 : z64 + 4] == b"PK\x06\x06", "zip64 locator does not point at a zip64 end record"
        start = z64
        if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:
            cd_size, cd_offset = struct.unpack("<QQ", raw[z64 + 40 : z64 + 56])
    return start, cd_offset, cd_size


def file_regions(path: Path) -> list[Region]:
    """Every byte of the zip ``path`` in exactly one region (checked), in this order: local headers, data.pkl,
    each data/N, the metadata entries, the central directory, the end records, then the rest (descriptors)."""
    raw = path.read_bytes()
    headers = Region("local headers")
    pickle_region = Region("data.pkl")
    data: dict[str, Region] = {}
    meta = Region("metadata entries")
    with zipfile.ZipFile(path) as z:
        infos = sorted(z.infolist(), key=lambda i: i.header_offset)
    for info in infos:
        off = info.header_offset
        assert raw[off : off + 4] == b"PK\x03\x04", f"{info.filename}: not a local file header"
        name_len, extra_len = struct.unpack("<HH", raw[off + 26 : off + 30])
        start = off + 30 + name_len + extra_len
        headers.ranges.append((off, start))
        entry = (start, start + info.compress_size)
        member = info.filename.split("/", 1)[1]
        if member == "data.pkl":
            pickle_region.ranges.append(entry)
        elif member.startswith("data/"):
            data[member] = Region(member, [entry])
        else:
            meta.ranges.append(entry)
    end_start, cd_offset, cd_size = _end_records(raw)
    regions = [
        headers,
        pickle_region,
        *(data[k] for k in sorted(data, key=lambda k: int(k[5:]))),
        meta,
        Region("central directory", [(cd_offset, cd_offset + cd_size)]),
        Region("end records", [(end_start, len(raw))]),
    ]
    owner = [None] * len(raw)
    for region in regions:
        for a, b in region.ranges:
            for i in range(a, b):
                assert owner[i] is None, f"byte {i} in {owner[i]} and {region.name}"
                owner[i] = region.name
    rest = Region("descriptors, gaps")
    for i, who in enumerate(owner):
        if who is None:
            if rest.ranges and rest.ranges[-1][1] == i:
                rest.ranges[-1] = (rest.ranges[-1][0], i + 1)
            else:
                rest.ranges.append((i, i + 1))
    if rest.ranges:
        regions.append(rest)
    for region in regions:
        region.ranges = [(a, b) for a, b in region.ranges if b > a]
    return [r for r in regions if r.size]


# ------------------------------------------------------------------------------------------------- damage


@dataclass(frozen=True)
class Damage:
    region: str
    kind: str  # "flip", "zero", "truncate"
    offset: int  # flip: the byte; zero: the first byte; truncate: the new length
    arg: int = 0  # flip: the bit; zero: how many bytes

    def apply(self, raw: bytes) -> bytes:
        if self.kind == "flip":
            data = bytearray(raw)
            data[self.offset] ^= 1 << self.arg
            return bytes(data)
        if self.kind == "zero":
            end = min(len(raw), self.offset + self.arg)
            return raw[: self.offset] + bytes(end - self.offset) + raw[end:]
        return raw[: self.offset]

    def __str__(self) -> str:
        what = {
            "flip": f"bit {self.arg} of byte {self.offset}",
            "zero": f"{self.arg} bytes at {self.offset}",
            "truncate": f"to {self.offset} bytes",
        }[self.kind]
        return f"{self.region}: {self.kind} {what}"


def _per_region(size: int) -> tuple[int, int, int]:
    """How many (flips, zeroed ranges, truncations) a region of ``size`` bytes gets: more for bigger regions,
    a minimum for the smallest (a 4-byte storage still gets 6 flips)."""
    root = size**0.5
    return max(6, round(0.8 * root)), max(3, round(root / 3)), max(2, round(root / 8))


#: Pickle opcodes whose argument is a number or a bool: shapes, strides, offsets, storage indexes and sizes.
_INT_OPS = {"BININT1": 1, "BININT2": 1, "BININT": 1, "LONG1": 2}  # where the lowest byte of the value is
_BOOL_OPS = ("NEWTRUE", "NEWFALSE")
#: How many flips go to the pickle's numbers and bools, on top of the region's uniform flips.
PICKLE_VALUE_FLIPS = 120


def pickle_value_bits(raw: bytes, region: Region) -> list[list[tuple[int, int]]]:
    """Per number or bool of the pickle, the (file offset, bit) flips that change it: the 8 bits of a number's
    lowest byte (a small change keeps a shape or an offset in bounds), bit 0 of NEWTRUE/NEWFALSE (swaps them)."""
    ((start, end),) = region.ranges
    out = []
    for op, _arg, pos in pickletools.genops(raw[start:end]):
        if op.name in _INT_OPS:
            out.append([(start + pos + _INT_OPS[op.name], bit) for bit in range(8)])
        elif op.name in _BOOL_OPS:
            out.append([(start + pos, 0)])
    return out


def sample_damage(raw: bytes, regions: list[Region], seed: str) -> list[Damage]:
    """The campaign's damage for one file: deterministic for a given ``seed``, layout and content."""
    rng = random.Random(seed)
    cases: list[Damage] = []
    seen: set[tuple[str, int, int]] = set()

    def add(d: Damage) -> bool:
        key = (d.kind, d.offset, d.arg)
        if key in seen:
            return False
        seen.add(key)
        cases.append(d)
        return True

    for n in range(4):  # the shortest truncations: 0-3 bytes
        add(Damage("local headers", "truncate", n))
    for region in regions:
        flips, zeros, cuts = _per_region(region.size)
        for bit_index in rng.sample(range(region.size * 8), min(flips, region.size * 8)):
            add(Damage(region.name, "flip", region.offset(bit_index // 8), bit_index % 8))
        for _ in range(zeros):
            for _attempt in range(20):  # a range that changes something: zeroing zeros is no damage
                start = region.offset(rng.randrange(region.size))
                length = rng.randint(1, 64)
                if any(raw[start : start + length]):
                    break
            add(Damage(region.name, "zero", start, length))
        for _ in range(cuts):
            add(Damage(region.name, "truncate", region.offset(rng.randrange(region.size))))
        if region.name == "data.pkl":
            # uniform flips rarely meet the few bytes that place a tensor: every number and bool of the pickle
            # gets flips, in turns (one flip each, then a second one each...), each of its bits at most once
            values = [rng.sample(bits, len(bits)) for bits in pickle_value_bits(raw, region)]
            rng.shuffle(values)
            chosen = 0
            while chosen < PICKLE_VALUE_FLIPS and any(values):
                for bits in values:
                    if bits and chosen < PICKLE_VALUE_FLIPS:
                        offset, bit = bits.pop()
                        chosen += add(Damage("data.pkl values", "flip", offset, bit))
    return cases


# ---------------------------------------------------------------------------------------------- comparison


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def differences(saved: object, loaded: object) -> tuple[list[str], list[str]]:
    """(tensor differences, other differences) of ``loaded`` against ``saved``, as messages."""
    tensor_diffs: list[str] = []
    other_diffs: list[str] = []
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def walk(a: object, b: object, path: str) -> None:
        if isinstance(a, torch.Tensor):
            if not isinstance(b, torch.Tensor):
                other_diffs.append(f"{path}: {type(b).__name__} instead of a tensor")
                return
            pairs.append((path, a, b))
            if type(a) is not type(b) or a.requires_grad != b.requires_grad:
                other_diffs.append(
                    f"{path}: {type(b).__name__}(requires_grad={b.requires_grad}) instead of "
                    f"{type(a).__name__}(requires_grad={a.requires_grad})"
                )
            try:
                props_a = (a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.layout, a.device)
                props_b = (b.dtype, tuple(b.shape), b.stride(), b.storage_offset(), b.layout, b.device)
                if props_a != props_b:
                    tensor_diffs.append(f"{path}: dtype/shape/stride/offset {props_b[:4]} instead of {props_a[:4]}")
                elif not torch.equal(tensor_bytes(a.detach()), tensor_bytes(b.detach())):
                    tensor_diffs.append(f"{path}: different bytes")
            except Exception as err:  # noqa: BLE001 - a tensor that cannot even be compared is a wrong tensor
                tensor_diffs.append(f"{path}: cannot compare ({type(err).__name__}: {err})")
        elif isinstance(a, Mapping):
            if not isinstance(b, Mapping) or type(a) is not type(b):
                other_diffs.append(f"{path}: {type(b).__name__} instead of {type(a).__name__}")
                if not isinstance(b, Mapping):
                    return
            if list(a.keys()) != list(b.keys()):
                other_diffs.append(f"{path}: keys {list(b.keys())!r:.200} instead of {list(a.keys())!r}")
            for key in a:
                if key in b:
                    walk(a[key], b[key], f"{path}.{key}")
        elif isinstance(a, (list, tuple)):
            if type(a) is not type(b):
                other_diffs.append(f"{path}: {type(b).__name__} instead of {type(a).__name__}")
                if not isinstance(b, (list, tuple)):
                    return
            if len(a) != len(b):
                other_diffs.append(f"{path}: length {len(b)} instead of {len(a)}")
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif type(a) is not type(b) or a != b:
            other_diffs.append(f"{path}: {b!r:.100} instead of {a!r}")

    walk(saved, loaded, "<root>")
    # which tensors share a storage is part of the tensors (tied weights): same partition as saved
    for i, (pa, a, b) in enumerate(pairs):
        for pb, c, d in pairs[i + 1 :]:
            if (_storage_key(a) == _storage_key(c)) != (_storage_key(b) == _storage_key(d)):
                shared = "share" if _storage_key(a) == _storage_key(c) else "do not share"
                tensor_diffs.append(f"{pa} and {pb}: saved they {shared} a storage, loaded not so")
    return tensor_diffs, other_diffs


def classify(saved: object, loaded: object) -> tuple[str, str]:
    """(outcome, first difference) of an object that loaded without error."""
    tensor_diffs, other_diffs = differences(saved, loaded)
    if tensor_diffs:
        return SILENT_TENSOR, tensor_diffs[0]
    if other_diffs:
        return SILENT_OTHER, other_diffs[0]
    return EQUAL, ""


# ---------------------------------------------------------------------------------------------- the loads


@dataclass
class Result:
    """One loader on one damaged copy."""

    outcome: str
    detail: str = ""  # the error type and message, or the first difference
    error_type: str = ""
    clear: bool = True  # lightning_nvcomp.load: a CheckpointError naming the path; verify: exit status 1


def load_with_package(path: Path, saved: object) -> Result:
    try:
        loaded = lightning_nvcomp.load(path)
    except Exception as err:  # noqa: BLE001 - the campaign records every kind of failure
        clear = isinstance(err, CheckpointError) and str(path) in str(err)
        return Result(ERROR, f"{type(err).__name__}: {str(err)[:300]}", type(err).__name__, clear)
    return Result(*classify(saved, loaded))


def load_with_torch(path: Path, saved: object) -> Result:
    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001
        return Result(ERROR, f"{type(err).__name__}: {str(err)[:300]}", type(err).__name__)
    return Result(*classify(saved, loaded))


def run_verify(path: Path) -> tuple[int | None, str]:
    """The CLI's ``verify`` in this process: (exit status or None if it raised, what it printed or raised)."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = lightning_nvcomp.cli.main(["verify", str(path)])
    except Exception as err:  # noqa: BLE001 - main should turn every failure into an exit status
        return None, f"raised {type(err).__name__}: {str(err)[:300]}"
    return rc, out.getvalue()[-300:]


@dataclass
class Case:
    damage: Damage
    package: Result
    torch: Result
    verify_rc: int | None
    verify_out: str

    @property
    def verify(self) -> Result:
        """verify's outcome in the table's terms: exit 1 a clear error, exit 0 inherits what the package's load
        found (equal, or silent when the load was not equal), anything else an unclear error."""
        if self.verify_rc == 1:
            return Result(ERROR, self.verify_out, "exit 1")
        if self.verify_rc == 0:
            if self.package.outcome == ERROR:
                return Result(SILENT_OTHER, "exit 0 but lightning_nvcomp.load fails")
            return Result(self.package.outcome, f"exit 0; load: {self.package.detail}")
        return Result(
            ERROR, self.verify_out, f"exit {self.verify_rc}" if self.verify_rc is not None else "raised", clear=False
        )


def run_case(raw: bytes, damage: Damage, path: Path, saved: object) -> Case:
    """Write the damaged copy to a fresh ``path`` (never over a file a load may still map) and load it 3 ways."""
    path.write_bytes(damage.apply(raw))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            package = load_with_package(path, saved)
            plain = load_with_torch(path, saved)
            rc, out = run_verify(path)
    finally:
        os.unlink(path)  # mapped pages of a load stay valid after unlink
    return Case(damage, package, plain, rc, out)


# ---------------------------------------------------------------------------------------------- the table


def tally(cases: list[Case]) -> dict[str, dict[str, int]]:
    """Per loader: cases, clear errors, other errors, equal, silent tensors, silent other values."""
    rows = {}
    for loader in LOADERS:
        results = [c.package if loader == LOADERS[0] else c.torch if loader == LOADERS[1] else c.verify for c in cases]
        rows[loader] = {
            "cases": len(results),
            "clear errors": sum(r.outcome == ERROR and r.clear for r in results),
            "other errors": sum(r.outcome == ERROR and not r.clear for r in results),
            "equal": sum(r.outcome == EQUAL for r in results),
            "silent: tensors": sum(r.outcome == SILENT_TENSOR for r in results),
            "silent: other values": sum(r.outcome == SILENT_OTHER for r in results),
        }
    return rows


COLUMNS = ("cases", "clear errors", "other errors", "equal", "silent: tensors", "silent: other values")


def table(summaries: dict[str, dict[str, dict[str, int]]]) -> str:
    """A markdown table of ``{file kind: tally(...)}``."""
    lines = ["| file | loader | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    names = {"none": '`save(codec="none")`', "zstd": '`save(codec="zstd")`', "torch.save": "`torch.save`"}
    for kind, rows in summaries.items():
        for loader, row in rows.items():
            cells = " | ".join(str(row[c]) for c in COLUMNS)
            lines.append(f"| {names.get(kind, kind)} | `{loader}` | {cells} |")
    return "\n".join(lines)


def error_types(cases: list[Case]) -> str:
    package = Counter(c.package.error_type for c in cases if c.package.outcome == ERROR)
    plain = Counter(c.torch.error_type for c in cases if c.torch.outcome == ERROR)
    verify = Counter("exit 0" if c.verify_rc == 0 else c.verify.error_type for c in cases)
    return (
        f"lightning_nvcomp.load errors: {dict(package.most_common())}\n"
        f"torch.load errors: {dict(plain.most_common())}\n"
        f"verify: {dict(verify.most_common())}"
    )


def by_region(cases: list[Case]) -> str:
    """Cases and silent results per region and damage kind (where the campaign looked, what it found)."""
    counts: dict[tuple[str, str], Counter] = {}
    for c in cases:
        n = counts.setdefault((c.damage.region, c.damage.kind), Counter())
        n["cases"] += 1
        n["load silent"] += c.package.outcome in (SILENT_TENSOR, SILENT_OTHER)
        n["torch.load silent tensors"] += c.torch.outcome == SILENT_TENSOR
    return "\n".join(
        f"  {region:20s} {kind:9s} " + ", ".join(f"{k} {v}" for k, v in n.items())
        for (region, kind), n in counts.items()
    )
