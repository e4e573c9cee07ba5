#!/usr/bin/env bash
# Wheels of the packages a GPU loan's machine lacks, for its Python, to carry with the calls
# (lab/gpu/NOTES.md, "On the device machine"); lab/gpu/env.sh installs them there.
# Usage: bash lab/gpu/wheels.sh [--large] [PYTHON_VERSION]
#   (default)  lab/gpu/device-wheels.txt into .whl/ (CONDUIT_GPU_WHEELS), one call's carry
#   --large    lab/gpu/device-wheels-large.txt (PDF ingest, the retrieval embedder) packed into
#              parts of PART_MB (default 40) MiB: .carry/large-1/, .carry/large-2/, ... (under
#              CONDUIT_GPU_LARGE), one call each; every part folder holds the whole's sha256
#   PYTHON_VERSION  default 3.12, the device image's; 3.11 makes the set for this machine
# Every output is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/../.."
LARGE=0
if [[ "${1:-}" == --large ]]; then LARGE=1; shift; fi
PYVER="${1:-3.12}"
PIP="${PIP:-.venv/bin/pip}"
PLATFORMS=()
for tag in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
           manylinux_2_34 manylinux_2_35; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {  # LIST DEST
  rm -rf "$2"
  mkdir -p "$2"
  "$PIP" download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp "${PLATFORMS[@]}" -d "$2" -r "$1"
}
if (( LARGE == 0 )); then
  DEST="${CONDUIT_GPU_WHEELS:-.whl}"
  download lab/gpu/device-wheels.txt "$DEST"
  echo "$(ls "$DEST" | wc -l) wheels, $(du -sm "$DEST" | cut -f1) MB in $DEST (Python $PYVER)"
  exit 0
fi
DEST="${CONDUIT_GPU_LARGE:-.carry}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
download lab/gpu/device-wheels-large.txt "$TMP/wheels"
tar -cf "$TMP/large.tar" -C "$TMP/wheels" .
SUM=$(sha256sum "$TMP/large.tar" | cut -d' ' -f1)
split -b "${PART_MB:-40}M" -d -a 2 "$TMP/large.tar" "$TMP/part-"
rm -rf "$DEST"/large-*
n=0
for part in "$TMP"/part-*; do
  n=$(( n + 1 ))
  mkdir -p "$DEST/large-$n"
  mv "$part" "$DEST/large-$n/part"
done
for (( k = 1; k <= n; k++ )); do
  echo "$SUM $n" > "$DEST/large-$k/whole"
done
echo "$(ls "$TMP/wheels" | wc -l) wheels in $n parts under $DEST/large-{1..$n} (Python $PYVER)"
