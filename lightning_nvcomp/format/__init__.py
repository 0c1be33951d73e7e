"""The checkpoint file, whole in docs/FORMAT.md: a ``torch.save`` zip whose pickle rebuilds every tensor through
``decode_tensor`` and every other storage through ``decode_storage``, from checksummed records.

``contents`` finds what an object holds, ``writer`` codes it into an archive (``zip``), ``decode`` holds the decoders
``torch.load`` calls (``placement`` validates their arguments, ``load_context`` says which load they are part of,
``load_state`` bounds it), ``reader`` loads a file and ``zip_checks`` checks it. The choice of codec is not the
format's: see ``auto``.
"""

from lightning_nvcomp.format.contents import DTYPES, Contents, find_contents
from lightning_nvcomp.format.decode import decode_storage, decode_tensor, storage_check, tensor_check
from lightning_nvcomp.format.load_context import LoadContext, TensorInfo, decode_progress, new_load
from lightning_nvcomp.format.load_state import DECODE_ALLOWANCE, DECODE_LIMIT_ENV, DECODE_MULTIPLE, LoadState
from lightning_nvcomp.format.reader import describe, load, read
from lightning_nvcomp.format.writer import Snapshot, snapshot
from lightning_nvcomp.format.zip_checks import check_zip

__all__ = [
    "DECODE_ALLOWANCE",
    "DECODE_LIMIT_ENV",
    "DECODE_MULTIPLE",
    "DTYPES",
    "Contents",
    "LoadContext",
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
    "new_load",
    "read",
    "snapshot",
    "storage_check",
    "tensor_check",
]
