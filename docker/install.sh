#!/bin/sh
# The one install recipe. `make install` / `make demo` (and so CI) and both Dockerfiles run
# this script, so the images install exactly what the tests ran against.
#
#   docker/install.sh VENV                 the virtual environment with pip and torch only
#   docker/install.sh VENV PIP-ARGS...     then the project, e.g. docker/install.sh .venv -e '.[dev]'
#
# torch goes first and exactly pinned: any other spec pulls several GB of CUDA packages.
# TORCH_INDEX_URL, when set, is searched too for that one wheel (the Dockerfiles set it to
# PyTorch's CPU-only index, whose 2.13.0+cpu sorts above the CUDA build's 2.13.0; on our
# machines pip finds the CPU wheel without it).
# Every package is pinned by constraints.txt beside the repository root (CONSTRAINTS=FILE to
# use another; written by `make lock` for Python 3.11-3.13).
set -eu
venv="$1"
shift
here="$(cd "$(dirname "$0")" && pwd)"
constraints="${CONSTRAINTS:-$here/../constraints.txt}"
torch_spec="torch==2.13.0"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then
            python="$candidate"
            break
        fi
    done
fi

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
pin=""
if [ -f "$constraints" ]; then
    pin="--constraint=$constraints"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$venv/bin/pip" install --quiet $pin --extra-index-url "$TORCH_INDEX_URL" "$torch_spec"
else
    "$venv/bin/pip" install --quiet $pin "$torch_spec"
fi
if [ "$#" -gt 0 ]; then
    "$venv/bin/pip" install --quiet $pin "$@"
fi
