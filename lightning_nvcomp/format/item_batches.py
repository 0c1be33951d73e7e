"""DCP items coded in bulk: each tensor's bytes are a record of their own, coded in batches with tensors of its kind
(:func:`code_tensors`: one layout, one engine call and one wait per batch instead of per tensor), ready for
:func:`~lightning_nvcomp.format.items.write_tensor` to write as an item's archive."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from lightning_nvcomp._process import shared
from lightning_nvcomp.codec import batch as batch_coding
from lightning_nvcomp.codec import engines
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.cpu import cpu_threads
from lightning_nvcomp.codec.layouts import raw_layout
from lightning_nvcomp.codec.schema import Layout
from lightning_nvcomp.format import delta
from lightning_nvcomp.format.bases import BaseFile
from lightning_nvcomp.format.contents import DTYPES
from lightning_nvcomp.format.writer import _LayoutCache

#: Raw bytes coded per batch, by the tensors' device type (and so the scratch and pinned host memory one batch
#: borrows: on a GPU the peak measured 3.6-3.7x this). On a GPU what a batch
#: costs is its calls, not its bytes: 128 MiB staged a 3 GB state in 0.15-0.18 s against 0.19-0.25 s at 64 MiB
#: (round8 of benchmarks/results/ in git history), with 0.48 GB of extra GPU memory.
BATCH_NBYTES = {"cpu": 64 << 20, "cuda": 128 << 20}
#: Tensors smaller than this are stored raw (checksummed, not coded): a codec call per byte plane costs them more
#: time than the few bytes it could save (LayerNorm and bias vectors, optimizer steps).
RAW_NBYTES = 4 << 10
#: Most CPU batches coded at once (each holds its planes and packed bytes, about twice :data:`BATCH_NBYTES`,
#: meanwhile); one per four cores (a batch's zstd runs on all of them): on a machine of fewer than eight cores,
#: batches are coded one after another (on two cores, coding them ahead competed with the writer thread and the
#: zstd threads and made the save slower), but for batches of tiny tensors, whose coding is Python work, not codec
#: calls: a pool thread codes them beside the next batch (round14 of benchmarks/results/ in git history).
BATCHES_AHEAD = 4


@dataclass
class CodedTensor:
    """One tensor coded as a record of its own: what :func:`~lightning_nvcomp.format.items.write_tensor` writes. ``name`` is the tensor's
    name in messages (a DCP item's fully qualified name). ``segments``: a list, or for a tensor :func:`code_tensors`
    streams, an iterator that gives each segment as it is coded (read once)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str
    coding: records.Coding
    segments: Iterable[records.Segment]
    #: More fields of its record dict: a delta's (see :func:`code_deltas`).
    fields: dict = field(default_factory=dict)

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
    if not t.numel():
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    return (t if t.dim() == 1 else t.reshape(-1)).view(torch.uint8)


def _kind(name: str, t: torch.Tensor) -> tuple:
    """Tensors coded in one batch share a layout: same device and dtype, and the same last name part (``weight``,
    ``exp_avg_sq``...), whose values are alike; tiny ones (under :data:`RAW_NBYTES`) apart, stored raw, whatever
    their names (no layout is chosen for them: names that differ in their last part, ``v0``, ``v1``..., would
    otherwise make a batch of each)."""
    if t.numel() * t.element_size() < RAW_NBYTES:
        return (t.device, t.dtype, None, True)
    return (t.device, t.dtype, name.rsplit(".", 1)[-1], False)


def code_tensors(
    tensors: list[tuple[str, torch.Tensor]], codec: str, streamed: bool = False
) -> Iterator[list[tuple[int, CodedTensor]]]:
    """Code each ``(name, tensor)`` of ``tensors`` (each :func:`storable`) with ``codec`` (``ans``, ``zstd``;
    ``none`` stores raw, checksummed), yielding each batch as it is done, as ``(index, coded)`` pairs: tensors of
    one kind (:func:`_kind`; a last name part only one tensor has counts as none) in batches of up to
    :data:`BATCH_NBYTES` for their device, a tensor larger than a segment alone (in several segments), the batches
    of tiny tensors first. The tensors are read when their batch is coded, not after.
    Batches of CPU tensors are coded on CPU threads, up to :data:`BATCHES_AHEAD` at a time (on few cores, only the
    tiny ones ahead), and yielded in order; GPU batches one after another (they queue on the GPU).

    ``streamed``: a tensor larger than a segment that is coded on the CPU is yielded as soon as its segments are
    queued, each coded segment then comes out of its :attr:`CodedTensor.segments` (so that it is written while the
    next ones are coded, as a single-file save does). The caller must keep such tensors unchanged until it has
    read their segments."""
    coder = "raw" if codec == "none" else codec
    named: dict[tuple, list[int]] = {}
    for index, (name, t) in enumerate(tensors):
        named.setdefault(_kind(name, t), []).append(index)
    # A last name part no other tensor has (``v0``, ``v1``...) says nothing of the values: such tensors are batched
    # by device and dtype alone, not each in a batch of its own.
    batches: dict[tuple, list[int]] = {}
    for (device, dtype, part, tiny), indices in named.items():
        batches.setdefault((device, dtype, part if len(indices) > 1 else None, tiny), []).extend(indices)
    # Tiny tensors' batches first: they cost their writer a record each and their coder next to nothing, so their
    # writing runs while the large batches are coded instead of after the last of them. Streamed tensors before
    # them: their jobs only queue their segments, and their writing can start at once.
    cuts = [
        (device, tiny, batch, "raw" if tiny else coder)
        for (device, _, _, tiny), indices in sorted(batches.items(), key=lambda kind: not kind[0][3])
        for batch in _cut(indices, tensors, engines.segment_nbytes(device, "raw" if tiny else coder), device)
    ]
    if streamed:
        cuts.sort(key=lambda cut: not _streams(tensors[cut[2][0]][1], cut[0], cut[3]))
    jobs = [
        (device, tiny, functools.partial(_code_batch, tensors, batch, c, streamed)) for device, tiny, batch, c in cuts
    ]
    ahead = min(BATCHES_AHEAD, cpu_threads() // 4)
    pool = shared("items-pool", lambda: ThreadPoolExecutor(BATCHES_AHEAD, thread_name_prefix="lnv-items"))
    pending: deque[Future[list[tuple[int, CodedTensor]]]] = deque()
    for device, tiny, job in jobs:
        if device.type != "cpu":
            while pending:
                yield pending.popleft().result()
            yield job()
        elif ahead >= 2 or tiny:
            if len(pending) >= max(ahead, 1):
                yield pending.popleft().result()
            pending.append(pool.submit(job))
        else:  # few cores: coded here, beside the tiny batches a pool thread codes meanwhile
            done = job()
            while pending:
                yield pending.popleft().result()
            yield done
    while pending:
        yield pending.popleft().result()


def _streams(t: torch.Tensor, device: torch.device, coder: str) -> bool:
    """Whether :func:`code_tensors` streams ``t``: a CPU tensor larger than a segment (so alone in its batch)."""
    return device.type == "cpu" and t.numel() * t.element_size() > engines.segment_nbytes(device, coder)


def _code_batch(
    tensors: list[tuple[str, torch.Tensor]], batch: list[int], coder: str, streamed: bool = False
) -> list[tuple[int, CodedTensor]]:
    """Code the tensors ``batch`` indexes (one kind, see :func:`_cut`) together with ``coder`` (``streamed``: as
    for :func:`code_tensors`)."""
    datas = [_bytes(tensors[i][1]) for i in batch]
    dtype, device = tensors[batch[0]][1].dtype, datas[0].device
    if coder == "raw":  # one layout: nothing to learn, nor to look up by the tensors' addresses
        coded = _encode(datas, dtype, coder, raw_layout(), streamed)
    else:
        layouts = shared("layouts", _LayoutCache)
        key = (coder, dtype, "batch", tuple((d.device, d.data_ptr(), d.numel()) for d in datas))
        coded = _encode(datas, dtype, coder, layouts.get(key), streamed)
        if coded:
            layouts.put(key, coded[0][0].layout)
    return [
        (i, CodedTensor(tensors[i][0], tensors[i][1].dtype, tuple(tensors[i][1].shape), device.type, *c))
        for i, c in zip(batch, coded)
    ]


def _encode(
    datas: list[torch.Tensor], dtype: torch.dtype, coder: str, layout: Layout | None, streamed: bool = False
) -> list[tuple[records.Coding, Iterable[records.Segment]]]:
    """A batch's buffers coded with ``layout`` (None: chosen on them): together, or a buffer larger than a segment
    alone in its batch (in several segments; ``streamed`` and coded on the CPU: as an iterator of them, coding)."""
    if datas[0].numel() > engines.segment_nbytes(datas[0].device, coder):
        encoder = records.Encoder(datas[0], dtype, coder, layout=layout)
        segments = iter(encoder)  # on the CPU, every segment is queued for coding here
        return [(encoder.coding, segments if streamed and encoder.data.device.type == "cpu" else list(segments))]
    return list(batch_coding.encode_batch(datas, dtype, coder, layout))


def _cut(
    indices: list[int], tensors: list[tuple[str, torch.Tensor]], segment: int, device: torch.device
) -> Iterator[list[int]]:
    """Consecutive runs of ``indices`` of at most :data:`BATCH_NBYTES` (for ``device``); a tensor larger than
    ``segment`` alone."""
    limit = BATCH_NBYTES.get(device.type, BATCH_NBYTES["cpu"])
    run: list[int] = []
    nbytes = 0
    for i in indices:
        t = tensors[i][1]
        size = t.numel() * t.element_size()
        if size > segment:
            yield [i]
            continue
        if run and nbytes + size > limit:
            yield run
            run, nbytes = [], 0
        run.append(i)
        nbytes += size
    if run:
        yield run


def code_deltas(
    items: list[tuple[str, torch.Tensor, BaseFile]], codec: str
) -> Iterator[tuple[list[tuple[int, CodedTensor]], list[int]]]:
    """Code each ``(name, tensor, base)`` of ``items`` (:func:`storable`) as a delta against the one record of its
    base (an item of an earlier save), as :func:`code_tensors` codes tensors: in runs of one device and dtype of up to
    :data:`BATCH_NBYTES`, each run's bases decoded and its transforms chosen together
    (:func:`~lightning_nvcomp.format.delta.transformed_against`), then its transformed bytes coded in batches. Yields,
    run by run, the coded deltas as ``(index, coded)`` pairs, and the indices of the tensors that cannot be deltas or
    code smaller alone (another dtype or size than the base's, ``codec="none"``, a tiny tensor): for the caller to code
    alone."""
    alone: list[int] = []
    runs: dict[tuple, list[int]] = {}
    for i, (_, t, base) in enumerate(items):
        nbytes = t.numel() * t.element_size()
        fits = len(base.records) == 1 and base.records[0].fits(t.dtype, [[0, nbytes]])
        if codec == "none" or nbytes < RAW_NBYTES or not fits:
            alone.append(i)
        else:
            runs.setdefault((t.device, t.dtype), []).append(i)
    if alone:
        yield [], alone
    tensors = [(name, t) for name, t, _ in items]
    for (device, dtype), indices in runs.items():
        for run in _cut(indices, tensors, engines.segment_nbytes(device, codec), device):
            if len(run) == 1 and _bytes(items[run[0]][1]).numel() > engines.segment_nbytes(device, codec):
                large = _code_large(*items[run[0]], codec)  # its base decoded a range at a time, as it is coded
                yield ([(run[0], large)], []) if large is not None else ([], run)
                continue
            found = delta.transformed_against([(_bytes(items[i][1]), items[i][2]) for i in run], dtype, codec)
            coded = [(i, f) for i, f in zip(run, found) if f is not None]
            shaped = [(items[i][0], data.view(dtype).reshape(items[i][1].shape)) for i, (data, _) in coded]
            done = []
            for batch in code_tensors(shaped, codec):
                for k, result in batch:
                    result.fields = {"delta": coded[k][1][1]}
                    done.append((coded[k][0], result))
            yield done, [i for i, f in zip(run, found) if f is None]


def _code_large(name: str, t: torch.Tensor, base: BaseFile, codec: str) -> CodedTensor | None:
    """A tensor larger than a segment coded as a delta against its base's record, the base decoded a range at a time
    as its segments are coded; None where it codes smaller alone."""
    data = _bytes(t)
    against = delta.encode_against([data], [[0, data.numel()]], t.dtype, codec, base, base.records[0])
    if against is None:
        return None
    parts, field = against
    encoder = records.Encoder(parts, t.dtype, codec)
    return CodedTensor(name, t.dtype, tuple(t.shape), data.device.type, encoder.coding, list(encoder), {"delta": field})
