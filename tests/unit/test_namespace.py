"""The package's public namespace: ``dir(lightning_nvcomp)`` shows the API and nothing else, ``__all__`` is complete
and true, and the Lightning integration stays lazy (each check in a fresh interpreter, where nothing else imported
a submodule or a framework yet)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.processes import child_json, python_child

#: What a child reports about ``lightning_nvcomp`` right after importing it, then after ``from ... import *``.
INSPECT = """
import json, sys, types
import lightning_nvcomp as m

def frameworks():
    return sorted(n for n in sys.modules if n.partition(".")[0] in ("lightning", "pytorch_lightning", "accelerate"))

listed = dir(m)
after_dir = frameworks()
public_globals = sorted(n for n, v in vars(m).items() if not n.startswith("_") and not isinstance(v, types.ModuleType))
star = {}
exec("from lightning_nvcomp import *", star)
resolved = {n: getattr(getattr(m, n), "__module__", None) for n in m.__all__}
print(json.dumps({
    "dir": listed,
    "all": list(m.__all__),
    "frameworks_after_import_and_dir": after_dir,
    "public_globals": public_globals,
    "star": sorted(n for n in star if n != "__builtins__"),
    "modules": resolved,
    "submodules": sorted(n for n, v in vars(m).items() if isinstance(v, types.ModuleType)),
    "errors": sorted(n for n, v in vars(sys.modules["lightning_nvcomp.errors"]).items()
                     if isinstance(v, type) and issubclass(v, Exception)),
}))
"""


@pytest.fixture(scope="module")
def got() -> dict:
    return child_json(python_child(INSPECT, check=True))


def test_dir_lists_the_public_api_only(got: dict) -> None:
    public = [n for n in got["dir"] if not (n.startswith("__") and n.endswith("__"))]
    assert public == sorted(got["all"]), public
    assert "__version__" in got["dir"]
    # neither this module's own imports nor the submodules importing it loaded, though they are there
    assert not {"Any", "TYPE_CHECKING", "importlib", "typing"} & set(got["dir"])
    assert {"format", "saving", "errors", "integrations"} <= set(got["submodules"])
    assert not set(got["submodules"]) & set(got["dir"])


def test_all_is_complete_and_true(got: dict) -> None:
    names = got["all"]
    assert names == sorted(set(names)), names
    # true: every name resolves to the package's own object (the lazy ones with Lightning, installed here)
    for name, module in got["modules"].items():
        assert module is not None and module.partition(".")[0] == "lightning_nvcomp", (name, module)
    assert got["star"] == sorted(names)
    # complete: every public name the package holds is in it (the lazy ones too), and so is every error that save and
    # load raise
    assert set(got["public_globals"]) <= set(names), sorted(set(got["public_globals"]) - set(names))
    assert {"NvcompCheckpointIO", "NvcompSavings", "NvcompFSDPStrategy", "NvcompModelParallelStrategy"} <= set(names)
    assert set(got["errors"]) | {"MissingExtraError"} <= set(names), json.dumps(got["errors"])


def test_the_lightning_integration_stays_lazy(got: dict) -> None:
    # importing the package and listing it imported no framework; only asking for a lazy name (above, in the same
    # child: "modules") does
    assert got["frameworks_after_import_and_dir"] == []
