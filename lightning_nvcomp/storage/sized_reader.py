""":class:`SizedReader`: the position of a read-only, seekable binary file of a known size, for the files this
package reads through something other than the operating system's file (a remote object's byte ranges, one item of a
DCP data file); a subclass reads (``readinto`` from :attr:`SizedReader.position`)."""

from __future__ import annotations

import io


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
