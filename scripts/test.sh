#!/usr/bin/env bash
# Set up .venv and run the whole test suite (gpu-marked tests skip without CUDA and nvCOMP).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
