"""Delta records (format 4): the transforms undone bit-exactly for any bytes, and a record's ``delta`` field
validated before anything is decoded (it may come from a hostile file)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_nvcomp.codec import delta, layouts, record, schema
from lightning_nvcomp.errors import CorruptCheckpointError
from lightning_nvcomp.format import delta as delta_records

from tests.helpers.states import trained_like


@settings(max_examples=80, deadline=None)
@given(st.binary(min_size=0, max_size=256), st.binary(min_size=0, max_size=256), st.sampled_from([1, 2, 4, 8]))
def test_every_transform_is_undone_for_any_bytes(a: bytes, b: bytes, itemsize: int) -> None:
    n = min(len(a), len(b)) // 8 * 8
    data = torch.frombuffer(bytearray(a[:n]), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
    base = torch.frombuffer(bytearray(b[:n]), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
    for transform in delta.TRANSFORMS:
        out = torch.empty_like(data)
        delta.apply(transform, data, base, itemsize, out)
        delta.undo(transform, out, base, itemsize)
        assert torch.equal(out, data), transform


def test_the_choice_is_measured_not_assumed() -> None:
    w = trained_like(50_000, torch.float32).view(torch.uint8)
    moved = (trained_like(50_000, torch.float32) + 1e-7).view(torch.uint8)
    noise = torch.randint(0, 256, (200_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    other = torch.randint(0, 256, (200_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    choices = delta.choose(
        [(moved, w), (noise, other)], 4, lambda windows: layouts.coded_nbytes(windows, torch.float32, "zstd")
    )
    assert choices[0] in delta.TRANSFORMS and choices[1] is None


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 40)), min_size=1, max_size=12), st.integers(1, 200))
@settings(max_examples=60, deadline=None)
def test_windows_gathered_out_of_ranges_are_the_windows(gaps_and_lengths, span) -> None:
    """How a GPU reads a delta's base windows: runs of them decoded as one range each (none longer than the span,
    but for a window longer on its own), every window's bytes exactly its own."""
    buffer = (torch.arange(5000) * 7919 % 251).to(torch.uint8)
    windows, at = [], 0
    for gap, n in gaps_and_lengths:
        windows.append((at + gap, n))
        at += gap + n
    ranges: list[tuple[int, int]] = []

    def decoded(start: int, length: int) -> torch.Tensor:
        ranges.append((start, length))
        return buffer[start : start + length].clone()

    got = delta_records.gathered_windows(decoded, windows, span)
    assert [g.tolist() for g in got] == [buffer[lo : lo + n].tolist() for lo, n in windows]
    longest = max(n for _, n in windows)
    assert all(length <= max(span, longest) for _, length in ranges) and len(ranges) <= len(windows)
    hull = windows[-1][0] + windows[-1][1] - windows[0][0]
    assert len(ranges) == 1 or hull > span  # one range where they all fit in one


def delta_meta() -> dict:
    blobs, meta = record.encode(trained_like(4096, torch.float32).view(torch.uint8), torch.float32, "zstd")
    meta = copy.deepcopy(meta)
    meta["storages"] = [[0, meta["nbytes"]]]
    meta["delta"] = {
        "transforms": ["xor"],
        "itemsize": 4,
        "base": {"file": "step-1.ckpt", "id": "1" * 40, "blobs": ["0"], "record": dict(meta)},
    }
    meta["format"] = 4
    return schema.seal(meta), [b.numel() for b in blobs]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.update(transforms=["rot13"]), "transforms"),
        (lambda d: d.update(transforms=["xor", "xor"]), "transforms"),
        (lambda d: d.update(itemsize=3), "3-byte"),
        (lambda d: d["base"].update(file="../../etc/passwd"), "not NAME or ../DIR/NAME"),
        (lambda d: d["base"].update(file="/etc/passwd"), "not NAME or ../DIR/NAME"),
        (lambda d: d["base"].update(file="../x/../y"), "not NAME or ../DIR/NAME"),
        (lambda d: d["base"].update(file="dir/name"), "not NAME or ../DIR/NAME"),
        (lambda d: d["base"].update(file="C:evil"), "not NAME or ../DIR/NAME"),
        (lambda d: d["base"].update(file=".."), "not NAME or ../DIR/NAME"),
        (lambda d: d["base"].update(file=7), "not NAME or ../DIR/NAME"),
        (lambda d: d["base"].update(id="12ab"), "base id"),
        (lambda d: d["base"].update(blobs=["0", "x"]), "base blobs"),
        (lambda d: d["base"].update(record=[1, 2]), "no record"),
        (lambda d: d.update(extra=1), "field 'delta'"),
    ],
)
def test_a_damaged_or_hostile_delta_field_is_refused(change, match: str) -> None:
    meta, sizes = delta_meta()
    schema.validate(meta, sizes)
    change(meta["delta"])
    with pytest.raises(CorruptCheckpointError, match=match):
        schema.validate(schema.seal(meta), sizes)


@pytest.mark.parametrize(
    "storages",
    [[[64, 64], [0, 64]], [[0, 128], [64, 64]], [[0, 64], [64, -1]], [[0, 64], [64, True]], [[0, 64], [64]], [7]],
)
def test_a_delta_record_s_storages_must_lie_in_order(storages: list) -> None:
    """A delta is undone a storage at a time, found by offset: overlapping or unordered storages are refused."""
    meta, sizes = delta_meta()
    meta["storages"] = storages
    meta["delta"]["transforms"] = ["xor"] * len(storages)
    with pytest.raises(CorruptCheckpointError, match="overlap or are out of order"):
        schema.validate(schema.seal(meta), sizes)
    meta["storages"] = [[0, 64], [64, 0], [64, 64]]  # in order, an empty one between
    meta["delta"]["transforms"] = ["xor"] * 3
    schema.validate(schema.seal(meta), sizes)


def test_the_format_says_whether_there_is_a_delta() -> None:
    meta, sizes = delta_meta()
    meta["format"] = 3
    with pytest.raises(CorruptCheckpointError, match="format 3 record with a delta"):
        schema.validate(schema.seal(meta), sizes)
    meta["format"] = 4
    del meta["delta"]
    with pytest.raises(CorruptCheckpointError, match="format 4 record without a delta"):
        schema.validate(schema.seal(meta), sizes)
