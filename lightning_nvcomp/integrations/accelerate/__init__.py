"""Accelerate: :func:`~.attach.attach` compresses an ``Accelerator``'s ``save_state``. Importing it imports
Accelerate (the ``[accelerate]`` extra)."""

from lightning_nvcomp.integrations.accelerate.attach import Attachment, ShardedPart, attach

__all__ = ["Attachment", "ShardedPart", "attach"]
