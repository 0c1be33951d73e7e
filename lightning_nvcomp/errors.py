"""Exceptions raised by lightning_nvcomp. Every message names the file, record or tensor at fault."""


class CheckpointError(Exception):
    """Base class: something about a checkpoint file or a save/load request is wrong."""


class CorruptCheckpointError(CheckpointError):
    """The stored bytes or their description fail validation (checksum, sizes, offsets, format)."""


class CodecUnavailableError(CheckpointError):
    """The codec a record needs cannot run here (e.g. gANS without a CUDA GPU and nvCOMP)."""


class RefusedObjectsError(CheckpointError):
    """The file's pickle is intact but holds objects that a ``weights_only=True`` load refuses (classes or functions
    outside torch's allowed globals, e.g. a whole module saved with ``torch.save(model)``): not damage.

    Attributes:
        path: the file.
        refused: the refused globals as torch names them (``torch.nn.modules.linear.Linear``), where it does.
    """

    def __init__(self, message: str, path: str = "", refused: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.path, self.refused = path, refused


class DecodeLimitError(CheckpointError):
    """A load would decode more bytes than its bound allows (a decompression bomb, or data that is mostly zeros);
    the message says how to raise the bound for a trusted file."""


class UnsupportedFormatError(CheckpointError):
    """The file was written by a newer lightning_nvcomp, in a format this version does not read: upgrade."""
