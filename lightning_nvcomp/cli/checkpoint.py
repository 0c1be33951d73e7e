"""A checkpoint as the commands see it: what it holds, read without decoding anything, and a load that shows its
progress."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from lightning_nvcomp import format as fileformat
from lightning_nvcomp.format import DTYPES, TensorInfo
from lightning_nvcomp.format.bases import chain
from lightning_nvcomp.format.contents import leaves
from lightning_nvcomp.telemetry.stats import ratio


@dataclass(frozen=True)
class Entry:
    """One tensor of a checkpoint and the record (or plain storage) that holds it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    codec: str
    holder: tuple[str, int]  # identity of the record or storage, shared by the tensors it holds
    raw_nbytes: int  # of the whole record or storage
    stored_nbytes: int

    @property
    def ratio(self) -> float:
        return ratio(self.raw_nbytes, self.stored_nbytes)


@dataclass(frozen=True)
class Survey:
    """What :func:`fileformat.describe` tells about the checkpoint at ``path``, flattened."""

    path: str
    entries: list[Entry]
    gans_writers: list[str]  # nvCOMP versions that wrote the gANS records; empty if there are none

    def holders(self) -> dict[tuple[str, int], Entry]:
        """One entry per record or storage: the first tensor held by each."""
        first: dict[tuple[str, int], Entry] = {}
        for entry in self.entries:
            first.setdefault(entry.holder, entry)
        return first

    def raw_nbytes(self, compressed_only: bool = False) -> int:
        return sum(e.raw_nbytes for key, e in self.holders().items() if not compressed_only or key[0] == "record")

    def stored_nbytes(self) -> int:
        return sum(e.stored_nbytes for e in self.holders().values())

    def chain(self) -> list[str]:
        """The files it needs to load, nearest first (a delta checkpoint's chain of bases; empty for most)."""
        if not any(" delta" in e.codec for e in self.entries):
            return []
        return chain(self.path)

    def codecs(self) -> list[str]:
        """The codecs its records use (``raw``: planes stored as they are; ``torch``: plain storages), sorted."""
        return sorted({codec for e in self.holders().values() for codec in e.codec.split()[0].split("+")})


def _walk(obj: object) -> Iterator[tuple[str, TensorInfo | torch.Tensor]]:
    """Each TensorInfo and dense tensor of a described file, once, with its dotted path."""
    return leaves(
        obj,
        lambda item: isinstance(item, TensorInfo) or (isinstance(item, torch.Tensor) and item.layout == torch.strided),
    )


def _codec_label(rec: dict) -> str:
    """``zstd``, ``ans+raw 4 planes``, ``zstd delta 4 planes``, ``ans <f4``: the record's codecs (``raw`` last),
    whether it is coded against a base, and its layout."""
    label = "+".join(sorted(set(rec["codecs"]), key=lambda codec: (codec == "raw", codec)))
    if "delta" in rec:
        label += " delta"
    if rec["data_type"] != "|u1":
        return f"{label} {rec['data_type']}"
    return f"{label} {rec['planes']} planes" if rec["planes"] > 1 else label


def _plain_entry(name: str, tensor: torch.Tensor) -> Entry:
    """A tensor stored by plain torch.save: its storage holds it, uncompressed."""
    storage = tensor.untyped_storage()
    dtype = str(tensor.dtype).removeprefix("torch.")
    nbytes = tensor.numel() * tensor.element_size()
    held = storage.nbytes()
    # The storage's address identifies it: the file is mapped, each storage at its own offset.
    holder = ("storage", storage.data_ptr())
    return Entry(name, dtype, tuple(tensor.shape), nbytes, "torch", holder, held, held)


def survey(path: str) -> Survey:
    """Describe ``path``, decoding nothing."""
    found: Iterable[tuple[str, TensorInfo | torch.Tensor]]
    try:
        found = _walk(fileformat.describe(path))  # records are validated: their fields can be trusted below
    except (TypeError, AttributeError, NotImplementedError):  # a nested or quantized tensor: decode its parts
        decoded: list[TensorInfo] = []
        fileformat.describe(path, infos=decoded)
        found = ((info.name, info) for info in decoded)
    entries, writers = [], set()
    for name, item in found:
        if isinstance(item, torch.Tensor):
            entries.append(_plain_entry(name, item))
            continue
        rec = item.record
        if "ans" in rec["codecs"]:
            writers.add(str(rec.get("nvcomp") or "unknown"))
        nbytes = math.prod(item.shape) * DTYPES[item.dtype].itemsize
        holder = ("record", id(rec))
        entries.append(
            Entry(name, item.dtype, item.shape, nbytes, _codec_label(rec), holder, rec["nbytes"], item.stored_nbytes)
        )
    return Survey(path, entries, sorted(writers))


def load(surveyed: Survey, map_location: str, quiet: bool) -> Any:
    """Load (and so verify) the surveyed file, with a progress bar on stderr over the raw bytes of its records."""
    total = surveyed.raw_nbytes(compressed_only=True)
    disable = True if quiet or not total else None  # None: tqdm disables itself when stderr is not a TTY
    with tqdm(total=total, unit="B", unit_scale=True, desc="decoding", leave=False, disable=disable) as bar:
        with fileformat.decode_progress(bar.update):
            return fileformat.load(surveyed.path, map_location=map_location)
