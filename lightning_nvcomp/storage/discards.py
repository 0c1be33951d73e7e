"""Old files freed in the background: a checkpoint that a save replaces or that is pruned loses its name at once and
its data on a background thread, and the names a process that died left behind are swept by the next save.

Freeing a multi-GB file (its blocks, its pages in the page cache) takes the kernel ~0.3 s per GB on a local disk. A
save that replaces a checkpoint, or a pruned checkpoint, need not wait for it: the old file gets a second, hidden name
(:func:`~lightning_nvcomp.storage.temp_names.trash_name`) and is unlinked on one background thread of the process.
Names left behind by a process that died first (:func:`~lightning_nvcomp.storage.temp_names.stale_files`) are removed
by the next save into the same directory (:func:`sweep`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from lightning_nvcomp._process import shared
from lightning_nvcomp.storage.backend import check_local
from lightning_nvcomp.storage.temp_names import stale_files, trash_name


def discard(path: str | os.PathLike) -> None:
    """Remove the file ``path``: its name is gone when this returns, its data is freed on a background thread.
    ValueError for a URL (:func:`~lightning_nvcomp.storage.backend.check_local`)."""
    path = check_local(path)
    trash = trash_name(path)
    os.rename(path, trash)
    discard_later(trash)


def wait_for_discards() -> None:
    """Wait until the files handed to the background (by :func:`discard`, and the files that saves replaced) are
    removed."""
    _deleter().submit(lambda: None).result()


def keep_for_discard(path: str) -> str | None:
    """Give the file at ``path`` (if any) a second name to free it by (:func:`discard_later`) after ``path`` is
    replaced; None where there is no file, or the file system has no hard links (the replace frees it then)."""
    if not os.path.isfile(path):
        return None
    trash = trash_name(path)
    try:
        os.link(path, trash)
    except OSError:  # no hard links on this file system: the replace frees the old file itself
        return None
    return trash


def sweep(directory: str) -> None:
    """Hand the stale files of ``directory`` (:func:`~lightning_nvcomp.storage.temp_names.stale_files`) to the
    background deleter."""
    for stale in stale_files(directory):
        discard_later(stale)


def discard_later(path: str) -> None:
    """Unlink ``path`` on the background deleter's thread."""
    _deleter().submit(_unlink, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # a stale name another save removed first
        pass


def _deleter() -> ThreadPoolExecutor:
    return shared("deleter", lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-discard"))
