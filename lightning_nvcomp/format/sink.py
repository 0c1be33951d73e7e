"""Where a save's coded pieces go, one by one as the coder yields them: kept in host memory for a snapshot that is
written later (:class:`MemorySink`, async saves), or written into the archive while the next piece is coded
(:class:`ArchiveSink`, sync saves). Segment ``key`` becomes the archive entry ``data/<key>``, as ``torch.save``
names storages.

:class:`DiskThread` is the writer loop under both a single-file save and a DCP data file: one thread that runs the
writes in the order they were queued, while the caller codes the next pieces.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol, TypeVar

from lightning_nvcomp.codec.record import Segment
from lightning_nvcomp.format.zip import ArchiveWriter

T = TypeVar("T")


class SegmentSink(Protocol):
    """Takes each coded segment, in order, as soon as it is in host memory."""

    def put(self, key: str, segment: Segment) -> None: ...


class DiskThread:
    """Runs writes on a thread of its own, one after another in the order they are queued (:meth:`put`), while the
    caller codes what comes next.

    A context manager: leaving it waits for every write, and raises the first that failed (unless an error is
    already on its way out).
    """

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-write")
        self._writes: list[Future] = []

    def put(self, write: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``write(*args)``; its future (its result, or its error)."""
        future = self._thread.submit(write, *args)
        self._writes.append(future)
        return future

    def __enter__(self) -> DiskThread:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self._thread.shutdown(wait=True)
        if error is None:
            for write in self._writes:
                write.result()


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

    def take(self) -> dict[str, Segment]:
        """The segments kept so far, by key, let go of here."""
        segments, self._segments = self._segments, []
        return dict(segments)

    def write_to(self, writer: ArchiveWriter) -> None:
        """Write the segments kept so far, then let them go."""
        segments, self._segments = self._segments, []
        for key, segment in segments:
            _add(writer, key, segment)


class ArchiveSink:
    """Writes each segment into ``writer`` on a :class:`DiskThread`, in order, while the caller codes the next one.

    A context manager, as the disk thread: leaving it waits for every write and raises the first that failed.

    Args:
        writer: the archive the segments go into; nothing else may write to it until the sink is left.
    """

    def __init__(self, writer: ArchiveWriter) -> None:
        self._writer, self._disk = writer, DiskThread()

    def put(self, key: str, segment: Segment) -> None:
        # The disk thread waits for the segment's CRC-32 (on CPU threads), so the coder never does.
        self._disk.put(_add, self._writer, key, segment)

    def __enter__(self) -> ArchiveSink:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self._disk.__exit__(kind, error, trace)
