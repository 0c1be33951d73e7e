"""The import paths of 0.1 that moved in 0.2, kept until 0.4: ``import lightning_nvcomp.calibration`` gives a
module that reads its names from :mod:`lightning_nvcomp.auto.calibration`, and warns (``DeprecationWarning``) with
the new path. Removed in 0.4.

One finder on ``sys.meta_path`` (added by ``import lightning_nvcomp``) answers for the names of :data:`MOVED` alone,
after Python's own finders have found no such module (docs/ARCHITECTURE.md, "Effects on the user's process").
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

_PACKAGE = "lightning_nvcomp"

#: Each 0.1 module (without the package's name) and the modules its names are read from now, in order.
MOVED: dict[str, tuple[str, ...]] = {
    "baseline": ("telemetry.baseline",),
    "calibration": ("auto.calibration",),
    "estimate": ("telemetry.estimate", "telemetry.components"),
    "integrations.dcp_names": ("_compat.dcp",),
    "integrations.lightning_sharded": ("integrations.lightning.sharded",),
    "locations": ("storage",),
    "pipeline": ("saving.writer",),
    "policy": ("auto.policy",),
    "prediction": ("auto.prediction",),
    "probe": ("auto.probe",),
    "remote": ("storage.remote",),
    "remote.errors": ("storage.remote.errors",),
    "remote.fsspec_storage": ("storage.remote.fsspec_storage",),
    "remote.options": ("storage.remote.options",),
    "remote.ranges": ("storage.remote.ranges",),
    "remote.upload": ("storage.remote.upload",),
    "resources": ("_process",),
    "sized_reader": ("storage.sized_reader",),
    "stats": ("telemetry.stats",),
    "steps": ("auto.steps",),
    "temp_names": ("storage.temp_names",),
    "tree": ("format.contents",),
}


class _MovedModule(types.ModuleType):
    """A 0.1 module: its names are those of the modules it moved to (setting one here changes nothing there)."""

    def __init__(self, name: str, homes: Sequence[types.ModuleType]) -> None:
        super().__init__(name, f"Deprecated: moved to {', '.join(home.__name__ for home in homes)}.")
        self._homes = homes
        if any(f"{name[len(_PACKAGE) + 1 :]}." in old for old in MOVED):
            self.__path__: list[str] = []  # a package of moved modules

    def __getattr__(self, attr: str) -> Any:
        for home in self._homes:
            if hasattr(home, attr):
                return getattr(home, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __dir__(self) -> list[str]:
        return sorted({attr for home in self._homes for attr in dir(home)})


class _Loader(importlib.abc.Loader):
    def __init__(self, homes: tuple[str, ...]) -> None:
        self.homes = homes

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        homes = [importlib.import_module(f"{_PACKAGE}.{home}") for home in self.homes]
        return _MovedModule(spec.name, homes)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds the 0.1 modules of :data:`MOVED`, warning once per import."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix(f"{_PACKAGE}.")
        if old == fullname or old not in MOVED:
            return None
        homes = MOVED[old]
        warnings.warn(
            f"{fullname} is deprecated (removed in 0.4): import from {' or '.join(f'{_PACKAGE}.{h}' for h in homes)}",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.util.spec_from_loader(fullname, _Loader(homes))


def install() -> None:
    """Add the finder to ``sys.meta_path``, once."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
