"""The zip container ``torch.load`` reads, written as a stream: each record goes to the file as soon as it exists.
Every byte of its headers follows from the entries' names, CRC-32s, sizes and offsets (:func:`local_header`,
:func:`central_record`, :func:`end_records`), so a reader can check them all.

``torch.save`` builds the whole pickle first and then writes every storage; a checkpoint save instead wants to write
compressed segments while the GPU is still coding the next ones. The layout matches ``torch.save``'s: entries
``<archive>/data.pkl``, ``<archive>/data/<key>``, ``byteorder``, ``version``..., stored uncompressed, data aligned to
64 bytes (so ``mmap=True`` loads work), zip64 throughout, ``data.pkl`` listed first in the central directory
(torch reads the archive name from the first entry) although its bytes come last.
"""

from __future__ import annotations

import functools
import io
import secrets
import struct
import zlib
from typing import BinaryIO

_ALIGN = 64
_ZIP64 = 0xFFFFFFFF
_VERSION = 45  # zip 4.5: zip64
_DOS_DATE = (1 << 5) | 1  # 1980-01-01


class ArchiveWriter:
    """Writes stored (uncompressed) zip entries to ``f`` one after another, then the central directory.

    Args:
        f: a binary file object, positioned at its start.
        name: the archive's top-level directory (torch.save uses the file's stem; any name loads).
    """

    def __init__(self, f: BinaryIO, name: str = "archive") -> None:
        self._f, self.name = f, name
        self._offset = 0
        self._central: list[tuple[bytes, bytes]] = []  # (full name, central directory record), in write order

    @property
    def nbytes(self) -> int:
        """The bytes written to ``f`` so far."""
        return self._offset

    def add(self, name: str, data: memoryview | bytes, crc: int | None = None) -> None:
        """Append entry ``<archive>/<name>`` holding ``data`` (CRC-32 computed unless given)."""
        data = memoryview(data).cast("B")
        full = f"{self.name}/{name}".encode()
        crc = zlib.crc32(data) if crc is None else crc
        n = data.nbytes
        self._central.append((full, central_record(full, crc, n, self._offset)))
        self._write(local_header(full, crc, n, self._offset))
        self._write(data)

    def finish(self, first: str) -> None:
        """Write the central directory, entry ``first`` (e.g. ``data.pkl``) listed first, and the end records."""
        first_name = f"{self.name}/{first}".encode()
        start = self._offset
        directory = b"".join(
            [record for full, record in self._central if full == first_name]
            + [record for full, record in self._central if full != first_name]
        )
        self._write(directory + end_records(len(self._central), start, start + len(directory)))

    def add_torch_metadata(self, serialization_id: str | None = None) -> None:
        """The small records torch.save writes next to the data (format, alignment, byte order, version, id).

        Args:
            serialization_id: the archive's ``.data/serialization_id`` (40 digits); a fresh random one if not given.
                Given, at the start of the archive, the entries are bytes built once per id and name (the many small
                archives of one DCP data file share an id).
        """
        if serialization_id is not None and self._offset == 0 and not self._central:
            block, central = _torch_metadata(self.name, serialization_id)
            self._write(block)
            self._central.extend(central)
            return
        self._add_torch_entries(serialization_id or str(secrets.randbits(128)).zfill(40))

    def _add_torch_entries(self, serialization_id: str) -> None:
        self.add(".format_version", b"1")
        self.add(".storage_alignment", str(_ALIGN).encode())
        self.add("byteorder", b"little")
        self.add("version", b"3\n")
        self.add(".data/serialization_id", serialization_id.encode())

    def _write(self, data: bytes | memoryview) -> None:  # a memoryview of bytes ("B"): its len is its size
        self._f.write(data)
        self._offset += len(data)


@functools.lru_cache(maxsize=8)
def _torch_metadata(name: str, serialization_id: str) -> tuple[bytes, tuple[tuple[bytes, bytes], ...]]:
    """The bytes :meth:`ArchiveWriter.add_torch_metadata` writes at the start of an archive, and their central
    directory records."""
    buffer = io.BytesIO()
    writer = ArchiveWriter(buffer, name)
    writer._add_torch_entries(serialization_id)
    return buffer.getvalue(), tuple(writer._central)


def local_header(full: bytes, crc: int, size: int, offset: int) -> bytes:
    """The local header of the entry ``full`` (its whole name) of ``size`` bytes at ``offset``: the zip64 sizes,
    then an "FB" field of zeros padding the data to the alignment, as torch.save pads it."""
    pad = -(offset + 30 + len(full) + 24) % _ALIGN
    extra = struct.pack("<HHQQHH", 1, 16, size, size, 0x4246, pad) + bytes(pad)
    header = struct.pack(
        "<IHHHHHIIIHH", 0x04034B50, _VERSION, 0, 0, 0, _DOS_DATE, crc, _ZIP64, _ZIP64, len(full), len(extra)
    )
    return header + full + extra


def end_records(count: int, start: int, end: int) -> bytes:
    """What follows the central directory of ``count`` entries at ``[start, end)``: the zip64 end record, its
    locator and the end record."""
    return (
        struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, _VERSION, _VERSION, 0, 0, count, count, end - start, start)
        + struct.pack("<IIQI", 0x07064B50, 0, end, 1)
        + struct.pack(
            "<IHHHHIIH", 0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF), min(end - start, _ZIP64), _ZIP64, 0
        )
    )


def central_record(full: bytes, crc: int, size: int, offset: int) -> bytes:
    """The central directory record of the entry ``full`` whose local header is at ``offset``."""
    extra = struct.pack("<HHQQQ", 1, 24, size, size, offset)
    central = struct.pack(
        "<IHHHHHHIIIHHHHHII",
        0x02014B50,
        _VERSION,
        _VERSION,
        0,
        0,
        0,
        _DOS_DATE,
        crc,
        _ZIP64,
        _ZIP64,
        len(full),
        len(extra),
        0,
        0,
        0,
        0,
        _ZIP64,
    )
    return central + full + extra
