"""The records of an offline W&B run file (``run-*.wandb``): a LevelDB-style log of protobuf records, read here so
that tests check what W&B itself stored."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

BLOCK = 32768  # the log's block size; a record's header is 7 bytes: CRC, length, kind


def wandb_records(run_file: Path, record_type: str) -> list[Any]:
    """The records of ``record_type`` (``"history"``, ``"artifact"``, ...) in ``run_file``, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is not a W&B run file"
    pos, pending, found = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == record_type:
                found.append(getattr(record, record_type))
    return found
