"""Diagnostic (round 14): CPU time per tiny DCP item on one thread, collector off: ``code_tensors`` of 3,000
LayerNorm-sized tensors (128 float32 each), then each written as its item's archive (``write_tensor``) into memory;
medians of 7 after a warm-up. Against another tree's package with PYTHONPATH=<tree>:

    python benchmarks/results/round14/items_cpu/tiny_cpu.py
"""

import gc
import io
import statistics
import time

import torch

import lightning_nvcomp
from lightning_nvcomp.format import items as tensor_items
from lightning_nvcomp.format.item_batches import code_tensors
from lightning_nvcomp.format.zip import ArchiveWriter

COUNT = 3000

gc.disable()
torch.manual_seed(0)
tensors = [(f"small.v{i}", torch.randn(128)) for i in range(COUNT)]
code_us, archive_us = [], []
for _ in range(8):
    begin = time.perf_counter()
    coded = [c for batch in code_tensors(tensors, "zstd") for _, c in batch]
    middle = time.perf_counter()
    out = io.BytesIO()
    for c in coded:
        tensor_items.write_tensor(ArchiveWriter(out), c, "1" * 40)
    end = time.perf_counter()
    code_us.append((middle - begin) / COUNT * 1e6)
    archive_us.append((end - middle) / COUNT * 1e6)
print(
    f"{lightning_nvcomp.__file__}: code {statistics.median(code_us[1:]):.1f} us/item, "
    f"archive {statistics.median(archive_us[1:]):.1f} us/item"
)
