"""``from lightning_nvcomp.accelerate import attach``: compressed ``accelerator.save_state`` (needs the
``[accelerate]`` extra; see :mod:`lightning_nvcomp.integrations.accelerate.attach`)."""

from lightning_nvcomp.integrations.accelerate.attach import Attachment, attach

__all__ = ["Attachment", "attach"]
