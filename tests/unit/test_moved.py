"""The import paths of 0.1 that moved in 0.2 keep working for one release, each with a DeprecationWarning naming the
new path (lightning_nvcomp/_moved.py); names that never existed still fail as before."""

import importlib
import subprocess
import sys

import pytest

from lightning_nvcomp._moved import MOVED


def fresh_import(name: str):
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_imports_with_a_warning_naming_its_new_home(old):
    with pytest.warns(DeprecationWarning, match=rf"lightning_nvcomp\.{old} is deprecated.*{MOVED[old][0]}"):
        module = fresh_import(f"lightning_nvcomp.{old}")
    homes = [importlib.import_module(f"lightning_nvcomp.{home}") for home in MOVED[old]]
    public = {name for home in homes for name in dir(home) if not name.startswith("_")}
    assert public and public <= set(dir(module))
    for name in public:  # the very objects: isinstance checks and pickled names agree across both paths
        assert getattr(module, name) is next(getattr(h, name) for h in homes if hasattr(h, name))


def test_the_names_0_1_documented_import_from_their_old_paths():
    from lightning_nvcomp.auto.policy import CodecPolicy as new_policy
    from lightning_nvcomp.storage.remote.errors import RemoteStorageError as new_error

    with pytest.warns(DeprecationWarning):
        fresh_import("lightning_nvcomp.policy")
        fresh_import("lightning_nvcomp.remote")
        from lightning_nvcomp.estimate import CODECS, checkpoint_components  # from two modules now
        from lightning_nvcomp.policy import CodecPolicy, Prediction, choose, predict
        from lightning_nvcomp.remote.errors import RemoteStorageError
        from lightning_nvcomp.tree import leaves
    assert CodecPolicy is new_policy and RemoteStorageError is new_error
    assert callable(choose) and callable(predict) and Prediction.__module__ == "lightning_nvcomp.auto.prediction"
    assert CODECS and callable(checkpoint_components)
    assert list(leaves({"a": [1, 2]}, lambda x: isinstance(x, int))) == [("a.0", 1), ("a.1", 2)]


def test_names_that_never_existed_still_fail():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lightning_nvcomp.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lightning_nvcomp.remote.no_such_module")
    with pytest.raises(ImportError):
        exec("from lightning_nvcomp.calibration import no_such_name", {})


def test_the_finder_is_added_once_and_only_answers_for_moved_names():
    code = (
        "import sys, lightning_nvcomp, importlib; importlib.reload(lightning_nvcomp);"
        "from lightning_nvcomp._moved import MovedModules;"
        "finders = [f for f in sys.meta_path if isinstance(f, MovedModules)];"
        "print(len(finders), finders[0].find_spec('json'), finders[0].find_spec('lightning_nvcomp.saving'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "None", "None"]
