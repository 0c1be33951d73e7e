"""Records: a buffer of numbers compressed into blobs (:func:`encode`) and decoded back (:func:`decode`); the dict
that describes them, its fields and its validation are in :mod:`.schema`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from lightning_nvcomp._process import shared
from lightning_nvcomp.codec import checksum as checksums
from lightning_nvcomp.codec import pinned
from lightning_nvcomp.codec.checksum import Checksum, Crc32, crc32
from lightning_nvcomp.codec.cpu import cpu_threads
from lightning_nvcomp.codec.engines import codes_on_gpu, default_segment, engine_for, engine_on, work_device
from lightning_nvcomp.codec.gpu import nvcomp_version
from lightning_nvcomp.codec.layouts import choose_layout, plane_layout
from lightning_nvcomp.codec.schema import (
    FORMAT_VERSION,
    PLAIN_FORMAT,
    Layout,
    _chunk_lengths,
    _padded,
    _segments,
    checksum_field,
    fields_check,
    seal,
    validate,
)
from lightning_nvcomp.codec.segment import (
    Parts,
    Targets,
    _raw_sizes,
    concatenate,
    decode_segment,
    encode_segment,
    pack,
    stored_as_is,
)
from lightning_nvcomp.codec.upload import checked_upload
from lightning_nvcomp.errors import CorruptCheckpointError

#: The checksum of the blobs of the records written now (a record dict names it as the field that lists them).
CHECKSUM = "crc32c"
#: Bytes from the middle of data made a range at a time that its layout is chosen on (as the four windows
#: :func:`~lightning_nvcomp.codec.layouts.choose_layout` takes from data at hand).
_RANGED_SAMPLE_NBYTES = 16 << 20


def to_host(packed: torch.Tensor) -> torch.Tensor:
    """Coded bytes off the GPU, into the process's pinned pool (asynchronously, on the current stream)."""
    if packed.device.type == "cpu":
        return packed
    # Pinned memory: device-to-host copies run at full bus speed and without first-touch page faults.
    return pinned.pool().copy(packed)


def segment_pool() -> ThreadPoolExecutor:
    """The threads CPU segments are coded and decoded on (one per core)."""
    # Separate from the chunk pool the CPU engine uses inside each segment, so the two never wait on each other.
    return shared(
        "segment-pool", lambda: ThreadPoolExecutor(max_workers=cpu_threads(), thread_name_prefix="lnv-segment")
    )


@dataclass
class Segment:
    """One coded segment of a record: its blob (host memory, from the pinned pool when coded on a GPU), the stored size of
    each of its chunks, its CRC-32C (the record's checksum) and its zlib CRC-32 (the zip entry's), both computed on CPU
    threads while the next segment is coded."""

    blob: torch.Tensor
    sizes: list[int]
    crc: Checksum
    entry_crc: Checksum

    @classmethod
    def checked(cls, blob: torch.Tensor, sizes: list[int], ready: torch.cuda.Event | None = None) -> Segment:
        """The segment of ``blob``, its checksums started (``ready``: a CUDA event after the copy that fills it)."""
        if ready is None and blob.numel() <= checksums.PIECE_NBYTES:
            return cls(blob, sizes, crc32(blob, CHECKSUM), crc32(blob))
        return cls(blob, sizes, Crc32(blob, ready, CHECKSUM), Crc32(blob, ready))

    def checksum(self) -> int:
        """The blob's zlib CRC-32, the zip entry's (waits for it)."""
        return checksums.value(self.entry_crc)


class Encoder:
    """Codes one buffer, segment by segment: iterate it for the :class:`Segment` s as each lands in host memory
    (to be written while the next is coded); :func:`describe` then makes their record dict from :attr:`coding`.

    Args:
        data: 1-D contiguous uint8, the bytes of numbers of ``dtype``, on the CPU or a GPU; or its consecutive parts,
            each whole numbers (a record's storages and the zeros between them: coded on the CPU without joining
            them first); or a :class:`~lightning_nvcomp.codec.segment.Parts` whose ranges are made as they are coded
            (a delta record's).
        dtype: what the bytes are (it picks the byte planes).
        codec: ``"ans"``, ``"zstd"`` or ``"raw"`` (stored as is, still checksummed).
        segment: the bytes coded per engine call, a multiple of 512, and so the scratch memory (default
            :data:`~lightning_nvcomp.codec.engines.SEGMENT_NBYTES` on the GPU, at most
            :data:`~lightning_nvcomp.codec.engines.CPU_SEGMENT_NBYTES` on the CPU).
        layout: the layout to use instead of choosing one (by sampling the data): any layout codes any data of
            this size losslessly.

    Raises CodecUnavailableError for gANS without a GPU and nvCOMP.
    """

    def __init__(
        self,
        data: torch.Tensor | list[torch.Tensor] | Parts,
        dtype: torch.dtype,
        codec: str,
        segment: int | None = None,
        layout: Layout | None = None,
    ) -> None:
        parts: list[torch.Tensor] = data if isinstance(data, list) else [] if isinstance(data, Parts) else [data]
        device = data.device if isinstance(data, Parts) else parts[0].device if parts else torch.device("cpu")
        self.engine = engine_for(codec, device)
        on_gpu = codes_on_gpu(self.engine, device)
        segment = segment or default_segment(on_gpu)
        if segment <= 0 or segment % 512:
            raise ValueError(f"segment size {segment} must be a positive multiple of 512 bytes")
        self._ranged = isinstance(data, Parts) and not (on_gpu and device.type == "cpu")
        if isinstance(data, Parts) and not self._ranged:  # gANS codes it on the GPU: there, whole
            self.data = Parts([concatenate(data.slice(0, data.nbytes)).to("cuda")])
        elif isinstance(data, Parts):  # made a range at a time, on the device it is coded on
            self.data = data
        elif on_gpu or device.type != "cpu" or len(parts) == 1:
            parts = [concatenate(parts).to("cuda" if on_gpu else "cpu") if parts else torch.empty(0, dtype=torch.uint8)]
            self.data = Parts(parts)
        else:
            self.data = Parts(parts)
        if layout is None and self.data.one_tensor:
            layout = choose_layout(self.engine, self._sample(), dtype, codec)
        elif layout is None:  # several parts: coded on the CPU, where no layout is sampled
            layout = plane_layout(self.engine, self.data.nbytes, dtype, codec)
        self.coding = Coding(dtype, self.data.nbytes, layout, segment)

    def _sample(self) -> torch.Tensor:
        """The data whole, or for data made a range at a time, the middle range a layout is chosen on."""
        if not self._ranged:
            return self.data.parts[0]
        n = self.data.nbytes
        start = max(0, n // 2 - _RANGED_SAMPLE_NBYTES // 2) // 512 * 512
        return concatenate(self.data.slice(start, min(n - start, _RANGED_SAMPLE_NBYTES)))

    def __iter__(self) -> Iterator[Segment]:
        """The segments in order, each as it lands in host memory. On the CPU they are coded in parallel on CPU
        threads, all queued when this is called (not at the first ``next``): the data must not change until the last
        one is out."""
        spans = _segments(self.coding.nbytes, self.coding.segment)
        if self.data.device.type == "cpu":
            return segment_pool().map(self._cpu_segment, spans)
        return self._gpu_segments(spans)

    def _gpu_segments(self, spans: list[tuple[int, int]]) -> Iterator[Segment]:
        for start, length in spans:
            seg = concatenate(self.data.slice(start, length))
            if self.engine is None:  # stored raw: one copy to pinned host memory, no coding
                blob, sizes = _raw_blob(seg), _raw_sizes(length, self.coding.layout.chunk)
            else:
                pieces = encode_segment(self.engine, seg, self.coding.layout)
                blob, sizes = to_host(pack(pieces)), [p.numel() for p in pieces]
            ready = torch.cuda.Event()
            ready.record()
            yield Segment.checked(blob, sizes, ready)  # the CRCs on CPU threads, once the copy has landed

    def _cpu_segment(self, span: tuple[int, int]) -> Segment:
        seg = self.data.slice(*span)
        if self.engine is None:
            blob, sizes = _raw_blob(seg), _raw_sizes(span[1], self.coding.layout.chunk)
        else:
            pieces = encode_segment(self.engine, seg, self.coding.layout)
            blob, sizes = pack(pieces), [p.numel() for p in pieces]
        return Segment.checked(blob, sizes)


@dataclass(frozen=True)
class Coding:
    """How a buffer was coded (:attr:`Encoder.coding`): with its segments, all :func:`describe` needs."""

    dtype: torch.dtype
    nbytes: int
    layout: Layout
    segment: int


def describe(coding: Coding, sizes: list[int], crcs: list[Checksum], **fields: object) -> dict:
    """The sealed record dict of a buffer coded as ``coding``: its segments' chunk ``sizes`` (all, in order) and
    CRC-32s (waited for), with ``fields`` added before it is sealed (the writer adds where its storages lie)."""
    layout = coding.layout
    meta = {
        "format": FORMAT_VERSION if "delta" in fields else PLAIN_FORMAT,
        "dtype": str(coding.dtype).removeprefix("torch."),
        "nbytes": coding.nbytes,
        "planes": layout.planes,
        "data_type": layout.data_type,
        "codecs": list(layout.codecs),
        "chunk": layout.chunk,
        "rotate": layout.rotate,
        "segment": coding.segment,
        "sizes": sizes,
        CHECKSUM: [checksums.value(crc) for crc in crcs],
        "nvcomp": nvcomp_version() if "ans" in layout.codecs else None,
        **fields,
    }
    # The fields but the chunk sizes and CRCs are alike for many records (a DCP save's thousands of tiny items):
    # their canonical JSON, the check's costliest part, is built once per kind.
    key = (coding, meta["nvcomp"], repr(fields))
    fields_crc = _fields_crcs.get(key)
    if fields_crc is None:
        if len(_fields_crcs) >= 4096:
            _fields_crcs.clear()
        fields_crc = _fields_crcs[key] = fields_check(meta)
    return seal(meta, fields_crc)


#: :func:`describe`'s fields checks, by coding, nvCOMP version and the added fields' ``repr`` (not the fields
#: themselves: ``True == 1`` as a key, but not in JSON).
_fields_crcs: dict[tuple, int] = {}


def encode(
    data: torch.Tensor | list[torch.Tensor],
    dtype: torch.dtype,
    codec: str,
    segment: int | None = None,
    layout: Layout | None = None,
) -> tuple[list[torch.Tensor], dict]:
    """Compress ``data`` whole (see :class:`Encoder` for the arguments): one CPU uint8 blob per segment (pinned
    when coded on the GPU) and the sealed record dict."""
    encoder = Encoder(data, dtype, codec, segment, layout)
    segments = list(encoder)
    return [seg.blob for seg in segments], describe(
        encoder.coding, [n for seg in segments for n in seg.sizes], [seg.crc for seg in segments]
    )


def _raw_blob(seg: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """A segment (or its consecutive parts, in host memory) stored raw, as its blob: the bytes, then zeros up to a
    multiple of 16 (raw chunks are multiples of 16 but the last), in fresh host memory (from the pinned pool for a GPU
    segment)."""
    if isinstance(seg, torch.Tensor) and seg.device.type == "cuda":
        return pinned.pool().copy(seg, _padded(seg.numel()))
    parts = [seg] if isinstance(seg, torch.Tensor) else seg
    n = sum(part.numel() for part in parts)
    blob = torch.empty(_padded(n), dtype=torch.uint8)
    blob[n:] = 0
    at = 0
    for part in parts:
        blob[at : at + part.numel()].numpy()[:] = part.numpy()
        at += part.numel()
    return blob


def decode(
    blobs: list[torch.Tensor],
    meta: dict,
    device: torch.device | str = "cpu",
    move: bool = True,
    layout: Layout | None = None,
) -> torch.Tensor:
    """Return the record's raw bytes (1-D uint8) on ``device``, after checking every field and checksum.

    With ``move=False``, bytes decoded on a GPU for a CPU ``device`` (gANS has no CPU decoder) stay on the GPU, for
    the caller to copy wherever they belong. ``layout``: what :func:`validate` returned for exactly these ``blobs``
    and ``meta``, when the caller validated them already."""
    layout = _checked_layout(blobs, meta, layout)
    device = torch.device(device)
    work = work_device(layout, meta, device)
    out = torch.empty(meta["nbytes"], dtype=torch.uint8, device=work)
    decode_into(blobs, meta, [(0, out)], layout)
    return _delivered(out, device, move)


def decode_into(
    blobs: list[torch.Tensor],
    meta: dict,
    targets: Targets,
    layout: Layout | None = None,
    parallel: bool = True,
    after: Callable[[int, int], None] | None = None,
    undoing: list[tuple[str, int] | None] | None = None,
) -> None:
    """Decode the record straight into ``targets``: pieces of its bytes at their offsets, on the device
    :func:`~lightning_nvcomp.codec.engines.work_device` gives (bytes between pieces are not delivered), after checking
    every field and the checksum of every segment they lie in; ``layout`` as for :func:`decode`. Each storage of a
    record gets its own memory this way without a second copy; a range of a record costs the segments it lies in (the
    others' blobs may be stand-ins of their size: tensors on the ``meta`` device). ``parallel``: CPU segments on the
    segment threads (not from one of them). ``after``: called with each segment's ``(start, length)`` in the record
    on the thread that decoded it, once its bytes are in the targets (a delta's undoing, segment by segment).
    ``undoing``: for each target, None or a delta transform and its itemsize: the target holds bytes made with it
    against this record's, and the decoded bytes undo it there (a delta's base decoded into the delta's storages)."""
    layout = _checked_layout(blobs, meta, layout)
    if not targets:
        return
    if any(at % layout.planes or out.numel() % layout.planes for at, out in targets):
        raise CorruptCheckpointError(f"a storage of the record is not whole {layout.planes}-byte numbers")
    work = targets[0][1].device
    engine = engine_on(work) if set(layout.codecs) - {"raw"} else None
    jobs = _segment_jobs(blobs, meta, targets, layout, undoing or [None] * len(targets))
    field = checksum_field(meta)
    # On CPU threads each segment is checked right before the thread decodes it (a file read from the disk is read
    # by one thread while the other decodes, where checking every segment first would read it all before decoding),
    # or as it copies it (bytes stored as they are: an error before any of them is returned). Bound for a GPU, a blob
    # in pageable host memory (a file's mapping) is checked as it is uploaded; the others are checked first.
    on_threads = work.type == "cpu" and len(jobs) > 1 and parallel
    uploaded = {s for s, blob, *_ in jobs if work.type == "cuda" and blob.device.type == "cpu" and not blob.is_pinned()}
    if not on_threads:
        jobs = _checked_before(jobs, uploaded, meta, field, work)

    def run(job: tuple) -> None:
        s, stored, sizes, outs, length, undo = job
        copied, crc = on_threads and not any(undo) and stored_as_is(sizes, length, layout), meta[field][s]
        if on_threads:
            stored = stored.cpu()
            crc = checksums.copy_checked(stored, outs if copied else [], field)
        elif s in uploaded:
            stored, crc = checked_upload(stored, work, field)
        if crc != meta[field][s]:
            raise CorruptCheckpointError(f"checksum mismatch in segment {s} of the record: the file is damaged")
        if not copied:
            try:
                decode_segment(engine, stored.to(work), sizes, outs, length, layout, undo)
            except ValueError as err:
                raise CorruptCheckpointError(f"segment {s} of the record does not decode: {err}") from None
        if after is not None:
            after(s * meta["segment"], length)

    for _ in segment_pool().map(run, jobs) if on_threads else map(run, jobs):  # else here, in turn: no hand-off
        pass


def _segment_jobs(
    blobs: list[torch.Tensor], meta: dict, targets: Targets, layout: Layout, undoing: list[tuple[str, int] | None]
) -> list[tuple]:
    """For each segment that ``targets`` meet: its index, blob, chunk sizes, the targets' pieces in it at their
    offsets there, its length and each piece's ``undoing``."""
    jobs, pos = [], 0
    for s, (start, length) in enumerate(_segments(meta["nbytes"], meta["segment"])):
        count = len(_chunk_lengths(length, layout)) * layout.planes
        meeting = [
            ((max(at, start) - start, out[max(at, start) - at : min(at + out.numel(), start + length) - at]), undo)
            for (at, out), undo in zip(targets, undoing)
            if at < start + length and start < at + out.numel()
        ]
        if meeting:
            outs = [piece for piece, _ in meeting]
            jobs.append((s, blobs[s], meta["sizes"][pos : pos + count], outs, length, [u for _, u in meeting]))
        pos += count
    return jobs


def _checked_before(jobs: list[tuple], uploaded: set[int], meta: dict, field: str, work: torch.device) -> list[tuple]:
    """``jobs`` (see :func:`_segment_jobs`), the blob of each segment not ``uploaded`` checked (its CRC the record's)
    and, where it is not on ``work``, read into host memory."""
    checked = [job for job in jobs if job[0] not in uploaded]
    crcs, segments = [meta[field][job[0]] for job in checked], [job[0] for job in checked]
    hosts = dict(zip(segments, _checked_hosts([job[1] for job in checked], crcs, field, segments)))
    return [(s, hosts[s] if s in hosts and blob.device != work else blob, *rest) for s, blob, *rest in jobs]


def _checked_layout(blobs: list[torch.Tensor], meta: dict, layout: Layout | None) -> Layout:
    """The record's layout (``layout`` where the caller validated ``meta`` already), its blobs' types checked."""
    if not isinstance(blobs, list) or any(
        not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1 for b in blobs
    ):
        raise CorruptCheckpointError("record blobs are not a list of 1-D uint8 tensors")
    return layout or validate(meta, [b.numel() for b in blobs])


def _checked_hosts(
    blobs: list[torch.Tensor], crcs: list[int], algorithm: str, segments: list[int]
) -> list[torch.Tensor]:
    """The record's ``blobs`` (its ``segments``) in host memory, once each one's CRC (``algorithm``'s) is its ``crcs``
    entry (a large blob's computed in pieces on all the CRC threads). CorruptCheckpointError names the segment."""
    hosts = [b.cpu() for b in blobs]
    pending = [
        Crc32(h, algorithm=algorithm) if h.numel() > checksums.PIECE_NBYTES else crc32(h, algorithm) for h in hosts
    ]
    for s, got, want in zip(segments, pending, crcs):
        if checksums.value(got) != want:
            raise CorruptCheckpointError(f"checksum mismatch in segment {s} of the record: the file is damaged")
    return hosts


def _delivered(out: torch.Tensor, device: torch.device, move: bool) -> torch.Tensor:
    """The decoded bytes ``out`` on ``device``; bytes decoded on a GPU for the CPU stay there without ``move``."""
    if out.device.type == "cuda" and device.type == "cpu":
        if not move:
            return out
        # Pinned (torch's allocator: the caller keeps it): no first-touch page faults, and a copy back to a GPU is fast.
        host = torch.empty(out.numel(), dtype=out.dtype, pin_memory=True).copy_(out, non_blocking=True)
        torch.cuda.current_stream(out.device).synchronize()
        return host
    return out.to(device)
