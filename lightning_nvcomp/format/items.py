"""Tensors stored one archive each, as every item of a DCP checkpoint is: each tensor's bytes are a record of their
own, coded in batches with tensors of its kind (:func:`code_tensors`: one layout, one engine call and one wait per
batch instead of per tensor), and written as a complete ``torch.save`` zip whose pickle is one ``decode_tensor``
call (:func:`write_tensor`), which any ``torch.load`` reads once ``lightning_nvcomp`` is imported."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lightning_nvcomp.codec import record as records
from lightning_nvcomp.format.contents import DTYPES
from lightning_nvcomp.format.decode import decode_tensor, tensor_check
from lightning_nvcomp.format.sink import MemorySink
from lightning_nvcomp.format.writer import _ArchivePickler, _LayoutCache, _StoredBlob
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.resources import shared

#: Raw bytes coded per batch (and so the scratch and pinned host memory one batch borrows).
BATCH_NBYTES = 64 << 20


@dataclass
class CodedTensor:
    """One tensor coded as a record of its own: what :func:`write_tensor` writes. ``name`` is the tensor's
    name in messages (a DCP item's fully qualified name)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str
    coding: records.Coding
    segments: list[records.Segment]

    @property
    def raw_nbytes(self) -> int:
        return self.coding.nbytes


def storable(t: torch.Tensor) -> bool:
    """Whether :func:`code_tensors` stores ``t``: a dense tensor of a dtype the format names, on the CPU or a GPU."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and t.device.type in ("cpu", "cuda")
        and t.dtype in DTYPES.values()
        and not t.is_conj()
        and not t.is_neg()
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def _kind(name: str, t: torch.Tensor) -> tuple:
    """Tensors coded in one batch share a layout: same device and dtype, and the same last name part (``weight``,
    ``exp_avg_sq``...), whose values are alike."""
    return (t.device, t.dtype, name.rsplit(".", 1)[-1])


def code_tensors(tensors: list[tuple[str, torch.Tensor]], codec: str) -> Iterator[list[tuple[int, CodedTensor]]]:
    """Code each ``(name, tensor)`` of ``tensors`` (each :func:`storable`) with ``codec`` (``ans``, ``zstd``;
    ``none`` stores raw, checksummed), yielding each batch as it is done, as ``(index, coded)`` pairs: tensors of
    one kind in batches of up to :data:`BATCH_NBYTES`, a tensor larger than a segment alone (in several
    segments). The tensors are read when their batch is coded, not after."""
    coder = "raw" if codec == "none" else codec
    layouts = shared("layouts", _LayoutCache)
    batches: dict[tuple, list[int]] = {}
    for index, (name, t) in enumerate(tensors):
        batches.setdefault(_kind(name, t), []).append(index)
    for (device, dtype, _), indices in batches.items():
        segment = records.segment_nbytes(device, coder)
        for batch in _cut(indices, tensors, segment):
            datas = [_bytes(tensors[i][1]) for i in batch]
            key = (codec, dtype, "batch", tuple((d.device, d.data_ptr(), d.numel()) for d in datas))
            if datas[0].numel() > segment:  # alone in its batch
                encoder = records.Encoder(datas[0], dtype, coder, layout=layouts.get(key))
                coded = [(encoder.coding, list(encoder))]
            else:
                coded = records.encode_batch(datas, dtype, coder, layouts.get(key))
            if coded:
                layouts.put(key, coded[0][0].layout)
            yield [
                (i, CodedTensor(tensors[i][0], tensors[i][1].dtype, tuple(tensors[i][1].shape), device.type, *c))
                for i, c in zip(batch, coded)
            ]


def _cut(indices: list[int], tensors: list[tuple[str, torch.Tensor]], segment: int) -> Iterator[list[int]]:
    """Consecutive runs of ``indices`` of at most :data:`BATCH_NBYTES`; a tensor larger than ``segment`` alone."""
    run: list[int] = []
    nbytes = 0
    for i in indices:
        t = tensors[i][1]
        size = t.numel() * t.element_size()
        if size > segment:
            yield [i]
            continue
        if run and nbytes + size > BATCH_NBYTES:
            yield run
            run, nbytes = [], 0
        run.append(i)
        nbytes += size
    if run:
        yield run


def write_tensor(writer: ArchiveWriter, coded: CodedTensor) -> None:
    """Write ``coded`` as a whole archive: its segments (``data/0``...), then a pickle that is one call of
    :func:`~lightning_nvcomp.format.decode.decode_tensor` rebuilding the contiguous tensor."""
    kept = MemorySink()
    blobs = []
    for k, segment in enumerate(coded.segments):
        kept.put(str(k), segment)
        blobs.append(_StoredBlob(str(k), segment.blob.numel()))
    kept.write_to(writer)
    sizes = [n for segment in coded.segments for n in segment.sizes]
    meta = records.describe(
        coded.coding,
        sizes,
        [segment.crc for segment in coded.segments],
        storages=[[0, coded.raw_nbytes]],
        device=coded.device,
    )
    stride = torch.empty(coded.shape, device="meta").stride() if coded.shape else ()
    placement = (0, 0, coded.shape, tuple(stride), False, False, coded.name)
    check = tensor_check(meta, *placement)
    marker = object()
    buffer = io.BytesIO()
    _ArchivePickler(buffer, {id(marker): (decode_tensor, (blobs, meta, *placement, check))}, {}).dump(marker)
    writer.add_torch_metadata()
    writer.add("data.pkl", buffer.getbuffer())
    writer.finish("data.pkl")
