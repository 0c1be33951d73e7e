"""A remote file as the loaders read it: seekable, with large reads cut into ranges fetched in parallel and the
ranges after them fetched ahead, while the decoder works on what arrived (:class:`RangeReader`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lightning_nvcomp.storage.sized_reader import SizedReader

#: Reads smaller than this (zip headers, the central directory, the pickle) fetch a window of their own instead of
#: whole blocks, and start no read-ahead.
SMALL_NBYTES = 256 << 10
#: The window a small read fetches, so that the small reads that follow it (a header, then its name) are served too.
SMALL_WINDOW = 64 << 10
#: Small windows kept (the zip's headers are read twice: by the structure check, then by torch's reader).
SMALL_WINDOWS = 256


class RangeReader(SizedReader):
    """A read-only, seekable binary file over ``fetch(start, end)``, which returns bytes ``start..end`` of a remote
    object (``fsspec``'s ``cat_file``).

    The object is read in blocks of ``block_nbytes``: a large read fetches the blocks it spans in parallel (up to
    ``max_parallel`` at once) and then the ``max_parallel`` blocks after it, which the next read of a sequential
    load (the records of a checkpoint, one after another) finds arriving or arrived. At most about
    ``2 * max_parallel`` blocks are kept beyond those of the read in progress. An object of at most
    ``max_parallel`` blocks is fetched whole, in parallel, at its first read (every later read is served from
    memory); in a larger one, small reads (zip headers, the central directory) fetch small windows, the last
    :data:`SMALL_WINDOWS` of which are kept.

    A read that fails raises the storage's error (a
    :class:`~lightning_nvcomp.storage.remote.errors.RemoteStorageError` naming the URL), and the reader remembers it: what
    reads the file may turn it into another error (``zipfile`` calls a file it cannot read "not a zip file", torch
    an object without ``read``), so leaving a ``with`` block of this reader after a failed read raises that storage
    error, whatever the block raised: a load cut off by the network is never reported as damage. Reads after a
    failed one raise its error at once.

    Args:
        fetch: ``fetch(start, end)`` -> the bytes from ``start`` (inclusive) to ``end`` (exclusive).
        nbytes: the object's size.
        name: the object's URL, for messages.
        block_nbytes: the size of a block.
        max_parallel: blocks fetched at once, and fetched ahead.
    """

    def __init__(
        self, fetch: Callable[[int, int], bytes], nbytes: int, name: str, block_nbytes: int, max_parallel: int
    ) -> None:
        super().__init__(nbytes, name)
        self._fetch = fetch
        self._block, self._ahead = block_nbytes, max_parallel
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="lnv-read")
        self._blocks: OrderedDict[int, Future[bytes]] = OrderedDict()  # block index -> its bytes, least recent first
        self._windows: OrderedDict[int, bytes] = OrderedDict()  # small windows by start, least recent first
        self._nblocks = -(-nbytes // block_nbytes)
        self._whole = self._nblocks <= max_parallel  # small enough to fetch whole at once
        self._failure: BaseException | None = None  # the error of the first read that failed

    def readinto(self, buffer: Any) -> int:
        if self._failure is not None:  # what read the file went on: the bytes it needs cannot be had
            raise self._failure
        try:
            return self._readinto(buffer)
        except Exception as err:
            self._failure = err
            raise

    def _readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start = self.position
        end = min(start + view.nbytes, self._nbytes)
        if end <= start:
            return 0
        if self._whole or end - start >= SMALL_NBYTES or self._held(start, end):
            self._read_blocks(view, start, end)
        else:
            view[: end - start] = self._window(start, end)
        self.position = end
        return end - start

    def _window(self, start: int, end: int) -> bytes:
        """Bytes ``start..end`` from a kept small window, or from a new one fetched from ``start``."""
        for begin, data in reversed(self._windows.items()):
            if begin <= start and end <= begin + len(data):
                self._windows.move_to_end(begin)
                return data[start - begin : end - begin]
        data = self._fetch(start, min(self._nbytes, max(end, start + SMALL_WINDOW)))
        self._windows[start] = data
        while len(self._windows) > SMALL_WINDOWS:
            self._windows.popitem(last=False)
        return data[: end - start]

    def readall(self) -> bytes:
        out = bytearray(max(0, self._nbytes - self.position))
        got = self.readinto(out)
        return bytes(out[:got])

    def _held(self, start: int, end: int) -> bool:
        """Whether the blocks spanning ``start..end`` are all fetched or being fetched."""
        return all(i in self._blocks for i in range(start // self._block, (end - 1) // self._block + 1))

    def _block_bytes(self, index: int) -> Future[bytes]:
        future = self._blocks.get(index)
        if future is None:
            begin = index * self._block
            future = self._blocks[index] = self._pool.submit(self._fetch, begin, min(self._nbytes, begin + self._block))
        self._blocks.move_to_end(index)
        return future

    def _read_blocks(self, view: memoryview, start: int, end: int) -> None:
        first, last = start // self._block, (end - 1) // self._block
        spanned = [self._block_bytes(i) for i in range(first, last + 1)]  # in flight at once
        if self._whole:
            for i in range(self._nblocks):
                self._block_bytes(i)
        elif end - start >= SMALL_NBYTES:
            for i in range(last + 1, min(last + 1 + self._ahead, self._nblocks)):
                self._block_bytes(i)
        done = 0
        for index, future in zip(range(first, last + 1), spanned):
            data = future.result()
            lo = max(start, index * self._block) - index * self._block
            hi = min(end, (index + 1) * self._block) - index * self._block
            if len(data) < hi:
                raise OSError(f"{self.name} is shorter than when it was opened: it was replaced or truncated meanwhile")
            view[done : done + hi - lo] = memoryview(data)[lo:hi]
            done += hi - lo
        while len(self._blocks) > (last - first + 1) + 2 * self._ahead:
            _, oldest = self._blocks.popitem(last=False)
            oldest.cancel()

    def __exit__(self, *exc_info: Any) -> None:
        """Close; then raise the error of a read that failed, if one did (see the class)."""
        super().__exit__(*exc_info)
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        if not self.closed:
            for future in self._blocks.values():
                future.cancel()
            self._blocks.clear()
            self._windows.clear()
            # after a failed read, fetches still retrying (the storage unreachable) are not waited for
            self._pool.shutdown(wait=self._failure is None)
        super().close()
