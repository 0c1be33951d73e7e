#!/usr/bin/env bash
# Set up .venv and run the tests (gpu-marked tests skip without CUDA and nvCOMP):
#   bash scripts/test.sh [PYTEST_ARGS]                           the whole suite
#   bash scripts/test.sh unit|integration|safety [PYTEST_ARGS]   one suite, tests/SUITE (tests/README.md)
# SKIP_SETUP=1 skips the setup, for a caller that ran scripts/setup.sh already (.ci/run, once for its three suites).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_SETUP:-}" ] || bash scripts/setup.sh
case "${1:-}" in
    unit | integration | safety) set -- "tests/$1" "${@:2}" ;;
esac
.venv/bin/python -m pytest -q "$@"
