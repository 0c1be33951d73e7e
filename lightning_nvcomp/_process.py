"""What the package does to the process it runs in, each through one mechanism (docs/ARCHITECTURE.md, "Effects on
the user's process"):

- :func:`shared`: the process-wide resources (thread pools, codec engines, the pinned pool, caches, the default codec
  policies of calls that have no run object), each made on first use by the module that uses it; :func:`reset`
  drops them all, shutting the thread pools down after their queued work (tests and benchmarks start from a fresh
  process state with it, instead of reaching into each module).
- :func:`swapped`: a framework's attribute pointed at ours for a block, under one lock, the original put back after;
  the one way the package changes a framework's module or class (the seams in ``_compat``).
- :func:`collector_paused` and :class:`PauseBetweenCalls`: the one use of the process's garbage collector.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from typing import Any, Callable, TypeVar

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


_SWAP = threading.RLock()  # one swap at a time across threads; a seam may nest another in its own thread


@contextlib.contextmanager
def swapped(
    owner: object,
    values: Mapping[str, object] | None = None,
    wrapped: Mapping[str, Callable[[Any], object]] | None = None,
) -> Iterator[None]:
    """Within the block, each attribute of ``owner`` (a framework's module or class) named in ``values`` is the value
    given, and each named in ``wrapped`` is ``wrap(original)``; the originals are put back after, also when the block
    fails. One block at a time in the process (another thread's swap waits for it; a swap may nest another in its
    own thread): two swaps of one name must not put back, or wrap, each other's values.

    Args:
        owner: the module or object whose attributes are swapped.
        values: name -> the value within the block.
        wrapped: name -> a function of the original giving the value within the block.

    Raises:
        AttributeError: ``owner`` has no such attribute (nothing is swapped).
    """
    with _SWAP:
        values, wrapped = values or {}, wrapped or {}
        originals = {name: getattr(owner, name) for name in [*values, *wrapped]}
        within = {**values, **{name: wrap(originals[name]) for name, wrap in wrapped.items()}}
        try:
            for name, value in within.items():
                setattr(owner, name, value)
            yield
        finally:
            for name, original in originals.items():
                setattr(owner, name, original)


_pause_lock = threading.Lock()
_pause_depth = 0  # pauses open now (collector_paused blocks of the main thread, PauseBetweenCalls spans)
_enable_after = False  # whether the collector was on when the first of them began


def _pause() -> None:
    global _pause_depth, _enable_after
    with _pause_lock:
        if _pause_depth == 0:
            _enable_after = gc.isenabled()
            gc.disable()
        _pause_depth += 1


def _resume() -> None:
    global _pause_depth
    with _pause_lock:
        _pause_depth -= 1
        if _pause_depth == 0 and _enable_after:
            gc.enable()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block when it runs on the main thread (a save or load the
    training waits for), and back on after the last pause open if it was on before the first.

    Why: the items of a DCP checkpoint of a deep model are thousands of records, each a few objects alive until
    written or placed; enough of them outlive a young collection to set off full ones, each walking every object of
    the training process (about two per save and per load on the CPU items state, where DCP's own writer and reader
    set off about one: ``benchmarks/gc_loop_bench.py``). Reference counting still frees what the block drops; the
    next collection after it looks at the rest. Off the main thread (a write behind training) the collector is left
    alone: pausing it there would pause it for the training too.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _pause()
    try:
        yield
    finally:
        _resume()


class PauseBetweenCalls:
    """A pause of the collector (as :func:`collector_paused`, on the main thread only) that one call begins and a
    later one ends: DCP plans a save between its storage writer's ``set_up_storage_writer`` and ``write_data`` (a load
    between ``set_up_storage_reader`` and ``read_data``), and the plan of thousands of items sets off full
    collections too (``round10 of benchmarks/results/ in git history``), as do the items written or read then. The later call runs in
    :meth:`through`: the pause lasts to its end, however long. A plan that fails never reaches ``write_data``, and
    its error holds the writer in a reference cycle: the pause then ends at the owner's next :meth:`begin`, when the
    owner is collected, or ``longest_s`` after it began, whichever comes first.

    Args:
        owner: the object whose calls begin and end the pause (a writer or reader).
        longest_s: the pause ends by itself this long after it began.
    """

    def __init__(self, owner: object, longest_s: float = 120.0) -> None:
        self.longest_s = longest_s
        self._lock = threading.Lock()
        self._deadline: threading.Timer | None = None
        weakref.finalize(owner, self.end)

    def begin(self) -> None:
        self.end()
        if threading.current_thread() is not threading.main_thread():
            return
        _pause()
        deadline = threading.Timer(self.longest_s, self.end)
        deadline.daemon = True
        with self._lock:
            self._deadline = deadline
        deadline.start()

    @contextlib.contextmanager
    def through(self) -> Iterator[None]:
        """The call that ends the pause: it lasts to the end of the block (its deadline no longer applies)."""
        with self._lock:
            if self._deadline is not None:
                self._deadline.cancel()
        try:
            yield
        finally:
            self.end()

    def end(self) -> None:
        with self._lock:
            deadline, self._deadline = self._deadline, None
        if deadline is not None:
            deadline.cancel()
            _resume()
