"""Host memory for coded segments copied off a GPU: one bounded pool of pinned slabs per process, reused from save
to save (:func:`pool`).

torch's caching host allocator rounds every request up to a power of two and keeps every block it ever made, so a
run's pinned memory grows with the sizes its saves happen to ask for (3.3 -> 10 GB over the DCP benchmark), and the
first save pays for pinning all of it. Here a blob is cut from a large slab in allocation order; a slab is cut
afresh once every tensor cut from it is gone (its storage freed, views included); the slabs together never exceed
:attr:`PinnedPool.limit` (past it a request gets pageable memory: slower to copy into, never refused); and
:meth:`PinnedPool.reserve` pins what a save will need on a thread of its own while the save is coding: one slab the
size of the coded bytes the last save that held its snapshot copied (:meth:`PinnedPool.holding`), so that the pool
holds about what such a save copies into it. Slabs are pinned for exactly their size (``cudaHostRegister``, as
torch.distributed.checkpoint's stager pins), not through torch's allocator.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator

import torch

from lightning_nvcomp._process import shared

#: The default size of a slab pinned while a save copies (a GPU segment's blob fits in one); :meth:`PinnedPool.reserve`
#: pins slabs of the size a save needs.
SLAB_NBYTES = 512 << 20
#: Every blob starts at a multiple of this many bytes of its slab.
_ALIGN = 64
#: Slabs are multiples of this many bytes.
_GRAIN = 2 << 20
#: What :meth:`PinnedPool.reserve` pins beyond the share of a save's bytes the last save copied (its coded bytes vary
#: from save to save); a free slab larger than the need by more than :data:`_SLACK` is replaced by one of the need's
#: size.
_HEADROOM = 1.02
_SLACK = 1.1


def _physical_nbytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 16 << 30


def host_memory(nbytes: int, pin: bool) -> torch.Tensor:
    """``nbytes`` of host memory, page-locked for exactly its size where ``pin`` (registered with CUDA, and
    unregistered when it is freed)."""
    memory = torch.empty(nbytes, dtype=torch.uint8)
    if pin and nbytes:
        cudart = torch.cuda.cudart()
        error = int(cudart.cudaHostRegister(memory.data_ptr(), nbytes, 0))
        if error:
            raise RuntimeError(f"lightning_nvcomp: pinning {nbytes} bytes of host memory failed (CUDA error {error})")
        weakref.finalize(memory, cudart.cudaHostUnregister, memory.data_ptr())
    return memory


def _grains(nbytes: float) -> int:
    return max(1, -(-int(nbytes) // _GRAIN)) * _GRAIN


class _Slab:
    __slots__ = ("memory", "array", "top", "live", "copied", "earlier")

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.memory = host_memory(nbytes, pin)
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
        slab_nbytes: the size of a slab pinned while a save copies; a larger request gets a slab of its own.
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
        # What the last reserve was for, the bytes held saves copied since, and the share of a reserve the last copied.
        self._reserved, self._copied, self._share = 0, 0, 1.0
        self._holding = 0  # the held saves copying now (see :meth:`holding`)
        self._unpinning = threading.local()  # the threads whose copies pin nothing more (see :meth:`pinning_nothing`)

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
        unpinning = getattr(self._unpinning, "on", False)
        host, slab = self._take(nbytes, pin_more=not unpinning)
        if self._holding and not unpinning:
            with self._lock:
                self._copied += nbytes
        host[n:] = 0
        if n:
            host[:n].copy_(src, non_blocking=src.device.type == "cuda" and self.pin)
        if slab is not None and src.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            slab.copied = event  # a slab cut afresh waits for it: a blob dropped early may still be being copied into
        return host

    @contextlib.contextmanager
    def holding(self, nbytes: int) -> Iterator[None]:
        """Within the block, a snapshot of ``nbytes`` of GPU state is copied into the pool and held until it is
        written: :meth:`reserve` pins ahead what it will need, and the copies made meanwhile count as what such a save
        copies (the share of its state the next reserve expects). Copies of saves that stream through the pool, each
        written as it comes, are not counted: they need a slab or two, however large the state."""
        self.reserve(nbytes)
        with self._lock:
            self._holding += 1
        try:
            yield
        finally:
            with self._lock:
                self._holding -= 1

    @contextlib.contextmanager
    def pinning_nothing(self) -> Iterator[None]:
        """Within the block, this thread's copies pin no slab: where the pool has no free room they go to pageable
        memory; nor are they counted as a held save's (see :meth:`holding`). For copies made while a save's snapshot
        fills the pool (an async delta's records coded again on the writer thread): pinning waits for every stream of
        the GPU (``cudaHostRegister``), training's too, and a slab pinned for them would be let go at the next save's
        :meth:`reserve`."""
        self._unpinning.on = True
        try:
            yield
        finally:
            self._unpinning.on = False

    def empty(self, nbytes: int) -> torch.Tensor:
        """A host uint8 tensor of ``nbytes``, uninitialized (a read buffer). Work the GPU queues on it must be done
        before the tensor is dropped: its room may then be cut afresh at once."""
        return self._take(nbytes)[0]

    def reserve(self, nbytes: int) -> None:
        """Pin ahead, on a thread of its own, what a save of ``nbytes`` (its GPU state) will copy: called as a save
        starts, so its copies rarely wait for pinning. The pool expects the share of ``nbytes`` that the held save
        before copied (its coding ratio; all of it at first: see :meth:`holding`) and makes that one slab (see
        :meth:`_fit`), within the limit."""
        if nbytes <= 0:
            return
        with self._lock:
            if self._reserved and self._copied:
                self._share = min(1.0, self._copied / self._reserved)
            self._reserved, self._copied = nbytes, 0
            if self._reserving is not None and self._reserving.is_alive():
                return
            need = _grains(nbytes * self._share * _HEADROOM)
            self._reserving = threading.Thread(target=self._fit, args=(need,), name="lnv-pin", daemon=True)
            self._reserving.start()

    def _fit(self, need: int) -> None:
        """Make the free slabs hold ``need`` bytes and little more: where a free slab fits (at most a tenth larger),
        the other free slabs go; else, where one is larger, one of ``need`` bytes is pinned while the larger ones
        still serve (a save starting meanwhile cuts from them and waits for no pinning) and the other free slabs go
        once it is; else the largest free slabs that make up ``need`` stay, the rest of it is pinned beside them, and
        the others go. A slab goes only once nothing lives in it (else at a later reserve)."""
        with self._lock:
            free = sorted((s for s in self._slabs if not s.live), key=lambda s: -s.memory.numel())
            fitting = [s for s in free if need <= s.memory.numel() <= need * _SLACK][:1]
            larger = any(s.memory.numel() > need * _SLACK for s in free)
            enough = [s for i, s in enumerate(free) if sum(t.memory.numel() for t in free[:i]) < need]
            room = self.limit - self.nbytes
            missing = 0 if fitting else need if larger else min(need - sum(s.memory.numel() for s in enough), room)
        if missing > room:  # no room for both: the larger one stays
            return
        grown = []
        if missing > 0:
            with self._growing:
                grown.append(_Slab(missing, self.pin))
            with self._lock:
                self._slabs += grown
        keep = fitting or (grown if larger else enough)
        with self._lock:
            gone = [s for s in free if s not in keep and not s.live]
            self._slabs = [s for s in self._slabs if s not in gone]
            self._open = None if self._open in gone else self._open
        del free, keep
        for event in [e for s in gone for e in (s.copied, s.earlier) if e is not None]:
            event.synchronize()  # a copy into a blob dropped early may still be landing in it

    def _take(self, nbytes: int, pin_more: bool = True) -> tuple[torch.Tensor, _Slab | None]:
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8), None
        need = -(-nbytes // _ALIGN) * _ALIGN
        with self._lock:
            cut = self._cut_from(need)
        if cut is None and not pin_more:
            return torch.empty(nbytes, dtype=torch.uint8), None
        if cut is None:
            with self._growing:  # a slab reserve's thread is pinning may be what this needs: wait for it first
                with self._lock:
                    cut = self._cut_from(need)
                    size = max(self.slab_nbytes, _grains(need))
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
