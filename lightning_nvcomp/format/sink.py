"""Where a save's coded segments go, one by one as the coder yields them: kept in host memory for a snapshot that
is written later (:class:`MemorySink`, async saves), or written into the archive by a disk thread while the next
segment is coded (:class:`ArchiveSink`, sync saves). Segment ``key`` becomes the archive entry ``data/<key>``, as
``torch.save`` names storages."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from lightning_nvcomp.codec.record import Segment
from lightning_nvcomp.format.zip import ArchiveWriter


class SegmentSink(Protocol):
    """Takes each coded segment, in order, as soon as it is in host memory."""

    def put(self, key: str, segment: Segment) -> None: ...


def _add(writer: ArchiveWriter, key: str, segment: Segment) -> None:
    writer.add(f"data/{key}", memoryview(segment.blob.numpy()), segment.checksum())


class MemorySink:
    """Keeps the segments in host memory until :meth:`write_to` puts them in an archive."""

    def __init__(self) -> None:
        self._segments: list[tuple[str, Segment]] = []

    def put(self, key: str, segment: Segment) -> None:
        self._segments.append((key, segment))

    @property
    def nbytes(self) -> int:
        """The bytes of the segments held."""
        return sum(segment.blob.numel() for _, segment in self._segments)

    def write_to(self, writer: ArchiveWriter) -> None:
        """Write the segments kept so far, then let them go."""
        segments, self._segments = self._segments, []
        for key, segment in segments:
            _add(writer, key, segment)


class ArchiveSink:
    """Writes each segment into ``writer`` on a disk thread, in order, while the caller codes the next one.

    A context manager: leaving it waits for every write, and raises the first that failed (unless an error is
    already on its way out).

    Args:
        writer: the archive the segments go into; nothing else may write to it until the sink is left.
    """

    def __init__(self, writer: ArchiveWriter) -> None:
        self._writer = writer
        self._disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-write")
        self._writes: list[Future] = []

    def put(self, key: str, segment: Segment) -> None:
        # The disk thread waits for the segment's CRC-32 (on CPU threads), so the coder never does.
        self._writes.append(self._disk.submit(_add, self._writer, key, segment))

    def __enter__(self) -> ArchiveSink:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self._disk.shutdown(wait=True)
        if error is None:
            for write in self._writes:
                write.result()
