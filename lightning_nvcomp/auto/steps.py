"""How much slower training runs while a checkpoint is written behind it: the process's optimizer steps timed, each
as run with a background write in progress or with none (:class:`StepTimer`). ``auto`` counts the time this costs
in its objective, and the savings metrics report it (``slowdown``, ``slowed_s``)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

#: Steps kept of each kind (run with a write behind them, or with none): the slowdown compares their medians.
WINDOW = 64
#: Steps of each kind timed before a slowdown is estimated.
MIN_STEPS = 5


def slowed_seconds(slowdown: float, behind_s: float) -> float:
    """Training time lost over ``behind_s`` seconds of writing behind it when its steps take ``1 + slowdown`` times
    as long meanwhile: the steps it would have run in that time, less those it ran."""
    return behind_s * slowdown / (1 + slowdown)


class StepTimer:
    """Times every optimizer step of the process (a global ``torch.optim`` step hook: Lightning's, Accelerate's and
    plain loops alike) and tells how much longer a step takes while a background write is in progress.

    A step's time runs from the end of the previous ``step()`` of the same optimizer to the end of its own (the
    forward, backward and update between). A step during which a save started (:meth:`save_started`) is not timed:
    its time is the save's, counted as blocked. The others are kept by kind: a write in progress at both ends of the
    step (``busy()``), or at neither; a step a write began or ended in counts as neither. The last :data:`WINDOW` of
    each kind are kept.

    Args:
        busy: whether a background write is in progress now (called on the training thread at each step's end).
    """

    def __init__(self, busy: Callable[[], bool]) -> None:
        self._busy = busy
        self._last: dict[int, tuple[float, bool]] = {}  # id(optimizer) -> (its last step's end, busy then)
        self._times: dict[bool, deque[float]] = {True: deque(maxlen=WINDOW), False: deque(maxlen=WINDOW)}
        self._handle: RemovableHandle | None = None

    def start(self) -> None:
        """Time the steps from now on (the hook is installed once)."""
        if self._handle is None:
            self._handle = register_optimizer_step_post_hook(self._step_done)

    def stop(self) -> None:
        """Stop timing (remove the hook); what was measured stays."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
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
