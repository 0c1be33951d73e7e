"""The process-wide resources: thread pools, codec engines, caches and the default codec policies.

Each is made on first use, one per process, by the module that uses it (``shared(name, make)``); :func:`reset`
drops them all, shutting the thread pools down after their queued work: what tests and benchmarks call to start
from a fresh process state, instead of reaching into each module. And :func:`collector_paused`, the one use of the
process's garbage collector.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import Callable, TypeVar

T = TypeVar("T")

_made: dict[str, object] = {}
_lock = threading.RLock()


def shared(name: str, make: Callable[[], T]) -> T:
    """The process's one resource called ``name``, made by ``make()`` the first time it is asked for."""
    found = _made.get(name)
    if found is None:
        with _lock:
            found = _made.get(name)
            if found is None:
                found = _made[name] = make()
    return found  # type: ignore[return-value]


def reset() -> None:
    """Forget every shared resource; thread pools finish their queued work first."""
    with _lock:
        made = list(_made.values())
        _made.clear()
    for resource in made:
        if isinstance(resource, Executor):
            resource.shutdown(wait=True)


_pause_depth = 0  # collector_paused blocks open now (only the main thread opens them)
_enable_after = False  # whether the collector was on when the outermost block began


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block when it runs on the main thread (a save or load the
    training waits for), and back on after the outermost such block if it was on before it.

    Why: the items of a DCP checkpoint of a deep model are thousands of records, each a few objects alive until
    written or placed; enough of them outlive a young collection to set off full ones, each walking every object of
    the training process (about two per save and per load on the CPU items state, where DCP's own writer and reader
    set off about one: ``benchmarks/gc_loop_bench.py``). Reference counting still frees what the block drops; the
    next collection after it looks at the rest. Off the main thread (a write behind training) the collector is left alone: pausing it there
    would pause it for the training too.
    """
    global _pause_depth, _enable_after
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _pause_depth == 0:
        _enable_after = gc.isenabled()
        gc.disable()
    _pause_depth += 1
    try:
        yield
    finally:
        _pause_depth -= 1
        if _pause_depth == 0 and _enable_after:
            gc.enable()
