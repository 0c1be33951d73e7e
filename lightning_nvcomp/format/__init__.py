"""The checkpoint file, whole in docs/FORMAT.md: a ``torch.save`` zip whose pickle rebuilds every tensor through
``decode_tensor`` and every other storage through ``decode_storage``, from checksummed records.

``contents`` finds what an object holds, ``writer`` codes it into an archive (``zip``), ``decode`` holds the decoders
``torch.load`` calls, ``reader`` loads and checks a file. The choice of codec is not the format's: see ``auto``.
"""

from lightning_nvcomp.format.contents import DTYPES, Contents, find_contents
from lightning_nvcomp.format.decode import (
    TensorInfo,
    decode_progress,
    decode_storage,
    decode_tensor,
    storage_check,
    tensor_check,
)
from lightning_nvcomp.format.load_state import DECODE_ALLOWANCE, DECODE_LIMIT_ENV, DECODE_MULTIPLE, LoadState
from lightning_nvcomp.format.reader import check_zip, describe, load, read
from lightning_nvcomp.format.writer import Snapshot, snapshot

__all__ = [
    "DECODE_ALLOWANCE",
    "DECODE_LIMIT_ENV",
    "DECODE_MULTIPLE",
    "DTYPES",
    "Contents",
    "LoadState",
    "Snapshot",
    "check_zip",
    "TensorInfo",
    "decode_progress",
    "decode_storage",
    "decode_tensor",
    "describe",
    "find_contents",
    "load",
    "read",
    "snapshot",
    "storage_check",
    "tensor_check",
]
