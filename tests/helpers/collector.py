"""The garbage collector watched: on whose account it ran while a piece of code did."""

from __future__ import annotations

import sys


def collections_within(on_stack, run):
    """``run()``'s result, and the names of the functions on whose account garbage collections started on the main
    thread: the innermost frame on its stack for which ``on_stack(frame)`` is true (a string: a function of that
    name), with the collector set to run at every allocation meanwhile (so that any stretch of it the collector is
    not paused for would collect)."""
    import gc
    import threading

    matches = (lambda frame: frame.f_code.co_name == on_stack) if isinstance(on_stack, str) else on_stack
    started = []

    def seen(phase, info):
        if phase != "start" or threading.current_thread() is not threading.main_thread():
            return
        frame = sys._getframe(1)
        while frame is not None:
            if matches(frame):
                started.append(frame.f_code.co_name)
                return
            frame = frame.f_back

    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(seen)
    try:
        return run(), started
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)
