"""``dcp.async_save``'s staging, compressed: :class:`Stager` compresses shards while copying a state dict (CUDA shards
on the GPU, so only compressed bytes reach host memory) and leaves a placeholder for each, which the writer swaps
back for the compressed shard (:class:`StagedShard`); :func:`local_tensors` lists a state dict's local shards."""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE

from lightning_nvcomp import format as fileformat
from lightning_nvcomp.integrations.dcp import _compat
from lightning_nvcomp.integrations.dcp._compat import DTensor, Shard, ShardedTensor
from lightning_nvcomp.tree import leaves

#: One shard is coded at a time per process (writer threads share the GPU coder; files are still written in parallel).
ENCODE_LOCK = threading.Lock()
#: Which devices' shards each ``stage_compress`` compresses while staging.
STAGE_DEVICES: dict[str, tuple[str, ...]] = {"gpu": ("cuda",), "all": ("cuda", "cpu"), "none": ()}


def local_tensors(state_dict: STATE_DICT_TYPE) -> list[torch.Tensor]:
    """The local tensors of a state dict: plain tensors, DTensor local shards, ShardedTensor local shards."""
    found: list[torch.Tensor] = []
    for _, obj in leaves(state_dict, lambda o: isinstance(o, (DTensor, ShardedTensor, torch.Tensor)), once=False):
        if isinstance(obj, DTensor):
            found.append(_compat.dtensor_local(obj))
        elif isinstance(obj, ShardedTensor):
            found.extend(s.tensor for s in obj.local_shards())
        else:
            found.append(obj)
    return [t.detach() for t in found if t.numel() and t.dtype in fileformat.DTYPES.values()]


def compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor whose storage holds exactly its elements (what gets stored), as DCP's writer does."""
    t = t.detach()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


class StagedShard:
    """A shard compressed while staging, stored in place of the copy that DCP's staging would have made."""

    __slots__ = ("placeholder", "raw_nbytes", "snap")

    def __init__(self, snap: fileformat.Snapshot, placeholder: torch.Tensor, raw_nbytes: int) -> None:
        # The placeholder is kept alive with the entry: its address identifies it and cannot be reused meanwhile.
        self.snap, self.placeholder, self.raw_nbytes = snap, placeholder, raw_nbytes


class Stager:
    """One staging: copies a state dict as DCP's staging does, compressing the shards on ``devices`` with ``codec``.
    :attr:`shards` maps each placeholder's storage address to its compressed shard."""

    def __init__(self, codec: str, devices: tuple[str, ...], staging_nbytes: int | None) -> None:
        self.codec, self.devices, self.staging_nbytes = codec, devices, staging_nbytes
        self.shards: dict[int, StagedShard] = {}

    def stage(self, state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
        staged = _compat.iterate_state_dict(state_dict, self._sharded, self._dtensor, lambda t, *_: self._tensor(t))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return staged

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if (
            t.device.type not in self.devices
            or t.numel() == 0
            or t.dim() == 0
            or t.dtype not in fileformat.DTYPES.values()
        ):
            return t.to("cpu", copy=True)
        src = compact(t)
        with ENCODE_LOCK:
            # isolate: the file is written while training goes on (with "none", CPU shards must be copied too)
            snap = fileformat.snapshot(src, self.codec, [src], isolate=True, staging_nbytes=self.staging_nbytes)
        # Never written to: a placeholder with the shard's shape for the planner (torch.empty touches no memory).
        placeholder = torch.empty(t.shape, dtype=t.dtype)
        self.shards[placeholder.untyped_storage().data_ptr()] = StagedShard(
            snap, placeholder, t.numel() * t.element_size()
        )
        return placeholder

    def _dtensor(self, d: Any, pg: Any, device: Any, companion: Any) -> Any:
        if d.dim() == 0:
            return d.to("cpu")
        return _compat.dtensor_like(d, self._tensor(_compat.dtensor_local(d)))

    def _sharded(self, st: Any, pg: Any, device: Any, companion: Any) -> Any:
        if not st.local_shards():
            return st
        cpu = torch.device("cpu")
        shards = []
        for shard in st.local_shards():
            meta = copy.deepcopy(shard.metadata)
            _compat.set_placement_device(meta, cpu)
            shards.append(Shard(self._tensor(shard.tensor), meta))
        st_meta = copy.deepcopy(st.metadata())
        for meta in st_meta.shards_metadata:
            _compat.set_placement_device(meta, cpu)
        return _compat.sharded_like(st, shards, st_meta)
