"""How much slower training runs while a checkpoint is written behind it: the run's optimizer steps timed, each as
run with a background write in progress or with none (:class:`StepTimer`). ``auto`` counts the time this costs in
its objective, and the savings metrics report it (``slowdown``, ``slowed_s``)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Callable

import torch
from torch.utils.hooks import RemovableHandle

#: Steps kept of each kind (run with a write behind them, or with none): the slowdown compares their medians.
WINDOW = 64
#: Steps of each kind timed before a slowdown is estimated.
MIN_STEPS = 5


class StepTimer:
    """Times the steps of the run's optimizers (:meth:`watch`: the Trainer's, the Accelerator's) and tells how much
    longer a step takes while a background write is in progress.

    Each watched optimizer gets a step hook of its own (``Optimizer.register_step_post_hook``) from :meth:`start` (or
    from :meth:`watch`, once started) until :meth:`stop`, which removes every hook and forgets the optimizers; no
    other optimizer of the process is touched. A step's time runs from the end of the previous ``step()`` of the same
    optimizer to the end of its own (the forward, backward and update between). A step during which a save started
    (:meth:`save_started`) is not timed: its time is the save's, counted as blocked. The others are kept by kind: a
    write in progress at both ends of the step (``busy()``), or at neither; a step a write began or ended in counts as
    neither. The last :data:`WINDOW` of each kind are kept.

    Args:
        busy: whether a background write is in progress now (called on the training thread at each step's end).
    """

    def __init__(self, busy: Callable[[], bool]) -> None:
        self._busy = busy
        self._last: dict[int, tuple[float, bool]] = {}  # id(optimizer) -> (its last step's end, busy then)
        self._times: dict[bool, deque[float]] = {True: deque(maxlen=WINDOW), False: deque(maxlen=WINDOW)}
        self._watched: list[torch.optim.Optimizer] = []
        self._hooks: dict[int, RemovableHandle] = {}  # id(optimizer) -> its hook, while started
        self._started = False

    def watch(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Time these optimizers' steps too (those watched already are left as they are)."""
        for optimizer in optimizers:
            if all(optimizer is not known for known in self._watched):
                self._watched.append(optimizer)
        if self._started:
            self._hook()

    def start(self) -> None:
        """Time the watched optimizers' steps from now on."""
        self._started = True
        self._hook()

    def _hook(self) -> None:
        for optimizer in self._watched:
            if id(optimizer) not in self._hooks:
                self._hooks[id(optimizer)] = optimizer.register_step_post_hook(self._step_done)

    def stop(self) -> None:
        """Stop timing: remove every hook and forget the optimizers; what was measured stays."""
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()
        self._watched.clear()
        self._started = False
        self._last.clear()

    def save_started(self) -> None:
        """A save starts: the steps in progress now are not timed."""
        self._last.clear()

    def _step_done(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        now, busy = time.perf_counter(), self._busy()
        last = self._last.get(id(optimizer))
        self._last[id(optimizer)] = (now, busy)
        if last is not None and last[1] == busy:
            self._times[busy].append(now - last[0])

    def slowdown(self) -> float | None:
        """How much longer a step takes with a write behind it than without (0.05: 5% longer; never below 0), or
        None before :data:`MIN_STEPS` steps of each kind were timed."""
        busy, idle = self._times[True], self._times[False]
        if len(busy) < MIN_STEPS or len(idle) < MIN_STEPS:
            return None
        return max(0.0, statistics.median(busy) / statistics.median(idle) - 1)
