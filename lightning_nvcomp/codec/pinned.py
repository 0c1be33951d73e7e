"""Host memory for coded segments copied off a GPU: one bounded pool of pinned slabs per process, reused from save
to save (:func:`pool`).

torch's caching host allocator rounds every request up to a power of two and keeps every block it ever made, so a
run's pinned memory grows with the sizes its saves happen to ask for (3.3 -> 10 GB over the DCP benchmark), and the
first save pays for pinning all of it. Here a blob is cut from a large slab in allocation order; a slab is cut
afresh once every tensor cut from it is gone (its storage freed, views included); the slabs together never exceed
:attr:`PinnedPool.limit` (past it a request gets pageable memory: slower to copy into, never refused); and
:meth:`PinnedPool.reserve` pins the slabs a save will need on a thread of its own while the save is coding.
"""

from __future__ import annotations

import os
import threading
import weakref

import torch

from lightning_nvcomp._process import shared

#: The default size of a slab (a GPU segment's blob fits in one).
SLAB_NBYTES = 512 << 20
#: Every blob starts at a multiple of this many bytes of its slab.
_ALIGN = 64


def _physical_nbytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 16 << 30


class _Slab:
    __slots__ = ("memory", "array", "top", "live", "copied", "earlier")

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.memory = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.array = self.memory.numpy()
        self.top = 0  # where the next blob is cut
        self.live = 0  # blobs cut from it whose storage is not yet freed
        self.copied: torch.cuda.Event | None = None  # the last copy into it since it was cut afresh
        self.earlier: torch.cuda.Event | None = None  # the last copy into it before that

    @property
    def room(self) -> int:
        return self.memory.numel() - self.top


class PinnedPool:
    """Slabs of pinned host memory that device-to-host copies of coded segments are made into.

    Args:
        limit: the most bytes its slabs may hold together (default: a quarter of the machine's memory).
        pin: pin the slabs (default: when CUDA is available); unpinned, the pool still bounds and reuses memory.
        slab_nbytes: the size of a slab; a larger request gets a slab of its own (rounded up to a power of two).
    """

    def __init__(self, limit: int | None = None, pin: bool | None = None, slab_nbytes: int = SLAB_NBYTES) -> None:
        self.limit = _physical_nbytes() // 4 if limit is None else limit
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.slab_nbytes = slab_nbytes
        #: Bytes requested past :attr:`limit` and given pageable memory instead, since the pool was made.
        self.overflow_nbytes = 0
        self._slabs: list[_Slab] = []
        self._open: _Slab | None = None  # the slab blobs are being cut from
        # The slabs' offsets and counts; reentrant, since a blob's release can run inside it (a garbage collection).
        self._lock = threading.RLock()
        self._growing = threading.Lock()  # one slab pinned at a time (by take or by reserve's thread)
        self._reserving: threading.Thread | None = None

    @property
    def nbytes(self) -> int:
        """The bytes its slabs hold (pinned once, kept)."""
        return sum(s.memory.numel() for s in self._slabs)

    @property
    def in_use_nbytes(self) -> int:
        """The bytes of the slabs that blobs are still cut from or alive in."""
        with self._lock:
            return sum(s.memory.numel() for s in self._slabs if s.live or s is self._open)

    def copy(self, src: torch.Tensor, nbytes: int | None = None) -> torch.Tensor:
        """A host uint8 tensor of ``nbytes`` (default ``src.numel()``) holding ``src``'s bytes then zeros, copied from
        the 1-D uint8 ``src`` asynchronously on the current stream when it is on a GPU: record an event after this
        call to know when the copy has landed."""
        n = src.numel()
        nbytes = n if nbytes is None else nbytes
        host, slab = self._take(nbytes)
        host[n:] = 0
        if n:
            host[:n].copy_(src, non_blocking=src.device.type == "cuda" and self.pin)
        if slab is not None and src.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            slab.copied = event  # a slab cut afresh waits for it: a blob dropped early may still be being copied into
        return host

    def empty(self, nbytes: int) -> torch.Tensor:
        """A host uint8 tensor of ``nbytes``, uninitialized (a read buffer). Work the GPU queues on it must be done
        before the tensor is dropped: its room may then be cut afresh at once."""
        return self._take(nbytes)[0]

    def reserve(self, nbytes: int) -> None:
        """Pin slabs on a thread of its own until ``nbytes`` more could be cut without pinning (within the limit):
        called as a save starts, with what it could hold at most, so its copies rarely wait for pinning."""
        if nbytes <= 0:
            return
        with self._lock:
            if self._reserving is not None and self._reserving.is_alive():
                return
            self._reserving = threading.Thread(target=self._grow_to, args=(nbytes,), name="lnv-pin", daemon=True)
            self._reserving.start()

    def _grow_to(self, nbytes: int) -> None:
        while True:
            with self._growing:
                with self._lock:
                    free = sum(s.memory.numel() for s in self._slabs if not s.live)  # the open one too: cut afresh
                    if self._open is not None and self._open.live:
                        free += self._open.room
                    if free >= nbytes or self.nbytes + self.slab_nbytes > self.limit:
                        return
                slab = _Slab(self.slab_nbytes, self.pin)
                with self._lock:
                    self._slabs.append(slab)

    def _take(self, nbytes: int) -> tuple[torch.Tensor, _Slab | None]:
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8), None
        need = -(-nbytes // _ALIGN) * _ALIGN
        with self._lock:
            cut = self._cut_from(need)
        if cut is None:
            with self._growing:  # a slab reserve's thread is pinning may be what this needs: wait for it first
                with self._lock:
                    cut = self._cut_from(need)
                    size = max(self.slab_nbytes, 1 << (need - 1).bit_length())  # what torch's allocator would round to
                    grow = cut is None and self.nbytes + size <= self.limit
                if grow:
                    new = _Slab(size, self.pin)
                    with self._lock:
                        self._slabs.append(new)
                        cut = self._cut_from(need)
        if cut is None:
            with self._lock:
                self.overflow_nbytes += nbytes
            return torch.empty(nbytes, dtype=torch.uint8), None
        slab, offset = cut
        if slab.earlier is not None:  # cut afresh: every copy of the previous round has landed (nearly always)
            slab.earlier.synchronize()
        view = slab.array[offset : offset + nbytes]
        # The tensor's storage keeps `view` alive, and views of the tensor keep the storage: once all are gone,
        # `view` is collected and the blob's room in the slab is free again.
        weakref.finalize(view, self._release, slab)
        return torch.frombuffer(view, dtype=torch.uint8), slab

    def _cut_from(self, need: int) -> tuple[_Slab, int] | None:
        """The slab ``need`` bytes were cut from and where in it (its top moved past them), or None when none has
        room. Called holding the lock."""
        slab = self._open
        # An open slab nothing lives in any more is cut afresh (from its start), not on from its top: else a save
        # the size of the last one finds the pool a slab short and pins one while it runs (round 11, call 7).
        if slab is None or slab.room < need or not slab.live:
            free = [s for s in self._slabs if not s.live and s.memory.numel() >= need]
            if not free:
                return None
            slab = self._open = min(free, key=lambda s: s.memory.numel())
            slab.top = 0
            slab.earlier, slab.copied = slab.copied or slab.earlier, None
        slab.top += need
        slab.live += 1
        return slab, slab.top - need

    def _release(self, slab: _Slab) -> None:
        with self._lock:
            slab.live -= 1


def pool() -> PinnedPool:
    """The process's pool."""
    return shared("pinned-pool", PinnedPool)
