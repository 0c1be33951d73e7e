"""The private torch names lightning_nvcomp relies on, each with why and for which versions (torch >= 2.4).

``torch.serialization._load`` and ``torch.serialization.load`` (2.4-2.13): the functions every zip ``torch.load``
runs. ``_load``'s local ``unpickler`` is the unpickler of that load; ``load``'s ``f`` is what the caller gave
(a path or a file object) and ``opened_file`` the file object it reads. ``decode_tensor`` is reachable from any
``torch.load`` once the package is imported: to bound what one load may decode (a decompression bomb must not
exhaust memory), to decode copies of one record once and to name the file in its errors, it needs to know which
load, of which file, it is part of. Our own loaders say so explicitly (their ``LoadContext``); a plain
``torch.load`` calls it with the pickled arguments alone, which cannot say which load they are part of: there it is
found on the stack, the one stack inspection of the package. When torch changes and it is not found, the bound
applies per record and errors cannot name the file (see ``format.load_context``).

``torch._utils._get_obj_state`` and ``torch._tensor._rebuild_from_type_v2`` (2.4-2.13): the Python attributes of a
tensor as ``torch.save`` stores them (``Tensor.__reduce_ex__``), and the call that sets them on the rebuilt tensor
(allowed by ``weights_only=True``); our writer stores the same, wrapped around ``decode_tensor``.

``Tensor._version`` (2.4-2.13): the counter every in-place change of a tensor bumps, ``set_`` included (what a
weights-only pickle's BUILD calls on a tensor); a load checks a record's blob list once and again where it moved.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import NamedTuple

import torch

#: The versions whose ``torch.load`` has the shape described above (the package's floor); on others, or if the
#: frames do not look as expected, nothing is found.
_SUPPORTED = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 4)
_LOAD_CODE = getattr(getattr(torch.serialization, "_load", None), "__code__", None) if _SUPPORTED else None
_OUTER_CODE = getattr(getattr(torch.serialization, "load", None), "__code__", None) if _SUPPORTED else None
#: Frames between decode_tensor and torch's _load: the C unpickler calls us directly, or through torch's
#: ``_rebuild_from_type_v2`` (a tensor with attributes); the weights_only unpickler is pure Python (its load
#: method, then our function).
_MAX_DEPTH = 6


class TorchLoad(NamedTuple):
    """A plain ``torch.load`` running in this thread."""

    unpickler: object  #: identifies the load: the same object for every decoder call it makes
    source: object  #: what ``torch.load`` was given (a path or a file object); None if not found
    opened: object  #: the file object it reads; None if not found


def current_torch_load() -> TorchLoad | None:
    """The ``torch.load`` that called our caller in this thread, or None if there is none (or torch changed)."""
    if _LOAD_CODE is None:
        return None
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        if frame.f_code is _LOAD_CODE:
            unpickler = frame.f_locals.get("unpickler")
            outer = frame.f_back
            if unpickler is None:
                return None
            if outer is None or outer.f_code is not _OUTER_CODE:
                return TorchLoad(unpickler, None, None)
            return TorchLoad(unpickler, outer.f_locals.get("f"), outer.f_locals.get("opened_file"))
        frame = frame.f_back
    return None


def tensor_state(tensor: torch.Tensor) -> object:
    """The Python attributes ``torch.save`` stores with ``tensor`` (its ``__dict__``, and slots of a subclass);
    falsy when there are none."""
    return torch._utils._get_obj_state(tensor)


def tensor_version(tensor: torch.Tensor) -> int:
    """The count of in-place changes to ``tensor`` so far (``set_`` included)."""
    return tensor._version


#: ``rebuild_with_state(rebuild, type, args, attributes)``: ``rebuild(*args)`` with the attributes set on it.
rebuild_with_state = torch._tensor._rebuild_from_type_v2
