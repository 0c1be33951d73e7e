"""lightning_nvcomp: lossless GPU checkpoint compression for PyTorch (nvCOMP gANS / Zstd, CPU zstd fallback).

``import lightning_nvcomp`` registers the decoder with ``torch.load`` (also for ``weights_only=True``).

The names here are ``__all__``, which ``dir(lightning_nvcomp)`` lists (with ``__version__``): ``save``, ``load``,
their options (:class:`SaveOptions`, :class:`Codec`, :class:`Durability`, :class:`RemoteOptions`), stats and
errors, and the Lightning integration, which imports Lightning when first used. Modules with an API of their own are
imported by name: ``lightning_nvcomp.dcp`` (torch.distributed.checkpoint), ``lightning_nvcomp.accelerate``
(``attach``), ``lightning_nvcomp.storage`` (``storage_for``), ``lightning_nvcomp.auto`` (``CodecPolicy``).
"""

# this module's own imports under private names: its public names are the API
import importlib as _importlib
import typing as _typing

from lightning_nvcomp import _moved
from lightning_nvcomp._version import __version__ as __version__
from lightning_nvcomp.errors import (
    CheckpointError,
    CodecUnavailableError,
    CorruptCheckpointError,
    DecodeLimitError,
    MissingBaseError,
    MissingExtraError,
    RefusedObjectsError,
    UnsupportedFormatError,
)
from lightning_nvcomp.format import decode_storage, decode_tensor, load
from lightning_nvcomp.options import Codec, DeltaOptions, Durability, RemoteOptions, SaveOptions
from lightning_nvcomp.saving.single_file import save
from lightning_nvcomp.telemetry.stats import SaveStats

if _typing.TYPE_CHECKING:  # for type checkers; at run time these come from __getattr__ below
    from lightning_nvcomp.integrations.lightning.checkpoint_io import NvcompCheckpointIO, NvcompSavings
    from lightning_nvcomp.integrations.lightning.sharded import NvcompFSDPStrategy, NvcompModelParallelStrategy


_moved.install()  # the import paths of 0.1, for one release


#: Lazy attributes: the integration module each comes from. Those modules import their framework (the
#: ``[lightning]`` extra), which the core never does, so they load only when one of these names is asked for.
_INTEGRATIONS = {
    "NvcompCheckpointIO": "lightning",
    "NvcompSavings": "lightning",
    "NvcompFSDPStrategy": "lightning",
    "NvcompModelParallelStrategy": "lightning",
}


def __getattr__(name: str) -> _typing.Any:
    module = _INTEGRATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_nvcomp' has no attribute {name!r}")
    try:
        integration = _importlib.import_module(f"lightning_nvcomp.integrations.{module}")
    except MissingExtraError as err:
        # the same error, naming the attribute that was asked for
        cause = err.__cause__
        raise MissingExtraError(err.extra, name, cause) from cause
    return getattr(integration, name)


def __dir__() -> list[str]:
    # the public names only, not the submodules that importing the package loads
    return sorted([*__all__, *(name for name in globals() if name.startswith("__") and name.endswith("__"))])


__all__ = [
    "CheckpointError",
    "Codec",
    "CodecUnavailableError",
    "CorruptCheckpointError",
    "DecodeLimitError",
    "DeltaOptions",
    "Durability",
    "MissingBaseError",
    "MissingExtraError",
    "NvcompCheckpointIO",
    "NvcompFSDPStrategy",
    "NvcompModelParallelStrategy",
    "NvcompSavings",
    "RefusedObjectsError",
    "RemoteOptions",
    "SaveOptions",
    "SaveStats",
    "UnsupportedFormatError",
    "decode_storage",
    "decode_tensor",
    "load",
    "save",
]
