"""What a state holds: its leaves, found through its containers (:func:`leaves`: the writer's tensor names, the DCP
writer's local shards, the CLI's listing and the benchmarks' comparisons all see the same tensors in the same
order), and what ``torch.save`` would store of it: the dense tensors stored through ``decode_tensor`` and the
storages of everything else, found by a dry-run pickle (:func:`find_contents`)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch

from lightning_nvcomp._compat.torch import tensor_state
from lightning_nvcomp.errors import CheckpointError

_DTYPE_NAMES = (
    "float64 float32 float16 bfloat16 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu "
    "complex32 complex64 complex128 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool"
).split()


#: The dtypes this format stores, by name (those the installed torch knows).
DTYPES = {name: getattr(torch, name) for name in _DTYPE_NAMES if hasattr(torch, name)}


def leaves(
    obj: object, accept: Callable[[object], bool], *, sort_keys: bool = False, once: bool = True
) -> Iterator[tuple[str, Any]]:
    """Each item of ``obj`` that ``accept`` takes, found through dicts (any mapping), lists and tuples, depth first
    in their order, with its dotted path (``"optimizer.state.0.exp_avg"``; ``"<root>"`` for ``obj`` itself).

    Args:
        obj: the state to walk; a container reached twice (or through itself) is walked once.
        accept: which items are leaves; an accepted item is not walked into, even if it is a container.
        sort_keys: visit mapping keys in sorted order (by ``str``) instead of insertion order, so two states built in
            different orders give their leaves in the same order.
        once: yield an item reached through several paths once, at the first; ``False`` yields it at every path.
    """
    seen: set[int] = set()
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        item, path = stack.pop()
        if accept(item):
            if not once or id(item) not in seen:
                seen.add(id(item))
                yield path or "<root>", item
        elif isinstance(item, (Mapping, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            if isinstance(item, Mapping):
                keys = sorted(item, key=str) if sort_keys else list(item)
                pairs = [(item[key], key) for key in keys]
            else:
                pairs = [(value, index) for index, value in enumerate(item)]
            stack.extend((value, f"{path}.{key}" if path else str(key)) for value, key in reversed(pairs))


def _eligible(obj: object) -> TypeGuard[torch.Tensor]:
    return (
        isinstance(obj, torch.Tensor)
        and type(obj) in (torch.Tensor, torch.nn.Parameter)
        and obj.layout == torch.strided
        and not obj.is_nested  # a nested tensor of strided layout: torch pickles it as its parts
        and obj.device.type in ("cpu", "cuda")
        and str(obj.dtype).removeprefix("torch.") in DTYPES
        and not obj.is_conj()
        and not obj.is_neg()
    )


class _NullSink:
    def write(self, data: bytes) -> int:
        return len(data)


@dataclass
class Contents:
    """What ``torch.save`` would store of an object, found by a dry-run pickle.

    ``tensors``: the dense tensors stored through :func:`decode_tensor`, in pickling order (those their Python
    attributes hold included). ``storages``: the storages of every other tensor (conj/neg views, subclasses, sparse,
    quantized and nested parts, dtypes the format does not name) and storages saved as such, by ``_cdata``:
    ``(storage, dtype name or None for an untyped storage)``; they are stored through :func:`decode_storage`.
    ``kept``: every object the save must not copy (it holds or is what was found).
    """

    tensors: list[torch.Tensor]
    storages: dict[int, tuple[torch.UntypedStorage, str | None]]
    kept: list[object]

    @property
    def nbytes(self) -> int:
        """The bytes of every storage held, each once however many tensors view it: what a save stores raw."""
        held = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in self.tensors}
        held.update((key, storage.nbytes()) for key, (storage, _) in self.storages.items())
        return sum(held.values())


def _storage_of(obj: object) -> tuple[torch.UntypedStorage | None, str | None]:
    """A storage object's untyped storage and dtype name (None for an untyped one); (None, None) for anything else."""
    if isinstance(obj, torch.storage.TypedStorage):
        return obj._untyped_storage, str(obj.dtype).removeprefix("torch.")
    if isinstance(obj, torch.UntypedStorage):
        return obj, None
    return None, None


class _ContentsFinder(pickle.Pickler):
    """A dry-run pickle that notes the tensors and storages torch.save would meet (a module-level class: a local one
    would keep what it found alive in a reference cycle until the next garbage collection)."""

    PROTOCOL = 2  # torch.save's

    def __init__(self) -> None:
        super().__init__(_NullSink(), protocol=self.PROTOCOL)
        self.tensors: dict[int, torch.Tensor] = {}
        self.storages: dict[int, tuple[torch.UntypedStorage, str | None]] = {}
        self.kept: dict[int, object] = {}

    def persistent_id(self, item: object) -> object:
        untyped, dtype = _storage_of(item)
        if untyped is None:
            return None
        seen = self.storages.setdefault(untyped._cdata, (untyped, dtype))
        if dtype is not None and seen[1] is None:
            self.storages[untyped._cdata] = (untyped, dtype)
        elif dtype is not None and seen[1] != dtype:
            raise CheckpointError(
                f"two tensors view one storage as {seen[1]} and {dtype}; torch.save refuses this too: save a copy "
                "of one of them"
            )
        return "storage"

    def reducer_override(self, item: object) -> Any:
        if _eligible(item):
            self.tensors.setdefault(id(item), item)
            state = tensor_state(item)  # its Python attributes, stored with it: the tensors they hold too
            return (int, (), state) if state else (int, ())
        if isinstance(item, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage)):
            self.kept.setdefault(id(item), item)
        if not isinstance(item, torch.Tensor):
            return NotImplemented
        try:  # torch's own reduction, as torch.save pickles it
            return item.__reduce_ex__(self.PROTOCOL)
        except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError) as err:
            raise _Unsaveable(item, err) from err


class _Unsaveable(Exception):
    """torch cannot pickle this tensor (torch.save refuses it too)."""

    def __init__(self, tensor: torch.Tensor, cause: Exception) -> None:
        super().__init__(str(cause))
        self.tensor = tensor


def find_contents(obj: object) -> Contents:
    """The tensors and storages ``torch.save`` would meet in ``obj``."""
    finder = _ContentsFinder()
    try:
        finder.dump(obj)
    except _Unsaveable as err:
        t = err.tensor
        name = _tensor_names(obj).get(id(t), "<unnamed>")
        raise CheckpointError(
            f"tensor {name!r} ({type(t).__name__} of layout {t.layout}, dtype {t.dtype}, on {t.device}) cannot be "
            f"saved, by torch.save either ({err}): convert it to a dense CPU or CUDA tensor first"
        ) from err
    tensors = list(finder.tensors.values())
    return Contents(tensors, finder.storages, [*tensors, *finder.kept.values()])


def _tensor_names(obj: object) -> dict[int, str]:
    """Dotted key paths of the tensors reachable through dicts, lists and tuples (for messages and inspect)."""
    return {id(t): path for path, t in leaves(obj, lambda item: isinstance(item, torch.Tensor))}
