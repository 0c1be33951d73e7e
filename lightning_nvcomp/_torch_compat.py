"""The private torch names lightning_nvcomp relies on, each with why and for which versions (torch >= 2.4).

``torch.serialization._load`` (2.4-2.13): the function every zip ``torch.load`` runs, whose local ``unpickler`` is the
unpickler of that load. ``decode_tensor`` is reachable from any ``torch.load`` once the package is imported; to bound
what one load may decode (a decompression bomb must not exhaust memory) and to decode copies of one record once, it
needs to know which load it is part of. Our own loaders say so explicitly; for a plain ``torch.load`` it is found on
the stack. When torch changes and it is not found, the bound applies per record instead (see ``format.load_state``).
"""

from __future__ import annotations

import sys
from types import FrameType

import torch

_LOAD_CODE = getattr(getattr(torch.serialization, "_load", None), "__code__", None)
#: Frames between decode_tensor and torch's _load: the C unpickler calls us directly; the weights_only unpickler
#: is pure Python (its load method, then our function).
_MAX_DEPTH = 6


def current_torch_load() -> object | None:
    """The unpickler of the ``torch.load`` that called our caller in this thread, or None if there is none."""
    if _LOAD_CODE is None:
        return None
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        if frame.f_code is _LOAD_CODE:
            return frame.f_locals.get("unpickler")
        frame = frame.f_back
    return None
