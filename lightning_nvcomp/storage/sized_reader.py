""":class:`SizedReader`: the position of a read-only, seekable binary file of a known size, for the files this
package reads through something other than the operating system's file (a remote object's byte ranges, one item of a
DCP data file); a subclass reads (``readinto`` from :attr:`SizedReader.position`), :class:`Window` from a range of
an open file."""

from __future__ import annotations

import io
from typing import Any


class SizedReader(io.RawIOBase):
    """A read-only, seekable binary file of ``nbytes`` bytes whose ``readinto`` a subclass provides.

    Args:
        nbytes: the file's size (seeking from the end is from there).
        name: what messages call the file.
    """

    def __init__(self, nbytes: int, name: str) -> None:
        super().__init__()
        self._nbytes, self.name = nbytes, name
        #: Where the next read starts.
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self._nbytes}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: negative seek position {base + offset}")
        self.position = base + offset
        return self.position


class Window(SizedReader):
    """Bytes ``offset`` to ``offset + length`` of an open binary file as a seekable file of their own, for
    ``torch.load`` and ``zipfile`` to read an item of a DCP data file in place (DCP's own view of an item seeks from
    its end wrongly).

    Args:
        stream: the open file (seekable). offset, length: the range. name: what messages call it.
    """

    def __init__(self, stream: Any, offset: int, length: int, name: str) -> None:
        super().__init__(length, name)
        self._stream, self._offset = stream, offset

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._nbytes - self.position))
        if not n:
            return 0
        self._stream.seek(self._offset + self.position)
        got = self._stream.readinto(memoryview(buffer).cast("B")[:n]) or 0
        self.position += got
        return got
