"""Chains of delta checkpoints (:class:`DeltaChain`): which earlier file a run's save is coded against, and which files
a pruning may delete.

A chain starts with a file stored alone (a keyframe); every later save of the chain is coded against that keyframe,
so that a save decodes one base and a load one file besides its own, however long the chain. The chain a save
continues is that of the file committed at the latest step before it: its namesake in another folder (Accelerate's
``checkpoint_N/optimizer.bin``), else the first file (Lightning saves ``epoch=..-step=N.ckpt``, then ``last.ckpt``
with the same state: the first continues the chain, so that the file replaced at every step never is a keyframe). A
save starts a new chain every ``keyframe_every`` saves, and when the keyframe is elsewhere than its folder or the folder
beside it, is the file being written, was replaced or deleted, or is not a file of ours (after a restart, the first
save). What files need is read from the files themselves (each delta record names its base's file and id), so pruning
stays safe across restarts: a file another checkpoint of its directory needs is kept until none does
(:meth:`DeltaChain.removable`); a file replaced while others need it keeps its old bytes under a hidden name beside it
(``.NAME.ID.base``); files in folders about to be deleted whole are kept beside each file that needs them
(:meth:`DeltaChain.rescue`). Loads find both.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import BinaryIO

from lightning_nvcomp.format.bases import BaseFile, base_file, candidates, needed_bases, offered, sidecar_name
from lightning_nvcomp.options import DeltaOptions
from lightning_nvcomp.storage import StorageBackend
from lightning_nvcomp.storage.local import Storage


class DeltaChain:
    """The delta chains of one writer.

    Args:
        options: how often a chain starts again with a keyframe.
    """

    def __init__(self, options: DeltaOptions) -> None:
        self.options = options
        self._step: int | None = None  # the step of the latest committed save
        self._latest: list[str] = []  # the files committed at that step, in order: the chains the next saves continue
        self._depth: dict[str, int] = {}  # saves since its chain's keyframe, by latest file
        # The keyframe each latest file was coded against (itself for a keyframe), and its id once a delta read it
        self._keyframe: dict[str, tuple[str, str | None]] = {}
        self._pending: set[str] = set()  # asked to be deleted while others still needed them
        self._group: list[tuple[str, str | None, BaseFile | None]] = []  # prepared, not yet committed: see prepare
        self._lock = threading.Lock()

    def _continued(self, path: str) -> str | None:
        """The file whose chain a save to ``path`` continues: the file of its name committed at the latest step in
        another folder (Accelerate's ``checkpoint_N``), else the first file committed at that step (Lightning's top-k
        file, not ``last.ckpt``)."""
        with self._lock:
            name = os.path.basename(path)
            same = [f for f in self._latest if os.path.basename(f) == name and f != path]
            return same[0] if same else (self._latest[0] if self._latest else None)

    def prepare(self, path: str, storage: StorageBackend, wait: Callable[[str], None]) -> BaseFile | None:
        """Before a save to ``path``: a file it replaces kept where others need it, and the file the save is coded
        against (``wait`` ed for, should its write still run), or None for a keyframe."""
        self.before_replacing(path, storage)
        continued = self._continued(path)
        base = None
        if continued is not None and self._depth[continued] + 1 < self.options.keyframe_every:
            keyframe, ident = self._keyframe[continued]  # ident: None until a delta of this chain read it
            wait(keyframe)
            found = offered(keyframe, path, storage) if storage.exists(keyframe) else None
            base = found if found is not None and ident in (None, found.id) else None
        with self._lock:
            self._group.append((path, continued, base))
        return base

    def committed(self, step: int) -> None:
        """The files prepared since the last call make the checkpoint of training ``step``."""
        with self._lock:
            for path, continued, base in self._group:
                if base is None or continued is None:
                    self._depth[path], self._keyframe[path] = 0, (path, None)
                else:
                    self._depth[path], self._keyframe[path] = self._depth[continued] + 1, (base.path, base.id)
                if step != self._step:
                    self._step, self._latest = step, []
                self._latest.append(path)
            self._group = []
            # only the latest files' chains go on
            self._depth = {p: self._depth[p] for p in self._latest}
            self._keyframe = {p: self._keyframe[p] for p in self._latest}

    def rescue(self, doomed: list[str], kept: list[str], storage: StorageBackend) -> None:
        """Before the folders ``doomed`` are deleted whole (Accelerate's ``total_limit``): every file in them that a
        checkpoint in the folders ``kept`` needs (its bases, theirs, ...) is kept beside each file that needs it, under
        its hidden name, where loads find it (a hard link, or a copy on storage without links)."""
        for folder in kept:
            for name in storage.listdir(folder):
                path = storage.join(folder, name)
                if not storage.isdir(path):
                    self._rescue_bases(path, folder, set(doomed), storage)

    def _rescue_bases(self, holder: str, into: str, doomed: set[str], storage: StorageBackend) -> None:
        for ref, ident, place in _bases_of(holder, storage):
            if place is None or storage.parent(place) not in doomed:
                continue
            self._rescue_bases(place, into, doomed, storage)  # its own bases, found from where it lies now
            target = storage.join(into, sidecar_name(ref.rsplit("/", 1)[-1], ident))
            if not storage.exists(target):
                _keep(place, target, storage)

    def before_replacing(self, path: str, storage: StorageBackend) -> None:
        """``path`` is about to be written over: where checkpoints beside it need its bytes, keep them under its
        hidden name (a hard link, or a copy on storage without links)."""
        if not storage.exists(path):
            return
        old = base_file(path, storage)
        if old is None or (os.path.basename(path), old.id) not in needed_bases(storage, storage.parent(path)):
            return
        _keep(path, storage.join(storage.parent(path), sidecar_name(os.path.basename(path), old.id)), storage)

    def removable(self, path: str, storage: StorageBackend) -> list[str]:
        """The files to delete now that ``path`` is to be deleted: ``path`` unless a checkpoint beside it needs it
        (then it is deleted by a later call, once none does), and the files and hidden copies that only it needed."""
        directory = storage.parent(path)
        with self._lock:
            self._pending.add(path)
            asked = {p for p in self._pending if storage.parent(p) == directory}
        ids = {}
        for p in asked:
            found = base_file(p, storage) if storage.exists(p) else None
            ids[p] = found.id if found is not None else None
        gone: list[str] = []
        for _ in range(len(asked) + 1):  # deleting one may free its own base: until nothing changes
            keep = {p for p in asked if p not in gone}
            needed = needed_bases(storage, directory, exclude=set(gone))
            free = [p for p in keep if ids[p] is None or (os.path.basename(p), ids[p]) not in needed]
            if not free:
                break
            gone.extend(free)
        with self._lock:
            self._pending -= set(gone)
        hidden = [
            storage.join(directory, name)
            for name in storage.listdir(directory)
            if name.endswith(".base") and name.startswith(".")
        ]
        needed = needed_bases(storage, directory, exclude=set(gone))
        gone += [h for h in hidden if _sidecar_key(os.path.basename(h)) not in needed]
        return gone


def _bases_of(holder: str, storage: StorageBackend) -> list[tuple[str, str, str | None]]:
    """The bases the file ``holder`` names, as (ref, id, where it is: the first candidate place that holds it)."""
    found = base_file(holder, storage)
    named = {
        (r.record["delta"]["base"]["file"], r.record["delta"]["base"]["id"])
        for r in (found.records if found is not None else [])
        if "delta" in r.record
    }
    out = []
    for ref, ident in sorted(named):
        places = [p for p in candidates(holder, ref, ident, storage) if storage.exists(p)]
        match = next((p for p in places if (b := base_file(p, storage)) is not None and b.id == ident), None)
        out.append((ref, ident, match))
    return out


def _sidecar_key(name: str) -> tuple[str, str] | None:
    """The (file name, id) a hidden copy ``.NAME.ID.base`` keeps."""
    inner = name[1 : -len(".base")]
    file, _, ident = inner.rpartition(".")
    return (file, ident) if file and ident.isdigit() else None


def _keep(path: str, target: str, storage: StorageBackend) -> None:
    """The bytes of ``path`` also at ``target``: a hard link where the storage is local, else a copy."""
    if isinstance(storage, Storage):
        try:
            os.link(path, target)
            return
        except OSError:  # a file system without hard links
            pass
    with storage.open_read(path) as src:
        storage.write(target, lambda f: _copy(src, f))


def _copy(src: BinaryIO, dst: BinaryIO) -> None:
    while chunk := src.read(64 << 20):
        dst.write(chunk)
