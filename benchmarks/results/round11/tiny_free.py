"""Diagnostic (round 11, not a benchmark): our dcp.save of the many-items state (benchmarks/dcp_items_bench.py,
4,816 tensors, 238 MB, zstd) as it is, then with the archives of its tiny items (under 4 KiB, stored raw) not
written (64 bytes each instead), next to our single-file save, alternating. Run from the repository root:

    .venv/bin/python benchmarks/results/round11/tiny_free.py
"""

import shutil
import sys
import time

sys.path[:0] = ["benchmarks", "examples"]
import torch.distributed.checkpoint as dcp  # noqa: E402
from dcp_items_bench import many_items_state  # noqa: E402

import lightning_nvcomp  # noqa: E402
from lightning_nvcomp.dcp import NvcompFileSystemWriter  # noqa: E402
from lightning_nvcomp.integrations.dcp import data_files  # noqa: E402

write_tensor = data_files.tensor_items.write_tensor


def tiny_free(archive, coded, serialization_id=None):
    if coded.raw_nbytes < 4096:
        archive._write(b"x" * 64)
    else:
        write_tensor(archive, coded, serialization_id)


def dcp_save(writes) -> float:
    data_files.tensor_items.write_tensor = writes
    shutil.rmtree("/tmp/tiny-free", ignore_errors=True)
    begin = time.perf_counter()
    dcp.save(state, storage_writer=NvcompFileSystemWriter("/tmp/tiny-free", codec="zstd"))
    return time.perf_counter() - begin


state = many_items_state(128, 100, 10, "cpu")
for _ in range(4):
    real, free = dcp_save(write_tensor), dcp_save(tiny_free)
    begin = time.perf_counter()
    lightning_nvcomp.save(state, "/tmp/tiny-free.ckpt", codec="zstd")
    single = time.perf_counter() - begin
    print(f"real {real:.2f}  tiny-free {free:.2f}  single {single:.2f}  ratios {real / single:.2f} {free / single:.2f}")
