"""The private torch names the DCP storage relies on: each is named here and nowhere else in the package, with why it
is needed and a gate on the installed torch.

pyproject claims ``torch>=2.4``; the tests run on the torch of ``.venv`` (2.13). A gate checks the torch version
(:data:`TORCH`, parsed from ``torch.__version__``) against the first release known to have the name, and that the name
is there (a later release may drop it). Where it is missing, a public equivalent is used if there is one; otherwise
the feature that needs it raises a ``RuntimeError`` naming the name and the installed torch. Importing fails only
where torch's DCP itself is older than the package supports or lacks what every checkpoint needs.

And one seam on other frameworks' use of DCP: the names ``torch.distributed.checkpoint.FileSystemWriter`` /
``FileSystemReader`` as Accelerate's FSDP checkpoint functions (``accelerate.utils.fsdp_utils``, 0.2x-1.16) and
Lightning's ``FSDPStrategy.load_checkpoint`` (2.1-2.6, FSDP1's optimizer state) look them up: they make DCP's writer
or reader themselves, with no way to pass one in, resolving the names on ``torch.distributed.checkpoint`` at each
call. The names are torch's public ones; that those frameworks resolve them there and then is their internal
detail. :func:`filesystem_classes_as` points them at the compressed writer's and reader's factories while such a call
runs (torch's own code imports the classes from ``torch.distributed.checkpoint.filesystem`` and does not see it).
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import IO, Any, NoReturn

import torch
import torch.distributed.checkpoint as _dist_cp
import torch.distributed.checkpoint.filesystem as _filesystem
import torch.distributed.checkpoint.metadata as _metadata
from torch.distributed.checkpoint.planner import ReadItem, WriteItem

from lightning_nvcomp._process import swapped


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.13.0+cpu"``, ``"2.5.0a0+git1234"``)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


#: The installed torch's ``(major, minor)``.
TORCH = _release(torch.__version__)
#: The oldest torch the package claims (pyproject's ``torch>=2.4``).
MIN_TORCH = (2, 4)
_KNOWN = "known in torch 2.4 to 2.13"

if TORCH < MIN_TORCH:
    raise ImportError(
        f"lightning_nvcomp.dcp needs torch >= 2.4 (torch.distributed.checkpoint), not {torch.__version__}"
    )


def _has(since: tuple[int, int], owner: object, name: str) -> bool:
    """The gate: torch is at least ``since`` (the first release known to have ``name``) and ``owner`` has ``name``."""
    return TORCH >= since and hasattr(owner, name)


def _module(name: str) -> ModuleType | None:
    """A private torch module, or None where this torch has none by that name."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _missing(name: str, why: str) -> NoReturn:
    raise RuntimeError(
        f"lightning_nvcomp.dcp needs torch's private {name} ({why}), which torch {torch.__version__} does not have "
        f"({_KNOWN})"
    )


def _required(module: str, names: str, why: str) -> ImportError:
    return ImportError(
        f"lightning_nvcomp.dcp needs {names} from torch's private {module} ({why}), which torch {torch.__version__} "
        f"does not have ({_KNOWN})"
    )


# -- imported names: every supported torch has them (DCP imports them itself), so a missing one fails the import ---

# _StorageInfo (2.0+): DCP's per-item storage record; NvcompStorageInfo extends it (DCP's reader reads our items).
if not _has((2, 0), _filesystem, "_StorageInfo"):
    raise _required("torch.distributed.checkpoint.filesystem", "_StorageInfo", "the record NvcompStorageInfo extends")
StorageInfo = _filesystem._StorageInfo

try:
    # ShardedTensor, Shard (1.12+): FSDP1's sharded state dicts hold them; this private module is their only home.
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
except ImportError as err:
    raise _required("torch.distributed._shard.sharded_tensor", "ShardedTensor", "sharded state dicts") from err

# DTensor (2.1+): public as torch.distributed.tensor.DTensor from 2.5; torch 2.4 has only the private module.
if TORCH >= (2, 5):
    from torch.distributed.tensor import DTensor
else:
    from torch.distributed._tensor import DTensor  # the same class, where 2.4 has it

_SHARD_UTILS = _module("torch.distributed._shard._utils")
_STATE_DICT_UTILS = _module("torch.distributed._state_dict_utils")

#: Whether ``BlockingAsyncStager.stage`` (``FileSystemWriter.stage``, what ``dcp.async_save`` stages with) copies
#: every tensor, as it does from torch 2.8 (``_create_cpu_state_dict`` then ``_copy_state_dict``). Torch 2.4-2.6 move
#: tensors with ``.to("cpu")``, which returns a CPU tensor (or a DTensor on a CPU mesh) itself, not a copy; 2.7 copies
#: tensors and DTensors but keeps ShardedTensors as they are: training that goes on after ``async_save`` returned
#: changes what is saved. Where False, the writer stages a copy itself (tests/test_dcp.py's async scenarios).
STAGE_COPIES = TORCH >= (2, 8)

__all__ = [
    "MIN_TORCH",
    "STAGE_COPIES",
    "TORCH",
    "DTensor",
    "Shard",
    "ShardedTensor",
    "StorageInfo",
    "dtensor_like",
    "dtensor_local",
    "filesystem_classes_as",
    "iterate_state_dict",
    "load_transformed",
    "metadata_path",
    "narrow_tensor_by_index",
    "private_metadata_names",
    "reader_init_args",
    "set_placement_device",
    "sharded_like",
    "split_by_size_and_type",
    "stamp_dcp_version",
    "torch_zip_reader",
    "transform_descriptors",
    "use_collectives",
]


# -- the writer ---------------------------------------------------------------------------------------------------


def split_by_size_and_type(bins: int, items: list[WriteItem]) -> list[list[WriteItem]]:
    """``_split_by_size_and_type`` (2.0+): DCP's split of a rank's items into ``thread_count`` files (byte items
    round-robin, tensors by size), so our files are cut as ``FileSystemWriter``'s are. Fallback: round-robin."""
    if _has((2, 0), _filesystem, "_split_by_size_and_type"):
        return _filesystem._split_by_size_and_type(bins, items)
    return [items] if bins == 1 else [items[i::bins] for i in range(bins)]


def stamp_dcp_version(metadata: Any) -> None:
    """``filesystem.CURRENT_DCP_VERSION`` and ``Metadata.version`` (in 2.13, not in 2.4-2.8): the DCP format version
    ``FileSystemWriter.finish`` stamps on ``.metadata``. Where torch has no such constant, its metadata has no
    version and its reader reads none: nothing is stamped."""
    version = getattr(_filesystem, "CURRENT_DCP_VERSION", None)
    if version is not None:
        metadata.version = version


def use_collectives(writer: Any) -> bool:
    """``FileSystemWriter.use_collectives`` (in 2.13, not in 2.4-2.8; ``use_collectives=False``: every rank writes a
    rank-local ``__<rank>.metadata``). Where torch has no such attribute, every save is collective, one ``.metadata``
    for all ranks."""
    return bool(getattr(writer, "use_collectives", True))


def iterate_state_dict(state_dict: Any, sharded: Callable, dtensor: Callable, tensor: Callable) -> Any:
    """``torch.distributed._state_dict_utils._iterate_state_dict`` (2.4+, the release whose callbacks take
    ``companion_obj``): the walk DCP's own staging copies a state dict with, so a staged state dict keeps DCP's
    structure. No fallback: compressing while staging needs it (``stage_compress="none"`` does not)."""
    if _STATE_DICT_UTILS is None or not _has((2, 4), _STATE_DICT_UTILS, "_iterate_state_dict"):
        _missing("_state_dict_utils._iterate_state_dict", "compressing while staging; use stage_compress='none'")
    return _STATE_DICT_UTILS._iterate_state_dict(state_dict, sharded, dtensor, tensor, type_check=False)


def dtensor_local(d: Any) -> torch.Tensor:
    """``DTensor._local_tensor`` (2.1+): the local shard itself, with no autograd op or wait on a pending collective
    (``to_local()`` has both). Fallback: ``to_local()``."""
    return d._local_tensor if _has((2, 1), d, "_local_tensor") else d.to_local()


def dtensor_like(d: Any, local: torch.Tensor) -> Any:
    """A DTensor with ``d``'s sharding around another local tensor: ``DTensor(local, d._spec, requires_grad=False)``
    (2.1+; ``_spec`` is the placement and global shape, no collective or check). Fallback: ``DTensor.from_local``."""
    if _has((2, 1), d, "_spec"):
        return DTensor(local, d._spec, requires_grad=False)
    return DTensor.from_local(local, d.device_mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride())


def set_placement_device(metadata: Any, device: torch.device) -> None:
    """Point a shard's placement (a ``_remote_device``) at ``device`` through its ``_device`` (1.10+; the public
    ``device()`` has no setter), as DCP's staging does for shards copied to the CPU. No fallback."""
    placement = metadata.placement
    if placement is None:
        return
    if not _has((2, 0), placement, "_device"):
        _missing("_remote_device._device", "staging a ShardedTensor; use stage_compress='none'")
    placement._device = device


def sharded_like(st: Any, shards: list[Any], metadata: Any) -> Any:
    """A ShardedTensor like ``st`` holding other local shards: ``ShardedTensor._init_from_local_shards_and_global_metadata``
    with ``st._process_group`` and ``st._init_rrefs`` (1.12+; no public constructor takes the global metadata, and
    rebuilding it would need a collective). No fallback."""
    if not (_has((2, 0), ShardedTensor, "_init_from_local_shards_and_global_metadata") and hasattr(st, "_init_rrefs")):
        _missing("ShardedTensor._init_from_local_shards_and_global_metadata", "staging a ShardedTensor")
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, sharded_tensor_metadata=metadata, process_group=st._process_group, init_rrefs=st._init_rrefs
    )


# -- the reader ---------------------------------------------------------------------------------------------------


def reader_init_args(path: Any, extension_registry: Any) -> tuple[Any, ...]:
    """``FileSystemReader``'s arguments: ``(path, _extension_registry)`` from 2.7 (the experimental registry of
    stream extensions), the path alone before; a registry given to an older torch is refused."""
    if TORCH >= (2, 7):
        return (path, extension_registry)
    if extension_registry is not None:
        _missing("FileSystemReader(_extension_registry=)", "DCP stream extensions")
    return (path,)


def metadata_path(reader: Any, rank: int | None) -> Any:
    """``FileSystemReader._get_metadata_path`` (newer than 2.8: not in 2.4-2.8): where ``.metadata`` is
    (``__<rank>.metadata`` for rank-local files, ``use_collectives=False``). Fallback: the same names."""
    if _has((2, 9), reader, "_get_metadata_path"):
        return reader._get_metadata_path(rank)
    return reader.fs.concat_path(reader.path, ".metadata" if rank is None else f"__{rank}.metadata")


def transform_descriptors(info: Any) -> Sequence[str]:
    """``_StorageInfo.transform_descriptors`` (2.7+, DCP's stream extensions): the transforms applied to an item's
    bytes; none before 2.7."""
    return (getattr(info, "transform_descriptors", None) or ()) if TORCH >= (2, 7) else ()


def load_transformed(reader: Any, req: ReadItem, descriptors: Sequence[str], view: Any) -> IO[bytes]:
    """Undo an item's stream transforms with the reader's ``transforms`` (2.7+, where items can have them)."""
    transforms = getattr(reader, "transforms", None)
    if TORCH < (2, 7) or transforms is None:
        _missing("FileSystemReader.transforms", f"stream transforms {list(descriptors)!r}")
    return transforms.transform_load_stream(req, descriptors, view)


def private_metadata_names() -> tuple[dict[str, type], dict[str, Callable[..., Any]]]:
    """The private torch names a DCP ``.metadata`` pickles, each under the name it is pickled as, for the restricted
    unpickler (:mod:`~lightning_nvcomp.integrations.dcp.unpickle`): ``(classes made empty and given their fields,
    callables called for a value)``. ``filesystem._StorageInfo`` (2.0+): every item's storage record;
    ``metadata._MEM_FORMAT_ENCODING`` (2.0+): the enum ``TensorProperties`` pickles a memory format as (called for
    its member); ``serialization._get_layout`` (1.x+): how a ``torch.layout`` pickles (called with its name). A name
    this torch lacks is left out: a file that names it is refused, naming it."""
    classes: dict[str, type] = {_name(StorageInfo): StorageInfo}
    callables: dict[str, Callable[..., Any]] = {}
    if _has((2, 0), _metadata, "_MEM_FORMAT_ENCODING"):
        callables[_name(_metadata._MEM_FORMAT_ENCODING)] = _metadata._MEM_FORMAT_ENCODING
    if _has((1, 0), torch.serialization, "_get_layout"):
        callables["torch.serialization._get_layout"] = torch.serialization._get_layout
    return classes, callables


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def narrow_tensor_by_index(tensor: torch.Tensor, offsets: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    """``torch.distributed._shard._utils.narrow_tensor_by_index`` (2.0+): the part of a stored chunk a read item asks
    for, cut as DCP's reader cuts it. Fallback: the same narrowing."""
    if _SHARD_UTILS is not None and _has((2, 0), _SHARD_UTILS, "narrow_tensor_by_index"):
        return _SHARD_UTILS.narrow_tensor_by_index(tensor, offsets, sizes)
    for dim, (offset, size) in enumerate(zip(offsets, sizes)):
        if size < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, size)
    return tensor


def torch_zip_reader() -> Callable[[IO[bytes]], object] | None:
    """``torch._C.PyTorchFileReader`` (1.x+): torch's own zip reader (miniz), which refuses some damage ``zipfile``
    ignores. Fallback: None (the ``zipfile`` checks alone)."""
    return getattr(torch._C, "PyTorchFileReader", None) if TORCH >= (2, 0) else None


# -- the names other frameworks look DCP's storage classes up by -------------------------------------------------


def filesystem_classes_as(
    writer: Callable[..., Any] | None = None, reader: Callable[..., Any] | None = None
) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``torch.distributed.checkpoint.FileSystemWriter`` is ``writer`` and ``FileSystemReader``
    is ``reader`` (each where given); DCP's own classes are put back after, also when the block fails
    (:func:`~lightning_nvcomp._process.swapped`)."""
    given = {name: value for name, value in (("FileSystemWriter", writer), ("FileSystemReader", reader)) if value}
    return swapped(_dist_cp, given)
