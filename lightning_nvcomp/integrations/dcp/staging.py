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
from lightning_nvcomp._compat import dcp as _compat
from lightning_nvcomp._compat.dcp import DTensor, Shard, ShardedTensor
from lightning_nvcomp.codec import pinned
from lightning_nvcomp.format.contents import leaves
from lightning_nvcomp.format.item_batches import CodedTensor, code_tensors, storable

#: One shard is coded at a time per process (writer threads share the GPU coder; files are still written in parallel).
ENCODE_LOCK = threading.Lock()
#: Which devices' shards each ``stage_compress`` compresses while staging.
STAGE_DEVICES: dict[str, tuple[str, ...]] = {"gpu": ("cuda",), "all": ("cuda", "cpu"), "none": ()}


def local_tensors_named(state_dict: STATE_DICT_TYPE) -> list[tuple[str, torch.Tensor]]:
    """The local tensors of a state dict with their dotted paths: plain tensors, DTensor local shards, ShardedTensor
    local shards (as they are, not detached)."""
    found: list[tuple[str, torch.Tensor]] = []
    for name, obj in leaves(state_dict, lambda o: isinstance(o, (DTensor, ShardedTensor, torch.Tensor)), once=False):
        if isinstance(obj, DTensor):
            found.append((name, _compat.dtensor_local(obj)))
        elif isinstance(obj, ShardedTensor):
            found.extend((name, s.tensor) for s in obj.local_shards())
        else:
            found.append((name, obj))
    return found


def local_tensors(state_dict: STATE_DICT_TYPE) -> list[torch.Tensor]:
    """The local tensors of a state dict that hold data of a dtype the format names, detached."""
    found = [t.detach() for _, t in local_tensors_named(state_dict)]
    return [t for t in found if t.numel() and t.dtype in fileformat.DTYPES.values()]


def compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor whose storage holds exactly its elements (what gets stored), as DCP's writer does."""
    t = t.detach()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


class StagedShard:
    """A shard compressed while staging, stored in place of the copy that DCP's staging would have made."""

    __slots__ = ("coded", "placeholder")

    def __init__(self, coded: CodedTensor, placeholder: torch.Tensor) -> None:
        # The placeholder is kept alive with the entry: its address identifies it and cannot be reused meanwhile.
        self.coded, self.placeholder = coded, placeholder


class Stager:
    """One staging: copies a state dict as DCP's staging does, compressing the shards on ``devices`` with ``codec``
    (in batches, once every shard is found: :func:`~lightning_nvcomp.format.item_batches.code_tensors`).
    :attr:`shards` maps each placeholder's storage address to its compressed shard."""

    def __init__(self, codec: str, devices: tuple[str, ...]) -> None:
        self.codec, self.devices = codec, devices
        self.shards: dict[int, StagedShard] = {}
        self._names: dict[int, str] = {}
        self._pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (name, shard, placeholder)

    def stage(self, state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
        self._names = {id(t): name for name, t in local_tensors_named(state_dict)}
        staged = _compat.iterate_state_dict(state_dict, self._sharded, self._dtensor, lambda t, *_: self._tensor(t))
        with ENCODE_LOCK:
            pending, self._pending = self._pending, []
            # Held until written: pin what the GPU shards could need while the first ones are coded.
            with pinned.pool().holding(sum(t.numel() * t.element_size() for _, t, _ in pending if t.is_cuda)):
                for batch in code_tensors([(name, t) for name, t, _ in pending], self.codec):
                    for index, coded in batch:
                        placeholder = pending[index][2]
                        self.shards[placeholder.untyped_storage().data_ptr()] = StagedShard(coded, placeholder)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return staged

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        name = self._names.get(id(t), "<staged>")
        t = t.detach()
        if t.device.type not in self.devices or t.numel() == 0 or t.dim() == 0 or not storable(t):
            return t.to("cpu", copy=True)
        # Never written to: a placeholder with the shard's shape for the planner (torch.empty touches no memory).
        placeholder = torch.empty(t.shape, dtype=t.dtype)
        self._pending.append((name, t, placeholder))
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
