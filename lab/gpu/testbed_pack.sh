#!/usr/bin/env bash
# What a GPU call brings back of lab/gpu/testbed.sh's results (a call returns at most 8 files
# of 16 MiB from $OUT): each seed's last finished weights as OUT/s<seed>-<stage>.safetensors
# (stage2 to stage5) and every history, state, curve and log as OUT/testbed_runs.tgz
# (checkpoints stay behind: a stopped run resumes only on the same warm machine).
# Usage: bash lab/gpu/testbed_pack.sh RESULTS OUT
set -euo pipefail
RESULTS=${1:?results folder of testbed.sh}; OUT=${2:?folder to fill}
mkdir -p "$OUT"
for first in "$RESULTS"/s*; do
  [[ -d $first && $(basename "$first") != *-* ]] || continue  # s<seed>: a seed's stage 2
  for stage in stage5 stage4 stage3 stage2; do
    run=$first-$stage
    [[ $stage == stage2 ]] && run=$first
    if [[ -f $run/model.safetensors ]]; then
      cp "$run/model.safetensors" "$OUT/$(basename "$first")-$stage.safetensors"
      echo "$(basename "$first"): $stage"
      break
    fi
  done
done
tar -czf "$OUT/testbed_runs.tgz" --exclude='*.safetensors' -C "$RESULTS" .
