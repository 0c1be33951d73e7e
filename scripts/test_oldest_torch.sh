#!/usr/bin/env bash
# Run the test suite on the oldest torch pyproject claims (torch>=2.4: 2.4.1, the last 2.4 release), on the CPU, in a
# venv of its own outside the repository (.venv keeps the current torch). Arguments go to pytest (default: the whole
# suite; e.g. `bash scripts/test_oldest_torch.sh tests/integration/test_dcp.py`).
#
# PyPI's Linux wheels of torch 2.4 are CUDA builds: they import only with the nvidia-* packages, so the venv takes
# ~2.9 GB of downloads and ~5 GB of disk (~3.5 minutes to build here; a second run reuses it). GPU tests skip.
# Not part of .ci/run: from scratch, install plus suite take ~7.5 minutes on 2 cores (the suite alone ~4).
#   TORCH_VERSION  the torch to test (default 2.4.1)
#   VENV           where the venv is (default ${TMPDIR:-/tmp}/lightning-nvcomp-torch-$TORCH_VERSION)
#   PYTHON         the interpreter it is made with (default python3; torch 2.4 has wheels for Python 3.8-3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=${TORCH_VERSION:-2.4.1}
VENV=${VENV:-${TMPDIR:-/tmp}/lightning-nvcomp-torch-$TORCH_VERSION}
PYTHON=${PYTHON:-python3}
case "$VENV" in
    "$PWD" | "$PWD"/*) echo "VENV must be outside the repository (the package is installed editable from it)" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# The package's dev extra (both frameworks, the test tools) with torch pinned: pip keeps the pin while resolving.
if ! "$VENV/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null \
    || ! "$VENV/bin/python" -c "import lightning_nvcomp, pytest, hypothesis, lightning, accelerate" 2>/dev/null; then
    "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" -e ".[dev]"
fi
# This checkout first, for the suite's child processes too (the venv's editable install may be another checkout's).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$VENV/bin/python" - "$TORCH_VERSION" "$PWD" <<'EOF'
import sys

import torch

import lightning_nvcomp

assert torch.__version__.split("+")[0] == sys.argv[1], (torch.__version__, sys.argv[1])
assert lightning_nvcomp.__file__.startswith(sys.argv[2] + "/"), lightning_nvcomp.__file__
print(f"torch {torch.__version__} (CUDA available: {torch.cuda.is_available()}), lightning_nvcomp from {lightning_nvcomp.__file__}")
EOF
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
