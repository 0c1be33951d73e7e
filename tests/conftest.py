"""pytest's fixtures and hooks for the whole suite; what tests import is in :mod:`tests.helpers`.

Nothing here changes global behaviour (no hypothesis profiles, no patched modules); its one autouse fixture puts
back torch's deterministic mode, which Lightning's Trainer turns on for the whole process, after each test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic_mode_restored():
    """Lightning's ``Trainer(deterministic=True)`` turns torch's deterministic mode on for the whole process; each
    test leaves it as it found it (torch 2.4's ``torch.empty`` of a float8 dtype fails in that mode)."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A checkpoint path in a fresh directory (the file does not exist yet)."""
    return tmp_path / "model.ckpt"
