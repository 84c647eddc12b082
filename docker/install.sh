#!/bin/sh
# The one install recipe. `make install` (and so CI) and both Dockerfiles run this script, so
# the images install exactly what the tests ran against.
#
#   docker/install.sh VENV PIP-ARGS...     e.g. docker/install.sh .venv -e '.[dev,postgres]'
#
# torch goes first and exactly pinned: any other spec pulls several GB of CUDA packages.
# TORCH_INDEX_URL, when set, is where that one wheel comes from (the Dockerfiles set it to
# PyTorch's CPU-only index; on our machines pip finds the CPU wheel without it).
set -eu
venv="$1"
shift
python="${PYTHON:-python3.11}"
torch_spec="torch==2.13.0"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$venv/bin/pip" install --quiet --index-url "$TORCH_INDEX_URL" "$torch_spec"
else
    "$venv/bin/pip" install --quiet "$torch_spec"
fi
"$venv/bin/pip" install --quiet "$@"
