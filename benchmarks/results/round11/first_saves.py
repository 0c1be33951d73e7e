"""Diagnostic (round 11, call 6): why an async gANS save's first two checkpoints block 0.26-0.31 s and the later ones
0.13 s (call5/steady_disk.md). One steady_bench fit per IO in this process, with every pinned slab made timed (which
thread, how large, how long), the pinned pool's size and the GPU caching allocator's segments around each save, and
each save's blocked time.

    cd benchmarks && python3 ../benchmarks/results/round11/first_saves.py "ours ans async" "ours none async"
"""

import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, ".")
if sys.argv[1] != "--one":
    for io in sys.argv[1:]:
        subprocess.run([sys.executable, __file__, "--one", io], check=False)
    raise SystemExit

import argparse  # noqa: E402

import steady_bench  # noqa: E402
import torch  # noqa: E402

import lightning_nvcomp  # noqa: E402
from lightning_nvcomp.codec import pinned  # noqa: E402

slabs, saves = [], []
T0 = time.perf_counter()
original_slab = pinned._Slab.__init__


def timed_slab(self, nbytes, pin):  # noqa: ANN001
    begin = time.perf_counter()
    original_slab(self, nbytes, pin)
    slabs.append((threading.current_thread().name, nbytes >> 20, round(time.perf_counter() - begin, 4), begin))


pinned._Slab.__init__ = timed_slab
original_save = lightning_nvcomp.NvcompCheckpointIO.save_checkpoint


def timed_save(self, checkpoint, path, storage_options=None):  # noqa: ANN001
    stats = torch.cuda.memory_stats()
    before = (pinned.pool().nbytes >> 20, stats.get("segment.all.allocated", 0), len(slabs))
    begin = time.perf_counter()
    original_save(self, checkpoint, path, storage_options)
    end = time.perf_counter()
    stats = torch.cuda.memory_stats()
    mine = [s for s in slabs[before[2] :]]
    on_main = sum(s[2] for s in mine if s[0] == "MainThread")
    saves.append(
        {
            "at_s": round(begin - T0, 2),
            "blocked_s": round(end - begin, 3),
            "pool_mb": [before[0], pinned.pool().nbytes >> 20],
            "cuda_segments_made": stats.get("segment.all.allocated", 0) - before[1],
            "slabs_made": [(s[0], s[1], s[2]) for s in mine],
            "pinning_on_main_s": round(on_main, 3),
            "in_use_mb": pinned.pool().in_use_nbytes >> 20,
        }
    )


lightning_nvcomp.NvcompCheckpointIO.save_checkpoint = timed_save
io = sys.argv[2]
size = dict(dim=1024, layers=20, batch=192, steps=80, every=20)
size.update(json.loads(os.environ.get("FIRST_SAVES_SIZE", "{}")))  # a smaller fit, to try the script on a CPU
args = argparse.Namespace(io=io, cgroup=None, precision="bf16-mixed", dir="/tmp/lnv-first", **size)
steady_bench.child(args)
print(f"== {io}")
for k, s in enumerate(saves):
    print(k + 1, json.dumps(s))
print("all slabs (thread, MB, s, made at s):", [(s[0], s[1], s[2], round(s[3] - T0, 2)) for s in slabs])
