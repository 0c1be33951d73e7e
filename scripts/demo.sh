#!/usr/bin/env bash
# Set up .venv and run the demo: compress a checkpoint, load it back bit-exactly, print the savings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python examples/demo.py "$@"
