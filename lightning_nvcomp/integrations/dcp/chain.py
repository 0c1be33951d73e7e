"""The delta chain of one rank's DCP saves (:class:`ItemChain`): which item of an earlier save each tensor item is
coded against.

A chain starts with a save whose items are stored alone (a keyframe); each later save of the chain codes an item
against the keyframe's item of the same fully qualified name, chunk offsets and chunk sizes, so that a save or a load
decodes one base however long the chain. The keyframe's ``.metadata`` must be written and lie in a directory beside
this save's (``run/step-10`` for ``run/step-20``: a delta names its base ``../step-10/<data file>``), by the same
world size. Anything else, and every ``keyframe_every`` saves, starts a new chain: a changed world size or sharding
(that item), a first save after a restart, a save into the keyframe's directory (its data files are deleted once the
new ``.metadata`` is written).

What a checkpoint needs is read from the ``.metadata`` of the directories beside it (each delta item names the
directory it is coded against), so a pruning that goes through :meth:`ItemChain.removable` keeps every directory a
kept checkpoint needs, and deletes it once none does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

from torch.distributed.checkpoint.planner import WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from lightning_nvcomp.errors import CheckpointError
from lightning_nvcomp.format.bases import BaseFile, base_file
from lightning_nvcomp.integrations.dcp.metadata import METADATA, NvcompStorageInfo, _load_metadata
from lightning_nvcomp.options import DeltaOptions
from lightning_nvcomp.storage import StorageBackend

#: An item as the chain finds its base: fully qualified name, chunk offsets, chunk sizes.
ItemKey = tuple[str, tuple[int, ...], tuple[int, ...]]


def item_key(item: WriteItem) -> ItemKey | None:
    """How ``item`` is matched with an item of the keyframe save (None: a byte item, never a delta)."""
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return None
    chunk = item.tensor_data.chunk
    return item.index.fqn, tuple(chunk.offsets), tuple(chunk.sizes)


@dataclasses.dataclass
class _Keyframe:
    """A keyframe save of this rank: its directory, world size and its coded items' places."""

    directory: str
    world_size: int
    items: dict[ItemKey, NvcompStorageInfo]
    #: What each item offers as a base, read once for the chain's saves (the decoding checks the file's id each time)
    offered: dict[ItemKey, BaseFile | None] = dataclasses.field(default_factory=dict)


class ItemChain:
    """The delta chain of one rank's saves through one writer (or the writers a run object gives it).

    Args:
        options: how often the chain starts again with a keyframe.
    """

    def __init__(self, options: DeltaOptions) -> None:
        self.options = options
        self._keyframe: _Keyframe | None = None  # the chain's keyframe: the last save's, or the last save
        self._depth = 0  # saves since the keyframe
        self._coded_against: _Keyframe | None = None  # what the current save is coded against: the keyframe, or None
        self._pending: set[str] = set()  # asked to be deleted while others still needed them

    def bases(self, directory: str, world_size: int, storage: StorageBackend) -> Callable[[WriteItem], BaseFile | None]:
        """For a save into ``directory`` by ``world_size`` ranks: each tensor item's base (None: stored alone)."""
        keyframe, self._coded_against = self._keyframe, None
        if (
            keyframe is None
            or keyframe.world_size != world_size
            or self._depth + 1 >= self.options.keyframe_every
            or storage.parent(keyframe.directory) != storage.parent(directory)
            or keyframe.directory.rstrip("/") == directory.rstrip("/")
            or not storage.exists(storage.join(keyframe.directory, METADATA))
        ):
            return lambda item: None
        self._coded_against = keyframe
        folder = _name(keyframe.directory)

        def base(item: WriteItem) -> BaseFile | None:
            key = item_key(item)
            info = keyframe.items.get(key) if key is not None else None
            if key is None or info is None:
                return None
            if key not in keyframe.offered:
                path = storage.join(keyframe.directory, info.relative_path)
                found = base_file(path, storage, (info.offset, info.length))
                ref = f"../{folder}/{info.relative_path}"
                keyframe.offered[key] = dataclasses.replace(found, ref=ref) if found is not None else None
            return keyframe.offered[key]

        return base

    def written(
        self, directory: str, world_size: int, items: Sequence[WriteItem], results: Sequence[WriteResult]
    ) -> None:
        """This rank's save into ``directory`` wrote ``results`` for ``items``: one more save of the chain, or the
        keyframe whose items later saves are coded against."""
        if self._coded_against is not None:
            self._depth += 1
            return
        keys = {item.index: item_key(item) for item in items}
        places = {}
        for result in results:
            key, info = keys.get(result.index), result.storage_data
            if key is not None and isinstance(info, NvcompStorageInfo) and info.codec is not None:
                places[key] = info
        self._keyframe, self._depth = _Keyframe(directory, world_size, places), 0

    def removable(self, path: str, storage: StorageBackend) -> list[str]:
        """The checkpoint directories to delete now that the one at ``path`` is to be: ``path`` unless a checkpoint
        beside it needs it (a later call deletes it, once none does), and those asked before that none needs now.
        Nothing while a ``.metadata`` beside them cannot be read (what it needs is unknown)."""
        parent = storage.parent(path)
        self._pending.add(path)
        asked = {p for p in self._pending if storage.parent(p) == parent}
        gone: list[str] = []
        for _ in range(len(asked) + 1):  # deleting one may free its own base: until nothing changes
            needed = needed_directories(storage, parent, exclude=set(gone))
            free = [p for p in sorted(asked - set(gone)) if needed is not None and _name(p) not in needed]
            if not free:
                break
            gone.extend(free)
        self._pending -= set(gone)
        return gone


def needed_directories(storage: StorageBackend, parent: str, exclude: Collection[str] = ()) -> set[str] | None:
    """The names of the directories in ``parent`` that a DCP checkpoint there (but those in ``exclude``) has items
    coded against; None where a checkpoint's ``.metadata`` cannot be read."""
    needed: set[str] = set()
    for name in storage.listdir(parent):
        directory = storage.join(parent, name)
        marker = storage.join(directory, METADATA)
        if directory in exclude or not storage.isdir(directory) or not storage.exists(marker):
            continue
        try:
            with storage.open_read(marker) as f:
                metadata = _load_metadata(f.read(), marker)
        except (CheckpointError, OSError):
            return None
        needed.update(
            base[3:] for info in metadata.storage_data.values() if isinstance(base := getattr(info, "base", None), str)
        )
    return needed


def _name(path: str) -> str:
    return path.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
