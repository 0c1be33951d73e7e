"""Where things are in this checkout: its root, the helpers' scripts, the files of earlier versions."""

from pathlib import Path

#: The repository root: children run here, and put it on ``PYTHONPATH`` to import ``tests.helpers``.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The helper scripts that run as child processes (``python tests/helpers/NAME.py``).
HELPERS = REPO_ROOT / "tests" / "helpers"
#: Files written by earlier versions (``tests/fixtures/v*``), and the scripts that wrote them.
FIXTURES = REPO_ROOT / "tests" / "fixtures"
