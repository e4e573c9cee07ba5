#!/usr/bin/env bash
# Wheels of the packages a GPU loan's machine lacks (lab/gpu/device-wheels.txt), for its Python,
# into .whl/ (git-ignored). Run here before the call; the call carries .whl and the scripts'
# lab/gpu/env.sh installs them on the device (lab/gpu/NOTES.md, "On the device machine").
# Usage: bash lab/gpu/wheels.sh [PYTHON_VERSION]   (default 3.12, the device image's; 3.11 makes
#        the set for this machine, as tests/lab/test_gpu_wheels.py's install check does)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER="${1:-3.12}"
DEST="${CONDUIT_GPU_WHEELS:-.whl}"
PIP="${PIP:-.venv/bin/pip}"
PLATFORMS=()
for tag in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
           manylinux_2_34 manylinux_2_35; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
rm -rf "$DEST"
mkdir -p "$DEST"
"$PIP" download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" -r lab/gpu/device-wheels.txt
echo "$(ls "$DEST" | wc -l) wheels, $(du -sm "$DEST" | cut -f1) MB in $DEST (Python $PYVER)"
