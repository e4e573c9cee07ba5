#!/usr/bin/env bash
# The page-scale testbed recipe on a GPU loan: three seeds trained side by side on one device
# (issue 28 asks for three independently trained checkpoints; on the 2-core CPU one run of
# 1,200 steps takes 75 minutes or more, lab/testbed/NOTES.md "Training").
# Usage: STAGE1=FILE bash lab/gpu/testbed.sh [STEPS] [SEEDS]
#   STAGE1  the stage-1 weights, the curriculum's start:
#           git show 74a2228:conduit_core/weights/testbed-qwen2-vl.safetensors > FILE
#           (a device copy of the tree has no git history: carry the file with the call)
#   STEPS   learning-rate schedule length of stages 2 and 3 (default 1200, the recipe);
#           stages 4 and 5 take STEPS_LATE (default 400, the recipe)
#   SEEDS   comma-separated seeds (default 0,1,2)
# Each seed trains in its own process (`conduit-lab testbed train --device cuda --resume`,
# checkpoints every 100 steps): stage 2 (page scale, from STAGE1), stage 3 (pair-share 0.4,
# lr 5e-4, --seed 100+seed), stages 4 and 5 (the resolve target, --resolve-weight 5, 400 steps
# at lr 3e-4 and 2e-4, --seed 200+seed and 300+seed), each from the previous stage's
# model.safetensors (lab/testbed/NOTES.md, "Training"), all under one deadline
# (TESTBED_DEADLINE_S, default 540 s); a run cut by the deadline keeps its last checkpoint,
# and the same command resumes it. Run folders and logs:
# lab/gpu/results/testbed-<UTC time>/s<seed>/ (stage 2) and s<seed>-stage{3,4,5}/
# (CONDUIT_GPU_RESULTS to choose).
# CONDUIT_GPU_CHECK_DEVICE=cpu runs it on the CPU (a dry run of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
source lab/gpu/env.sh  # PY, DEVICE, offline hubs, require_device
STEPS="${1:-1200}"
STEPS_LATE="${STEPS_LATE:-400}"
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
train_stage() {  # RUN LOG SECONDS_LEFT ARGS...: one resumable stage under the deadline
  local run=$1 log=$2 left=$3; shift 3
  local resume=()
  [[ -f "$run/state.json" ]] && resume=(--resume)
  timeout -s INT "$left" "$PY" -m lab.cli testbed train --out "$run" --steps "$STEPS" \
    --device "$DEVICE" --threads "$THREADS" --eval-every 100 "$@" "${resume[@]}" >> "$log" 2>&1
}
train_seed() {  # SEED: stages 2-5, each once the one before has written its final weights
  local seed=$1 run="$OUT/s$1" start=$SECONDS left
  train_stage "$run" "$OUT/s$seed.log" "$LIMIT" --init "$STAGE1" --lr 1e-3 --warmup 100 \
    --seed "$seed" || return $?
  local prev=$run stage args
  for stage in 3 4 5; do
    left=$(( LIMIT - (SECONDS - start) ))
    (( left > 0 )) || return 124
    case $stage in  # a stage's own --steps follows train_stage's and wins (argparse: last one)
      3) args=(--lr 5e-4 --warmup 50) ;;
      4) args=(--steps "$STEPS_LATE" --lr 3e-4 --warmup 20 --resolve-weight 5) ;;
      5) args=(--steps "$STEPS_LATE" --lr 2e-4 --warmup 20 --resolve-weight 5) ;;
    esac
    train_stage "$run-stage$stage" "$OUT/s$seed-stage$stage.log" "$left" \
      --init "$prev/model.safetensors" --seed $(( stage * 100 - 200 + seed )) \
      --pair-share 0.4 "${args[@]}" || return $?
    prev="$run-stage$stage"
  done
}
last_step() {  # RUN: the step of its last checkpoint
  "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" "$1/state.json" \
    2>/dev/null || echo none
}
pids=()
for seed in "${SEEDS[@]}"; do
  train_seed "$seed" &
  pids+=($!)
done
STATUS=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  run="$OUT/s${SEEDS[$i]}"
  echo "seed ${SEEDS[$i]}: rc=$rc, stage 2 at step $(last_step "$run"), stages 3/4/5 at" \
       "$(last_step "$run-stage3")/$(last_step "$run-stage4")/$(last_step "$run-stage5")" \
       | tee -a "$OUT/steps.txt"
  [[ $rc -ne 0 && $rc -ne 124 && $STATUS -eq 0 ]] && STATUS=$rc
done
echo "results: $OUT (exit $STATUS)" | tee -a "$OUT/steps.txt"
exit $STATUS
