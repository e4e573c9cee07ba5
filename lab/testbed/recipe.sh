#!/usr/bin/env bash
# One seed of the page-scale testbed recipe on this machine, then its row of the
# three-checkpoint comparison (issue 28; lab/testbed/NOTES.md "Training" and "Across checkpoints").
# Usage: bash lab/testbed/recipe.sh SEED RUNS_DIR [THREADS]
#   trains stages 2-5 of seed SEED under RUNS_DIR/seedSEED/ (s2 ... s5), exports the stage-5
#   weights as a model folder, generates the final table's questions (generator seed 31,
#   1,000, with distractors) once under RUNS_DIR/set, and evaluates every policy at 5, 10 and
#   20% on them (RUNS_DIR/seedSEED/final_sSEED.json), as the committed checkpoint's table was
#   made; `conduit-lab eval across` then gives each policy's mean and spread over the seeds.
# Every step is resumable: rerun the same command after a stop; a finished stage is marked
# DONE, a stopped one continues from its last checkpoint (every 100 steps), the evaluation
# from its records. 3,200 steps: 3.5 to 6 hours with two threads to itself on this kind of
# 2-core machine (3.3 to 7 s a step, by the machine), then 45-80 minutes of evaluation
# (30 minutes a seed on 2026-12-04). On a GPU loan the training takes 8.5 minutes a seed
# (lab/gpu/loan.sh); its weights then go to RUNS_DIR/seedSEED/s5/ with each stage marked DONE.
set -euo pipefail
SEED=${1:?seed}; RUNS=${2:?runs folder}; THREADS=${3:-2}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
R=$RUNS/seed$SEED
mkdir -p "$R"
STAGE1=$RUNS/stage1.safetensors  # the curriculum's start: the stage-1 weights of 74a2228
[[ -f $STAGE1 ]] || git show 74a2228:conduit_core/weights/testbed-qwen2-vl.safetensors > "$STAGE1"

stage() {  # RUN ARGS...: one resumable stage; DONE once its final weights are written
  local run=$1; shift
  [[ -f $run/DONE ]] && return 0
  local resume=()
  [[ -f $run/state.json ]] && resume=(--resume)
  echo "$(date -u +%FT%TZ) $run"
  "$PY" -m lab.cli testbed train --out "$run" --threads "$THREADS" --eval-every 100 "$@" \
    "${resume[@]}"
  touch "$run/DONE"
}
stage "$R/s2" --init "$STAGE1" --steps 1200 --lr 1e-3 --warmup 100 --seed "$SEED"
stage "$R/s3" --init "$R/s2/model.safetensors" --steps 1200 --lr 5e-4 --warmup 50 \
  --seed $((100 + SEED)) --pair-share 0.4
stage "$R/s4" --init "$R/s3/model.safetensors" --steps 400 --lr 3e-4 --warmup 20 \
  --seed $((200 + SEED)) --pair-share 0.4 --resolve-weight 5
stage "$R/s5" --init "$R/s4/model.safetensors" --steps 400 --lr 2e-4 --warmup 20 \
  --seed $((300 + SEED)) --pair-share 0.4 --resolve-weight 5

[[ -f $R/folder/DONE ]] || {
  "$PY" -m lab.cli testbed export "$R/s5/model.safetensors" --folder "$R/folder"
  touch "$R/folder/DONE"
}
[[ -f $RUNS/set/DONE ]] || {
  "$PY" -m lab.cli testbed generate --out "$RUNS/set" --n 1000 --seed 31
  touch "$RUNS/set/DONE"
}
echo "$(date -u +%FT%TZ) evaluating $R/folder"
"$PY" -m lab.cli eval answers --pdfs "$RUNS/set/pdfs" --questions "$RUNS/set/questions.jsonl" \
  --out "$R/final_s$SEED.json" --model "$R/folder" --max-page-tokens 256 --policies all \
  --budgets 0.05,0.1,0.2 --pages shown --max-new-tokens 4 --check-budget-one --no-progress \
  --work-dir "$R/eval-home"
echo "$(date -u +%FT%TZ) done: $R/final_s$SEED.json"
