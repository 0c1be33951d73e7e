#!/usr/bin/env bash
# The release check: build the sdist and the wheel (the wheel from the sdist, as a release builds them), check them
# as PyPI does (twine check --strict), install the wheel into a fresh environment and run `lightning-nvcomp --version`
# there. Only files that passed are copied to OUTDIR, ready to upload.
#   bash scripts/release_check.sh [OUTDIR]    (default dist/)
# PYTHON (default .venv/bin/python) needs the dev extra (build, twine) and the core's dependencies, which the fresh
# environment borrows: the wheel is installed with --no-deps, so nothing is downloaded but the build's setuptools.
# RELEASE_ENV=DIR keeps that environment in DIR (tests/integration/test_packaging.py runs more there); by default it
# is made in a temporary directory and removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
out=$(realpath -m "${1:-dist}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
env_dir=$(realpath -m "${RELEASE_ENV:-$work/env}")

# Build from a copy of the files git knows (tracked, or untracked and not ignored): built in place, setuptools would
# leave build/ and an egg-info in the tree, and read a stale egg-info's list of files into the next sdist.
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard --deduplicate |
    tar --null --files-from=- --ignore-failed-read -cf - | tar -xf - -C "$work/src"
"$PYTHON" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 || {
    cat "$work/build.log" >&2
    exit 1
}
"$PYTHON" -m twine check --strict "$work"/dist/*

# A fresh environment without pip: the wheel installed by PYTHON's pip, PYTHON's packages (torch...) reachable after
# the environment's own through a .pth path. A .pth names a directory without running that directory's .pth files,
# so an editable install of this checkout there stays out.
"$PYTHON" -m venv --without-pip "$env_dir"
"$PYTHON" -m pip --python "$env_dir/bin/python" install -q --no-deps --no-index "$work"/dist/*.whl
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
"$PYTHON" -c "$purelib" >"$("$env_dir/bin/python" -c "$purelib")/outer_environment.pth"

# Run outside the checkout and without PYTHONPATH: the wheel's package, not this tree's.
expected="lightning-nvcomp $(sed -n 's/^__version__ = "\(.*\)"$/\1/p' lightning_nvcomp/_version.py)"
version=$(cd "$work" && env -u PYTHONPATH "$env_dir/bin/lightning-nvcomp" --version)
if [ "$version" != "$expected" ]; then
    echo "the installed wheel says '$version', lightning_nvcomp/_version.py '$expected'" >&2
    exit 1
fi
(cd "$work" && "$env_dir/bin/python" -I -c 'import sys, lightning_nvcomp
assert lightning_nvcomp.__file__.startswith(sys.prefix), lightning_nvcomp.__file__')

mkdir -p "$out"
cp "$work"/dist/* "$out"/
echo "$version: $(ls "$work/dist" | tr '\n' ' ')in $out"
