"""How a data file's compressed items reach their targets in :class:`~lightning_nvcomp.dcp.NvcompFileSystemReader`:
read in windows of :data:`WINDOW_NBYTES` on a thread of their own while the previous window decodes
(:func:`windows`), and for CPU targets copied off the GPU into pinned memory at once (:func:`to_host`) and filled on
another thread while the next window decodes (:class:`Filler`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future as PoolFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem

from lightning_nvcomp.codec.pinned import pool as pinned_pool
from lightning_nvcomp.errors import CorruptCheckpointError
from lightning_nvcomp.integrations.dcp.metadata import NvcompStorageInfo

#: Bytes of a data file read at once: compressed items are read in windows of this size, the next one while the
#: items of this one decode.
WINDOW_NBYTES = 64 << 20


def windows(
    stream: Any, items: list[tuple[ReadItem, NvcompStorageInfo]], devices: set[torch.device]
) -> Iterator[tuple[list[tuple[ReadItem, NvcompStorageInfo]], torch.Tensor]]:
    """The items in file order, in runs spanning at most :data:`WINDOW_NBYTES` (an item larger than that alone),
    each with the bytes from its first item's start to its last one's end, read in one call (on a thread, while the
    caller decodes the previous run). ``devices``: where the caller puts the items (their GPUs may copy from a
    window until the work queued there while the caller had it is done)."""
    runs: list[list[tuple[ReadItem, NvcompStorageInfo]]] = []
    for pair in sorted(items, key=lambda p: p[1].offset):
        if runs and pair[1].offset + pair[1].length - runs[-1][0][1].offset <= WINDOW_NBYTES:
            runs[-1].append(pair)
        else:
            runs.append([pair])

    # Two buffers, reused: run i is read into one while the caller decodes run i - 1 from the other (decoded tensors
    # never share a window's memory), so the reads do not fault in fresh pages every time. Where the process uses a
    # GPU they are pinned, so that a window goes to the GPU in one asynchronous copy; buffer i % 2 is then refilled
    # once the work queued while the caller had run i is done. Pinned ones come from the process's pool (pinned
    # once per run, not per load), so that work is waited for before they are dropped.
    pinned = torch.cuda.is_initialized()
    gpus = {d for d in devices if d.type == "cuda"} | (
        {torch.device("cuda", torch.cuda.current_device())} if pinned else set()
    )
    buffers = [torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)]
    released: list[list[torch.cuda.Event]] = [[], []]

    def read(i: int) -> torch.Tensor:
        run = runs[i]
        start = run[0][1].offset
        nbytes = max(info.offset + info.length for _, info in run) - start
        for event in released[i % 2]:
            event.synchronize()
        if buffers[i % 2].numel() < nbytes:
            size = max(nbytes, min(WINDOW_NBYTES, 2 * nbytes))
            buffers[i % 2] = pinned_pool().empty(size) if pinned else torch.empty(size, dtype=torch.uint8)
        window = buffers[i % 2][:nbytes]
        stream.seek(start)
        got = stream.readinto(memoryview(window.numpy())) if nbytes else 0
        if got != nbytes:
            raise CorruptCheckpointError(f"a data file ends {nbytes - (got or 0)} bytes early")
        return window

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lnv-dcp-read") as reader:
        ahead = reader.submit(read, 0) if runs else None
        for i, run in enumerate(runs):
            assert ahead is not None
            data = ahead.result()
            if i + 1 < len(runs):
                ahead = reader.submit(read, i + 1)
            yield run, data
            released[i % 2] = [_recorded(gpu) for gpu in gpus]
    for event in (e for events in released for e in events):
        event.synchronize()


class Filler:
    """Fills CPU targets on a thread of its own while the caller decodes the next window, at most two windows
    behind; the planner is told of each target once it is filled (on the caller's thread, as for every other)."""

    def __init__(self, planner: LoadPlanner) -> None:
        self._planner = planner
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lnv-dcp-fill")
        # (the fill, its items and targets, the decoded tensors it copies from: alive until it is done)
        self._filling: deque[tuple[PoolFuture, list[tuple[ReadItem, torch.Tensor]], list[torch.Tensor]]] = deque()

    def add(
        self,
        fills: list[tuple[ReadItem, torch.Tensor, torch.Tensor]],
        copied: list[torch.cuda.Event],
        decoded: list[torch.Tensor],
    ) -> None:
        """Copy each ``(item, target, part)``'s part into its target, once the copies ``copied`` records (into the
        parts, from ``decoded``) have landed."""
        while len(self._filling) >= 2:
            self._commit_oldest()
        self._filling.append((self._thread.submit(_fill, copied, fills), [(r, t) for r, t, _ in fills], decoded))

    def _commit_oldest(self) -> None:
        done, filled, _ = self._filling.popleft()
        done.result()  # raises the fill's error
        for req, target in filled:
            self._planner.commit_tensor(req, target)

    def __enter__(self) -> Filler:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            while self._filling and exc[0] is None:
                self._commit_oldest()
        finally:
            self._thread.shutdown(wait=True)


def _fill(copied: list[torch.cuda.Event], fills: list[tuple[ReadItem, torch.Tensor, torch.Tensor]]) -> None:
    for event in copied:
        event.synchronize()
    for _, target, part in fills:
        target.copy_(part)


def to_host(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.cuda.Event]]:
    """``tensors`` with those a GPU decoded (gANS items bound for CPU targets) copied into one pinned host buffer
    of the process's pool, asynchronously, and the events that record when those copies have landed: a synchronous
    copy per item into the targets' pageable (often not yet touched) memory is many times slower. The host tensors
    are views of that buffer."""
    on_gpu = [k for k, t in enumerate(tensors) if t.is_cuda and t.is_contiguous()]
    if not on_gpu:
        return tensors, []
    starts, total = [], 0
    for k in on_gpu:
        starts.append(total)
        total += -(-tensors[k].numel() * tensors[k].element_size() // 64) * 64  # a dtype view needs aligned starts
    buffer = pinned_pool().empty(total)
    out = list(tensors)
    for k, start in zip(on_gpu, starts):
        t = tensors[k]
        host = buffer[start : start + t.numel() * t.element_size()]
        host.copy_(t.reshape(-1).view(torch.uint8), non_blocking=True)
        out[k] = host.view(t.dtype).view(t.shape)
    return out, [_recorded(device) for device in {tensors[k].device for k in on_gpu}]


def _recorded(device: torch.device) -> torch.cuda.Event:
    """An event recorded now on ``device``'s current stream."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
