"""Diagnostic (round 12): the Python time of one tiny DCP item's archive (a 128-float LayerNorm vector, stored raw,
one segment) and of its parts, each timed on its own (timeit, best of five), with the collector off as in a save.

    python benchmarks/results/round12/items_cpu/archive_parts.py
"""

import gc
import timeit

import torch

from lightning_nvcomp.codec import record as records
from lightning_nvcomp.format import items
from lightning_nvcomp.format.decode import Placement, tensor_check
from lightning_nvcomp.format.item_batches import code_tensors
from lightning_nvcomp.format.writer import _StoredBlob
from lightning_nvcomp.format.zip import ArchiveWriter


class Discard:
    def write(self, data):  # noqa: ANN001
        return len(data)


gc.disable()
tensors = [(f"layers.{i}.ln.weight", torch.randn(128)) for i in range(2000)]
coded = [c for batch in code_tensors(tensors, "zstd") for _, c in batch]
one, sid = coded[0], "1" * 40
segment = one.segments[0]
sizes = [n for s in one.segments for n in s.sizes]
meta = records.describe(one.coding, sizes, [s.crc for s in one.segments], storages=[[0, one.raw_nbytes]], device="cpu")
placement = Placement(0, 0, one.shape, (1,), False, False, one.name)
pickled = items._pickled_call(
    [_StoredBlob("0", segment.blob.numel())], (meta, *placement, tensor_check(meta, *placement))
)


def us(fn, n=20000):  # noqa: ANN001
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def all_items():
    for c in coded:
        items.write_tensor(ArchiveWriter(Discard()), c, sid)


print(
    f"{'write_tensor, 2000 distinct items':36} {min(timeit.repeat(all_items, number=1, repeat=5)) / len(coded) * 1e6:6.2f} us"
)
print(f"{'write_tensor, one item':36} {us(lambda: items.write_tensor(ArchiveWriter(Discard()), one, sid)):6.2f} us")
parts = {
    "torch.save's records (cached)": lambda: ArchiveWriter(Discard()).add_torch_metadata(sid),
    "zip entry data/0": lambda: ArchiveWriter(Discard()).add("data/0", memoryview(segment.blob.numpy()), 1),
    "record dict (describe)": lambda: records.describe(
        one.coding, sizes, [s.crc for s in one.segments], storages=[[0, one.raw_nbytes]], device="cpu"
    ),
    "tensor_check": lambda: tensor_check(meta, *placement),
    "the pickle (_pickled_call)": lambda: items._pickled_call(
        [_StoredBlob("0", segment.blob.numel())], (meta, *placement, tensor_check(meta, *placement))
    ),
    "zip entry data.pkl": lambda: ArchiveWriter(Discard()).add("data.pkl", pickled),
}
for name, fn in parts.items():
    print(f"{name:36} {us(fn):6.2f} us")
