#!/usr/bin/env bash
# The page-scale testbed recipe on a GPU loan: three seeds trained side by side on one device
# (issue 28 asks for three independently trained checkpoints; on the 2-core CPU one run of
# 1,200 steps takes 75 minutes or more, docs/TESTBED.md "Training").
# Usage: STAGE1=FILE bash lab/gpu/testbed.sh [STEPS] [SEEDS]
#   STAGE1  the stage-1 weights, the curriculum's start:
#           git show 74a2228:conduit_core/weights/testbed-qwen2-vl.safetensors > FILE
#           (a device copy of the tree has no git history: carry the file with the call)
#   STEPS   learning-rate schedule length (default 1200, the recipe; longer schedules are
#           what docs/TESTBED.md says would be needed for >= 90%)
#   SEEDS   comma-separated seeds (default 0,1,2)
# Each seed trains in its own process (`conduit-lab testbed train --device cuda --resume`,
# checkpoints every 100 steps) under one deadline (TESTBED_DEADLINE_S, default 540 s); a run
# cut by the deadline keeps its last checkpoint, and the same command resumes it. Run folders
# and logs: lab/gpu/results/testbed-<UTC time>/s<seed>/ (CONDUIT_GPU_RESULTS to choose).
# CONDUIT_GPU_CHECK_DEVICE=cpu runs it on the CPU (a dry run of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
source lab/gpu/env.sh  # PY, DEVICE, offline hubs, require_device
STEPS="${1:-1200}"
IFS=, read -r -a SEEDS <<< "${2:-0,1,2}"
if [[ -z "${STAGE1:-}" || ! -f "$STAGE1" ]]; then
  echo "STAGE1 must name the stage-1 weights file (see the usage above)" >&2
  exit 2
fi
require_device
OUT="${CONDUIT_GPU_RESULTS:-lab/gpu/results/testbed-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
LIMIT="${TESTBED_DEADLINE_S:-540}"
CORES=$(nproc)
THREADS=$(( CORES / ${#SEEDS[@]} > 0 ? CORES / ${#SEEDS[@]} : 1 ))
pids=()
for seed in "${SEEDS[@]}"; do
  run="$OUT/s$seed"
  resume=()
  [[ -f "$run/state.json" ]] && resume=(--resume)
  timeout -s INT "$LIMIT" "$PY" -m lab.cli testbed train --out "$run" --init "$STAGE1" \
    --steps "$STEPS" --lr 1e-3 --warmup 100 --seed "$seed" --device "$DEVICE" \
    --threads "$THREADS" --eval-every 100 "${resume[@]}" > "$OUT/s$seed.log" 2>&1 &
  pids+=($!)
done
STATUS=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  step=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" \
         "$OUT/s${SEEDS[$i]}/state.json" 2>/dev/null || echo none)
  echo "seed ${SEEDS[$i]}: rc=$rc, last checkpoint at step $step" | tee -a "$OUT/steps.txt"
  [[ $rc -ne 0 && $rc -ne 124 && $STATUS -eq 0 ]] && STATUS=$rc
done
echo "results: $OUT (exit $STATUS)" | tee -a "$OUT/steps.txt"
exit $STATUS
