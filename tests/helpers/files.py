"""The files a save leaves: its temporary files, and where each zip member's bytes are in a torch.save file."""

from __future__ import annotations

import os
from pathlib import Path


def temp_files(directory: Path, name: str) -> list[str]:
    """The save temp files (``.NAME.*.tmp``) for ``name`` in ``directory``."""
    return sorted(n for n in os.listdir(directory) if n.startswith(f".{name}.") and n.endswith(".tmp"))


def zip_entries(path: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """Each zip member of a torch.save file -> (offset of its stored bytes in the file, stored size)."""
    import struct
    import zipfile

    raw = Path(path).read_bytes()
    out = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            off = info.header_offset
            assert raw[off : off + 4] == b"PK\x03\x04", "not a local file header"
            name_len, extra_len = struct.unpack("<HH", raw[off + 26 : off + 30])
            out[info.filename] = (off + 30 + name_len + extra_len, info.compress_size)
    return out


def tensor_data_entries(path: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """The zip members holding storages (``.../data/N``), which is where compressed blobs live."""
    return {n: v for n, v in zip_entries(path).items() if "/data/" in n and not n.endswith("serialization_id")}
