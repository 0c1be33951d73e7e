"""What one load may decode and has decoded (:class:`LoadState`): the bound that guards against decompression bombs,
and the records decoded so far (copies of one record decode once). Which load a decoder call belongs to is the
:class:`~lightning_nvcomp.format.load_context.LoadContext`'s."""

from __future__ import annotations

import math
import os
import threading

import torch

from lightning_nvcomp.errors import DecodeLimitError

#: Default bound on what one load decodes: this multiple of the file's size plus :data:`DECODE_ALLOWANCE` bytes.
#: Real checkpoints compress 1.2-1.6x; only constant data (zeros) compresses more, and the allowance covers some.
DECODE_MULTIPLE = 16


DECODE_ALLOWANCE = 256 << 20


#: Environment variable that sets the bound in bytes for every load of the process (``unlimited``: none).
DECODE_LIMIT_ENV = "LIGHTNING_NVCOMP_MAX_DECODED_BYTES"


def _env_limit() -> float | None:
    """The bound set by :data:`DECODE_LIMIT_ENV`: bytes, ``math.inf`` for unlimited, None when it is not set."""
    value = os.environ.get(DECODE_LIMIT_ENV, "").strip()
    if not value:
        return None
    if value.lower() in ("unlimited", "none", "inf"):
        return math.inf
    try:
        return int(float(value))
    except ValueError:
        raise ValueError(f"{DECODE_LIMIT_ENV}={value!r} is not a number of bytes or 'unlimited'") from None


class LoadState:
    """What one load has decoded: the bound on decoded bytes, decoded records (copies of one record decode once)
    and the storages handed out (every other storage in the result came from the file as it is).

    Args:
        name: how errors name the file.
        limit: the most bytes this load may decode: a number of bytes, ``math.inf`` for no bound, or None (the
            default) for :data:`DECODE_LIMIT_ENV` if set, else :data:`DECODE_MULTIPLE` x the file's size +
            :data:`DECODE_ALLOWANCE`. With ``file_nbytes`` unknown, the bytes of the distinct storages that blobs
            were read from so far stand in for the file's size.
        file_nbytes: the size of the file being loaded, when known.

    Raises:
        ValueError: a ``limit`` that is not a number of bytes, 0 or more.
    """

    def __init__(self, name: str = "", limit: float | None = None, file_nbytes: int | None = None) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 0):
            raise ValueError(
                f"max_decoded_nbytes must be a number of bytes (0 or more), math.inf for no bound, or None for the "
                f"default bound; not {limit!r}"
            )
        self.name, self.file_nbytes = name, file_nbytes
        #: The file whose delta records name their bases from its directory: a DCP load sets each data file's (None:
        #: the file named ``name``).
        self.holder: str | None = None
        self.limit = limit if limit is not None else _env_limit()
        self.decoded = self.compressed = 0
        self.cache: dict[tuple, list[torch.Tensor]] = {}
        self.records: dict[int, tuple[dict, list, dict]] = {}  # id -> (the dict, its blobs' keys, validated copy)
        self.blob_lists: dict[int, tuple] = {}  # id -> (the list, its tensors, their versions, keys): placement.py
        self.produced: set[int] = set()
        self.bases: dict = {}  # the delta bases opened by this load (format/delta.py), by path
        self._counting = threading.Lock()
        self._seen: set[tuple] = set()

    def where(self, tensor: str) -> str:
        """How an error names a tensor of this load: ``step-1.ckpt: tensor 'layer.weight'``."""
        return f"{self.name}: tensor {tensor!r}" if self.name else f"tensor {tensor!r}"

    def bound(self) -> float:
        if self.limit is not None:
            return self.limit
        base = self.file_nbytes if self.file_nbytes is not None else self.compressed
        return DECODE_MULTIPLE * base + DECODE_ALLOWANCE

    def include(self, nbytes: int) -> None:
        """Count ``nbytes`` more stored bytes in the base of the bound: a delta's base is read as part of the load."""
        with self._counting:
            if self.file_nbytes is not None:
                self.file_nbytes += nbytes
            else:
                self.compressed += nbytes

    def charge(self, blobs: list[torch.Tensor], nbytes: int, name: str) -> None:
        """Count a record about to be decoded; raise DecodeLimitError if the load would exceed its bound. Threads
        that decode a delta's base segments charge at once: one at a time."""
        with self._counting:
            self._charge(blobs, nbytes, name)

    def _charge(self, blobs: list[torch.Tensor], nbytes: int, name: str) -> None:
        if self.file_nbytes is None:
            # Count the storages blobs lie in, each once: views of one storage (several tensors' blobs, or views
            # crafted to overlap) add nothing.
            for b in blobs:
                storage = b.untyped_storage()
                seen = (storage.device, storage.data_ptr(), storage.nbytes())
                if seen not in self._seen:
                    self._seen.add(seen)
                    self.compressed += storage.nbytes()
        bound = self.bound()
        if self.decoded + nbytes > bound:
            base = (
                f"the file's {self.file_nbytes} bytes"
                if self.file_nbytes is not None
                else f"the {self.compressed} stored bytes read so far"
            )
            rule = (
                f"{self.limit} bytes"
                if self.limit is not None
                else f"{DECODE_MULTIPLE} x {base} + {DECODE_ALLOWANCE >> 20} MiB"
            )
            raise DecodeLimitError(
                f"{self.where(name)}: decoding it would bring this load to "
                f"{self.decoded + nbytes} bytes, over its limit of {bound} ({rule}), which guards against "
                "decompression bombs. If you trust the file, raise the limit: lightning_nvcomp.load(..., "
                f"max_decoded_nbytes=N, or math.inf for no bound) or the environment variable {DECODE_LIMIT_ENV}=N "
                "(bytes, or 'unlimited')"
            )
        self.decoded += nbytes
