"""Storage slowed down on purpose: :class:`ThrottledStorage`, a stand-in for slow or shared storage in tests and
benchmarks."""

from __future__ import annotations

import time
from typing import BinaryIO, cast

from lightning_nvcomp.storage.local import Storage


class ThrottledStorage(Storage):
    """Storage whose writes are held to ``bytes_per_s``: a stand-in for slow or shared storage, to test and
    benchmark how the codec choice reacts to bandwidth. Real files, really slowed down.

    Args:
        bytes_per_s: the write rate to hold to (bytes per second: every size in this package is in bytes).
        fsync: as for :class:`Storage`.
    """

    def __init__(self, bytes_per_s: float, fsync: bool = True) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be positive, not {bytes_per_s}")
        super().__init__(fsync)
        self.bytes_per_s = bytes_per_s

    def wrap(self, f: BinaryIO) -> BinaryIO:
        return cast(BinaryIO, _ThrottledFile(f, self.bytes_per_s))


class _ThrottledFile:
    def __init__(self, f: BinaryIO, bytes_per_s: float) -> None:
        self._f, self._rate = f, bytes_per_s
        self._begin, self._written = time.perf_counter(), 0

    def write(self, data) -> int:
        written = self._f.write(data)
        self._written += memoryview(data).nbytes
        ahead = self._written / self._rate - (time.perf_counter() - self._begin)
        if ahead > 0:
            time.sleep(ahead)
        return written

    def __getattr__(self, name: str):
        return getattr(self._f, name)
