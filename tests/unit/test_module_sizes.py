"""Modules and functions a reader holds in their head (issue 33): at most 400 lines a module, 60 a function.

The modules and functions that were over those sizes were split by concern; each is measured here on its imported
source, with the modules split off it. The names callers import from the old modules stay importable there, and
the local write's refusal of a URL (its check moved to ``storage.backend``) names a function that exists.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re

import pytest

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

#: The modules that were over MAX_MODULE_LINES, and the modules split off them.
SPLIT_MODULES = {
    "lightning_nvcomp.storage.local": ["lightning_nvcomp.storage.discards", "lightning_nvcomp.storage.backend"],
    "lightning_nvcomp.storage.remote.upload": [
        "lightning_nvcomp.storage.remote.multipart",
        "lightning_nvcomp.storage.remote.file_uploads",
        "lightning_nvcomp.storage.remote.errors",
    ],
    "lightning_nvcomp.telemetry.estimate": ["lightning_nvcomp.telemetry.components"],
}
#: The functions that were over MAX_FUNCTION_LINES, by module.
LONG_FUNCTIONS = [
    ("lightning_nvcomp.cli.estimate", "add_parser"),
    ("lightning_nvcomp.auto.probe", "measure_bandwidth"),
    ("lightning_nvcomp.codec.batch", "decode_batch"),
    ("lightning_nvcomp.codec.record", "decode"),
]


def _functions(module: str) -> dict[str, int]:
    """The line count of every function (methods and nested ones too) of ``module``, by name."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    return {
        f.name: f.end_lineno - f.lineno + 1
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


@pytest.mark.parametrize("module", sorted(SPLIT_MODULES))
def test_a_split_module_and_the_modules_split_off_it_are_at_most_400_lines(module):
    for name in [module, *SPLIT_MODULES[module]]:
        lines = len(inspect.getsource(importlib.import_module(name)).splitlines())
        assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"
        longest = max(_functions(name).items(), key=lambda item: item[1])
        assert longest[1] <= MAX_FUNCTION_LINES, f"{name}.{longest[0]}: {longest[1]} lines"


@pytest.mark.parametrize(("module", "function"), LONG_FUNCTIONS)
def test_a_long_function_is_at_most_60_lines(module, function):
    functions = _functions(module)
    assert function in functions, f"{module}.{function} is gone"
    longest = max(functions.items(), key=lambda item: item[1])
    assert functions[function] <= MAX_FUNCTION_LINES, f"{module}.{function}: {functions[function]} lines"
    assert longest[1] <= MAX_FUNCTION_LINES, f"{module}.{longest[0]}: {longest[1]} lines"


def test_the_names_callers_import_from_the_split_modules_are_the_moved_ones():
    from lightning_nvcomp.storage import backend, discards, local
    from lightning_nvcomp.storage.remote import errors, file_uploads, multipart, upload
    from lightning_nvcomp.telemetry import components, estimate

    assert (local.discard, local.wait_for_discards, local.check_local) == (
        discards.discard,
        discards.wait_for_discards,
        backend.check_local,
    )
    assert {"discard", "wait_for_discards", "atomic_write", "StagedWrite", "fsync_path"} <= set(local.__all__)
    assert (upload.MultipartUpload, upload.RenameUpload, upload.SpooledPut) == (
        multipart.MultipartUpload,
        file_uploads.RenameUpload,
        file_uploads.SpooledPut,
    )
    assert multipart.outcome_unknown is errors.outcome_unknown
    assert estimate.checkpoint_components is components.checkpoint_components
    assert (estimate.CODECS, estimate.CODEC_NAMES) == (components.CODECS, components.CODEC_NAMES)


def test_a_url_refused_by_the_local_write_is_sent_to_a_function_that_exists(tmp_path, monkeypatch):
    """The refusal names where URLs go; that name was left pointing at a module without it by the move."""
    from lightning_nvcomp.storage.local import atomic_write

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"s3://bucket/run/last\.ckpt") as refused:
        atomic_write("s3://bucket/run/last.ckpt", lambda f: f.write(b"x"))
    (named,) = re.findall(r"\((lightning_nvcomp(?:\.\w+)+)\)", str(refused.value))
    module, _, function = named.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function, None)), named
    assert os.listdir(tmp_path) == []
