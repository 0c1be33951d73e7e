"""Diagnostic (round 12): what the DCP writer's per-item archives cost a many-items ``dcp.save`` (4,816 tensors,
238 MB, zstd; benchmarks/dcp_items_bench.py's state). ``real``: our writer as it is; ``nowriter``: each item's
archive replaced by its segments' bytes and 300 bytes of filler (the same bytes to the disk, no zip records, record
dict or pickle: not a loadable checkpoint). Ten saves in one process; the median of the last eight. From the
repository root, alternating:

    for m in real nowriter real nowriter; do python benchmarks/results/round12/items_cpu/writer_off.py $m; done
"""

import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "examples")]

import dcp_items_bench as bench  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from lightning_nvcomp.dcp import NvcompFileSystemWriter  # noqa: E402
from lightning_nvcomp.integrations.dcp import data_files  # noqa: E402


def segments_only(archive, coded, serialization_id=None):  # noqa: ANN001
    for segment in coded.segments:
        archive._write(memoryview(segment.blob.numpy()))
    archive._write(b"x" * 300)


mode = sys.argv[1]
if mode == "nowriter":
    data_files.tensor_items.write_tensor = segments_only
state = bench.many_items_state(128, 100, 10, "cpu")
seconds = []
for _ in range(10):
    writer = NvcompFileSystemWriter(bench.fresh_dir("/tmp/items-cpu/dcp"), codec="zstd")
    begin = time.perf_counter()
    dcp.save(state, storage_writer=writer)
    seconds.append(time.perf_counter() - begin)
print(mode, "median", round(statistics.median(seconds[2:]), 3), "coding loop", round(writer.stats.encode_s, 3))
