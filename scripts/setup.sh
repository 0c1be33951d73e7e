#!/usr/bin/env bash
# Create .venv (Python >= 3.10) with a CPU build of torch and lightning-nvcomp installed editable with its `dev`
# extra (the test suite's needs: both frameworks, the loggers, ruff and mypy, and the `docs` extra: MkDocs and
# mkdocstrings for the documentation site). Idempotent: a second run only checks.
# Real users install the framework they use and nvCOMP, e.g. `pip install ".[lightning,cu12]"` from a clone (README).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch first, pinned to the CPU build that this machine's pip serves from local disk (the package itself
# only asks for torch>=2.4, which would otherwise pull a multi-GB CUDA build).
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[dev]"
