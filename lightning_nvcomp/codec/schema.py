"""The record dict: the small dict that says how a record's blobs decode, its check and its validation.

The layout, whole:

* The record's ``nbytes`` raw bytes are cut into segments of ``segment`` bytes (the last may be shorter).
* Each segment is split into ``planes`` byte planes (see :mod:`.planes`; 1 plane = the bytes as they are). With
  ``rotate`` (format 3), the top two planes are the top 16 bits of every number rotated left by one bit: a float's
  exponent whole in the top plane, its sign at the bottom of the plane below.
* Each plane is cut into chunks of ``chunk`` bytes (the last may be shorter).
* Each chunk is stored coded with its plane's codec ``codecs[k]`` (``"ans"``, ``"zstd"`` or ``"raw"``), or raw
  when coding would not make it smaller. ``data_type`` is the type nvCOMP's gANS modelled (``"|u1"``: bytes).
* ``sizes`` lists the stored size of every chunk: segment by segment, plane by plane, chunk by chunk. A stored
  size equal to the chunk's raw size means the chunk is stored raw. Segment ``s`` is stored as blob ``s``: its
  stored chunks in order, each followed by zero bytes up to a multiple of 16 (nvCOMP reads 16-byte aligned chunks).
* ``crc32c[s]`` (format 3; ``crc32[s]`` before: zlib's CRC-32) is the CRC-32C of blob ``s``, checked before anything
  is decoded.
* ``check`` (format 2) is the CRC-32 of every other field, in the canonical form :func:`record_check` gives: a
  damaged field is caught before it is used, by any loader. Format 1 records (v0.1) have none.
* ``delta`` (format 4, and only there) says the decoded bytes are a transform of the record's bytes against the same
  record of an earlier checkpoint, its base (:mod:`.delta`): ``transforms`` (one per storage: ``"xor"``, ``"sub"``
  or ``"none"``), ``itemsize`` (the bytes of one number ``sub`` works on), and ``base``: the base's ``file``
  (``NAME`` in the directory of the file that holds the record, or ``../DIR/NAME`` in a directory beside it), its
  ``id`` (its zip's ``serialization_id``), the ``blobs`` (entry keys) of its record there and that ``record`` dict
  whole. A record without one is written as format 3, which 0.3 reads.

Every field is validated against the blobs before a byte is decoded: the dict may come from a hostile file.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import TypeVar

from lightning_nvcomp.codec.delta import TRANSFORMS
from lightning_nvcomp.errors import CorruptCheckpointError, UnsupportedFormatError

T = TypeVar("T")


FORMAT_VERSION = 4
#: The format of records stored alone (no ``delta``): readers of 0.3 read them.
PLAIN_FORMAT = 3


#: Record formats this version reads: 1 (v0.1, no ``check``), 2 (v0.2: plain byte planes, CRC-32), 3 and 4 (a delta).
READ_FORMATS = (1, 2, 3, 4)


#: Codecs a save can ask for. ``"raw"`` stores bytes as they are (still checksummed).
CODECS = ("ans", "zstd", "raw")


_DATA_TYPES = ("|u1", "<f4", "|f1")


_MAX_NBYTES = 1 << 48


_CHUNK_ALIGN = 16


def _padded(n: int) -> int:
    return -(-n // _CHUNK_ALIGN) * _CHUNK_ALIGN


@dataclass(frozen=True)
class Layout:
    """How a record is coded: byte planes, each plane's codec, gANS's data type, the chunk size, and whether the top
    two planes are rotated (:func:`~lightning_nvcomp.codec.planes.rotate`)."""

    planes: int
    codecs: tuple[str, ...]
    data_type: str
    chunk: int
    rotate: bool = False

    @classmethod
    def of(cls, meta: dict) -> Layout:
        """The layout a record dict (from :func:`encode`) was coded with."""
        return cls(meta["planes"], tuple(meta["codecs"]), meta["data_type"], meta["chunk"], bool(meta.get("rotate")))


def checksum_field(meta: dict) -> str:
    """The field of a record dict that lists its blobs' checksums: ``"crc32c"`` from format 3, ``"crc32"`` before."""
    return "crc32c" if meta.get("format", FORMAT_VERSION) >= 3 else "crc32"


def _segments(nbytes: int, segment: int) -> list[tuple[int, int]]:
    return [(start, min(segment, nbytes - start)) for start in range(0, nbytes, segment)]


#: The canonical JSON form (one encoder for all: ``json.dumps`` with options builds one per call).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_crc(value: object) -> int:
    """CRC-32 of the canonical JSON form of ``value`` (ints, strings, bools, None, lists): what checks cover.

    Raises CorruptCheckpointError for values that have none (a hostile record may hold anything)."""
    try:
        return zlib.crc32(_CANONICAL_JSON.encode(value).encode())
    except (TypeError, ValueError, RecursionError) as err:
        raise CorruptCheckpointError(f"a record field holds a value no checkpoint holds ({err})") from None


#: Record fields that ``check`` covers as packed integers rather than as JSON (they hold one entry per chunk).
_PACKED_FIELDS = ("sizes", "crc32", "crc32c")


def fields_check(meta: dict) -> int:
    """Where a record's ``check`` starts: the CRC-32 of the canonical JSON of every string-keyed field but ``check``,
    ``sizes`` and ``crc32``.

    Raises CorruptCheckpointError for fields no record holds."""
    return canonical_crc(
        {k: v for k, v in meta.items() if isinstance(k, str) and k != "check" and k not in _PACKED_FIELDS}
    )


def record_check(meta: dict, fields_crc: int | None = None) -> int:
    """The ``check`` of a record dict: :func:`fields_check` (``fields_crc`` where the caller knows it), continued over
    ``sizes`` then ``crc32`` then ``crc32c`` (an absent one as empty) as little-endian 64-bit integers.

    Raises CorruptCheckpointError for fields no record holds."""
    crc = fields_check(meta) if fields_crc is None else fields_crc
    for name in _PACKED_FIELDS:
        values = meta.get(name)
        values = values if isinstance(values, list) else []
        try:
            packed = struct.pack(f"<{len(values)}q", *values)
        except struct.error as err:
            raise CorruptCheckpointError(f"record field {name!r} is not a list of integers ({err})") from None
        crc = zlib.crc32(packed, crc)
    return crc


def seal(meta: dict, fields_crc: int | None = None) -> dict:
    """Set the record's ``check`` over its fields (``fields_crc``: their :func:`fields_check`, where known): the
    record is final after this (a change to it must be sealed)."""
    meta["check"] = record_check(meta, fields_crc)
    return meta


def _chunk_lengths(length: int, layout: Layout) -> list[int]:
    per_plane = length // layout.planes
    full, rest = divmod(per_plane, layout.chunk)
    return [layout.chunk] * full + ([rest] if rest else [])


def _field(meta: dict, name: str, kind: type[T]) -> T:
    value = meta.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CorruptCheckpointError(f"record field {name!r} is {value!r}, expected a {kind.__name__}")
    return value


def validate(meta: object, blob_sizes: list[int]) -> Layout:
    """Check every field of a record dict against its blobs' sizes; raise CorruptCheckpointError if any is off."""
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"record description is a {type(meta).__name__}, not a dict")
    version = meta.get("format")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"record format {version} is newer than this lightning_nvcomp reads ({FORMAT_VERSION}): upgrade it"
        )
    if version not in READ_FORMATS or isinstance(version, bool):
        raise CorruptCheckpointError(f"unknown record format {version!r}")
    if version >= 2 and meta.get("check") != record_check(meta):
        raise CorruptCheckpointError("the record's description is damaged (its check does not match its fields)")
    nbytes, planes, chunk, segment = (_field(meta, n, int) for n in ("nbytes", "planes", "chunk", "segment"))
    codecs, sizes, crcs = (_field(meta, n, list) for n in ("codecs", "sizes", checksum_field(meta)))
    data_type = _field(meta, "data_type", str)
    rotate = version >= 3 and meta.get("rotate", False)
    if not isinstance(rotate, bool) or (rotate and planes < 2):
        raise CorruptCheckpointError(f"record field 'rotate' is {rotate!r} for {planes} planes")
    if not 0 <= nbytes < _MAX_NBYTES:
        raise CorruptCheckpointError(f"record size {nbytes} is out of range")
    if planes not in (1, 2, 4, 8) or nbytes % planes:
        raise CorruptCheckpointError(f"record has {planes} planes for {nbytes} bytes")
    if not (0 < chunk <= 1 << 30 and chunk % 64 == 0 and 0 < segment <= 1 << 31 and segment % (64 * planes) == 0):
        raise CorruptCheckpointError(f"record chunk {chunk} / segment {segment} sizes are invalid")
    if len(codecs) != planes or any(c not in CODECS for c in codecs):
        raise CorruptCheckpointError(f"record codecs {codecs!r} do not fit {planes} planes")
    if data_type not in _DATA_TYPES or (data_type != "|u1" and (planes != 1 or codecs != ["ans"])):
        raise CorruptCheckpointError(f"record data type {data_type!r} is invalid here")
    layout = Layout(planes, tuple(codecs), data_type, chunk, rotate)
    segments = _segments(nbytes, segment)
    per_segment = [len(_chunk_lengths(length, layout)) * planes for _, length in segments]
    if len(sizes) != sum(per_segment) or len(crcs) != len(segments) or len(blob_sizes) != len(segments):
        raise CorruptCheckpointError(
            f"record lists {len(sizes)} chunks, {len(crcs)} checksums and {len(blob_sizes)} blobs; its sizes imply "
            f"{sum(per_segment)} chunks in {len(segments)} segments"
        )
    pos = 0
    for s, (_, length) in enumerate(segments):
        lengths = _chunk_lengths(length, layout)
        stored = 0
        for k in range(planes):
            for raw in lengths:
                size = sizes[pos]
                pos += 1
                if (
                    not isinstance(size, int)
                    or isinstance(size, bool)
                    or not 0 < size <= raw
                    or (codecs[k] == "raw" and size != raw)
                ):
                    raise CorruptCheckpointError(f"record chunk {pos - 1} has stored size {size!r} for {raw} bytes")
                stored += _padded(size)
        if stored != blob_sizes[s]:
            raise CorruptCheckpointError(
                f"segment {s}'s chunks add up to {stored} bytes but its blob holds {blob_sizes[s]}"
            )
    if any(not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < 1 << 32 for c in crcs):
        raise CorruptCheckpointError("record checksums are not 32-bit integers")
    return _validate_delta(meta, version, nbytes, layout)


def plain_name(name: str) -> bool:
    """Whether ``name`` names a file or directory in a directory: no separator, drive, NUL, ``.`` or ``..``."""
    return 0 < len(name) <= 255 and name not in (".", "..") and not any(c in name for c in "/\\\0:")


def _in_order(storages: list) -> bool:
    """Whether ``storages`` are ``[offset, nbytes]`` pairs of ints >= 0, each after the one before, none overlapping."""
    end = 0
    for s in storages:
        if (
            not (isinstance(s, list | tuple) and len(s) == 2 and all(type(v) is int and v >= 0 for v in s))
            or s[0] < end
        ):
            return False
        end = s[0] + s[1]
    return True


def _validate_delta(meta: dict, version: int, nbytes: int, layout: Layout) -> Layout:
    """Check a record's ``delta`` field, there from format 4 on and only there (its base record is validated when it
    is decoded); the record's ``layout`` passes through."""
    if (version >= 4) != ("delta" in meta):
        raise CorruptCheckpointError(f"a format {version} record {'without' if version >= 4 else 'with'} a delta")
    if version < 4:
        return layout
    delta = meta["delta"]
    base = delta.get("base") if isinstance(delta, dict) else None
    if not isinstance(delta, dict) or not isinstance(base, dict) or set(delta) != {"transforms", "itemsize", "base"}:
        raise CorruptCheckpointError(f"record field 'delta' is {delta!r}")
    itemsize, chosen = delta["itemsize"], delta["transforms"]
    if itemsize not in (1, 2, 4, 8) or isinstance(itemsize, bool) or nbytes % itemsize:
        raise CorruptCheckpointError(f"record delta of {itemsize!r}-byte numbers over {nbytes} bytes")
    storages = meta.get("storages")
    if (
        not isinstance(chosen, list)
        or any(t not in (*TRANSFORMS, "none") for t in chosen)
        or not isinstance(storages, list)
        or len(chosen) != len(storages)
    ):
        raise CorruptCheckpointError(f"record delta transforms {chosen!r} do not fit its storages")
    if not _in_order(storages):  # a delta is undone a storage at a time, found by its offset
        raise CorruptCheckpointError("record delta's storages overlap or are out of order")
    name, ident, blobs = base.get("file"), base.get("id"), base.get("blobs")
    parts = name.split("/") if isinstance(name, str) else []
    if not (len(parts) == 1 or (len(parts) == 3 and parts[0] == "..")) or not all(map(plain_name, parts[-2:])):
        raise CorruptCheckpointError(f"record delta names its base {name!r}: not NAME or ../DIR/NAME")
    if not (isinstance(ident, str) and 0 < len(ident) <= 64 and ident.isdigit() and ident.isascii()):
        raise CorruptCheckpointError(f"record delta's base id {ident!r} is invalid")
    if not isinstance(blobs, list) or any(not isinstance(b, str) or not b.isdigit() or not b.isascii() for b in blobs):
        raise CorruptCheckpointError(f"record delta's base blobs {blobs!r} are invalid")
    if not isinstance(base.get("record"), dict) or not {"file", "id", "blobs", "record"} <= set(base) <= _BASE_KEYS:
        raise CorruptCheckpointError("record delta's base holds no record")
    span = base.get("range", [0, 0])
    if not (
        isinstance(span, list)
        and len(span) == 2
        and all(type(n) is int and 0 <= n < _MAX_OFFSET for n in span)
        and (span[1] > 0 or "range" not in base)
    ):
        raise CorruptCheckpointError(f"record delta's base range {span!r} is invalid")
    return layout


#: The keys of a delta's ``base``: ``range`` only where the base is an archive inside a file (a DCP item).
_BASE_KEYS = {"file", "id", "blobs", "record", "range"}
#: Offsets beyond this are refused before any arithmetic (no file is that large).
_MAX_OFFSET = 1 << 62
