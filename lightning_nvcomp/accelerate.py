"""``from lightning_nvcomp.accelerate import attach``: compressed ``accelerator.save_state`` (needs the
``[accelerate]`` extra; see :mod:`lightning_nvcomp.integrations.accelerate`)."""

from lightning_nvcomp.integrations.accelerate import Attachment, attach

__all__ = ["Attachment", "attach"]
