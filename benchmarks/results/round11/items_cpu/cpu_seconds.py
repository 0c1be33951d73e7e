"""Diagnostic (round 11): CPU seconds per save by thread name, busy or waiting, from a py-spy raw profile of
``saves.py`` (200 Hz, 12 saves). The main thread counts only in stacks with a frame matching REGEX (the save).

    python benchmarks/results/round11/items_cpu/cpu_seconds.py dcp.txt "save \\(torch/distributed/checkpoint/state_dict_saver"
"""

import collections
import re
import sys

RATE_HZ, SAVES = 200, 12
WAITS = ("wait (threading", "_worker (concurrent/futures/thread.py:81", "Condition.wait")

totals: collections.Counter = collections.Counter()
for line in open(sys.argv[1]):
    stack, count = line.rsplit(" ", 1)
    frames = stack.split(";")
    found = re.search(r": (\S+?)(_\d+)?$", frames[0])
    thread = found.group(1) if found else "MainThread"  # before py-spy learnt its name
    if thread == "MainThread" and not any(re.search(sys.argv[2], f) for f in frames):
        continue
    state = "waiting" if any(w in frames[-1] for w in WAITS) else "busy"
    totals[(thread, state)] += int(count)
for (thread, state), samples in sorted(totals.items()):
    print(f"{thread:28} {state:8} {samples / RATE_HZ / SAVES:.3f} s per save")
