"""The process-wide resources: thread pools, codec engines, caches and the default codec policies.

Each is made on first use, one per process, by the module that uses it (``shared(name, make)``); :func:`reset`
drops them all, shutting the thread pools down after their queued work: what tests and benchmarks call to start
from a fresh process state, instead of reaching into each module.
"""

from __future__ import annotations

import threading
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
