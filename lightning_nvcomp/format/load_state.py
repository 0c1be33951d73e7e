"""What one load may decode and has decoded (:class:`LoadState`), and how a decoder finds the state of the load
that calls it: set by our loaders (``_load``), one per plain ``torch.load`` call (found on the stack, see
``_torch_compat``), or one per record where neither is known."""

from __future__ import annotations

import contextvars
import os
import weakref

import torch

from lightning_nvcomp import _torch_compat
from lightning_nvcomp.errors import DecodeLimitError

#: Default bound on what one load decodes: this multiple of the file's size plus :data:`DECODE_ALLOWANCE` bytes.
#: Real checkpoints compress 1.2-1.6x; only constant data (zeros) compresses more, and the allowance covers some.
DECODE_MULTIPLE = 16


DECODE_ALLOWANCE = 256 << 20


#: Environment variable that sets the bound in bytes for every load of the process (``unlimited``: none).
DECODE_LIMIT_ENV = "LIGHTNING_NVCOMP_MAX_DECODED_BYTES"


def _env_limit() -> int | None | bool:
    """The bound set by :data:`DECODE_LIMIT_ENV`: bytes, None for unlimited, False when it is not set."""
    value = os.environ.get(DECODE_LIMIT_ENV, "").strip()
    if not value:
        return False
    if value.lower() in ("unlimited", "none", "inf"):
        return None
    try:
        return int(float(value))
    except ValueError:
        raise ValueError(f"{DECODE_LIMIT_ENV}={value!r} is not a number of bytes or 'unlimited'") from None


class LoadState:
    """What one load has decoded: the bound on decoded bytes, decoded records (copies of one record decode once)
    and the storages handed out (every other storage in the result came from the file as it is).

    Args:
        name: how errors name the file.
        limit: the most bytes this load may decode (None: unlimited). With ``file_nbytes`` unknown (a plain
            ``torch.load``), the compressed bytes seen so far stand in for the file's size.
        file_nbytes: the size of the file being loaded, when known.
    """

    def __init__(self, name: str = "", limit: int | None | bool = False, file_nbytes: int | None = None) -> None:
        self.name, self.file_nbytes = name, file_nbytes
        env = _env_limit()
        self.limit = limit if limit is not False else env
        self.decoded = self.compressed = 0
        self.cache: dict[tuple, list[torch.Tensor]] = {}
        self.records: dict[int, tuple[dict, list, dict]] = {}  # id -> (the dict, its blobs' keys, validated copy)
        self.produced: set[int] = set()
        self._seen: set[tuple] = set()

    def bound(self) -> int | None:
        if self.limit is not False:
            return self.limit
        base = self.file_nbytes if self.file_nbytes is not None else self.compressed
        return DECODE_MULTIPLE * base + DECODE_ALLOWANCE

    def charge(self, blobs: list[torch.Tensor], keys: list[tuple], nbytes: int, name: str) -> None:
        """Count a record about to be decoded; raise DecodeLimitError if the load would exceed its bound."""
        for b, key in zip(blobs, keys):
            if key not in self._seen:
                self._seen.add(key)
                self.compressed += b.numel()
        bound = self.bound()
        if bound is not None and self.decoded + nbytes > bound:
            rule = (
                f"{self.limit} bytes"
                if self.limit is not False
                else f"{DECODE_MULTIPLE} x the file's {self.file_nbytes if self.file_nbytes is not None else self.compressed}"
                f" bytes + {DECODE_ALLOWANCE >> 20} MiB"
            )
            raise DecodeLimitError(
                f"{self.name + ': ' if self.name else ''}tensor {name!r}: decoding it would bring this load to "
                f"{self.decoded + nbytes} bytes, over its limit of {bound} ({rule}), which guards against "
                "decompression bombs. If you trust the file, raise the limit: lightning_nvcomp.load(..., "
                f"max_decoded_nbytes=N) or the environment variable {DECODE_LIMIT_ENV}=N (bytes, or 'unlimited')"
            )
        self.decoded += nbytes


#: The state of the load running in this context (our loaders set it; see :func:`_load_state`).
_load: contextvars.ContextVar[LoadState | None] = contextvars.ContextVar("load", default=None)


#: States of plain torch.load calls, by their unpickler (freed with it, when the load ends).
_torch_loads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: Without a known load (torch changed), records are cached by their first blob, and bounded one by one: by the
#: blob's id, dropped when the blob is (tensors compare elementwise, so they cannot be weak dictionary keys).
_orphans: dict[int, LoadState] = {}


def _load_state(blobs: list[torch.Tensor]) -> LoadState:
    state = _load.get()
    if state is not None:
        return state
    unpickler = _torch_compat.current_torch_load()
    if unpickler is not None:
        try:
            return _torch_loads.setdefault(unpickler, LoadState())
        except TypeError:  # not weak-referenceable: treat as unknown
            pass
    if not blobs:
        return LoadState()
    key = id(blobs[0])
    if key not in _orphans:
        _orphans[key] = LoadState()
        weakref.finalize(blobs[0], _orphans.pop, key, None)
    return _orphans[key]
