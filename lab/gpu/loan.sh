#!/usr/bin/env bash
# One call of a GPU loan (lab/gpu/NOTES.md, "On the device machine"): the testbed's seeds
# (testbed.sh) with gpu_check.sh's correctness steps beside them (tests_bf16, check_fp32,
# tests_fp32: they time nothing, and the tiny testbed leaves the GPU mostly idle), then
# gpu_check.sh's timing steps (check_bf16, ttft) alone in the time that is left; everything
# that comes back is packed into OUT (at most 8 files: testbed_pack.sh's, plus gpu_check.tgz).
# Usage: STAGE1=FILE bash lab/gpu/loan.sh OUT [SEEDS] [CALL_S]
#   SEEDS   comma-separated testbed seeds (default 0,1)
#   CALL_S  seconds the whole script may take (default 570, inside a call's 600)
#   STEPS   (environment) stages 2-3 length for testbed.sh, default the recipe's 1200
# The run folders stay in /tmp/loan-*: on the same warm machine the same command resumes the
# training from its last checkpoints.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?folder to fill}; SEEDS=${2:-0,1}; CALL=${3:-570}
source lab/gpu/env.sh  # installs the carried wheels once, before two scripts share the site
require_device
mkdir -p "$OUT"
TB=/tmp/loan-testbed CHECK=/tmp/loan-check TIMING=/tmp/loan-timing
left() { echo $(( CALL - SECONDS - $1 )); }  # seconds left, keeping $1 for what follows
TRAIN_S=$(left 110)  # the timing steps get at least about 90 s
CONDUIT_GPU_RESULTS=$CHECK CONDUIT_GPU_CHECK_STEPS=tests_bf16,check_fp32,tests_fp32 \
  CONDUIT_GPU_CHECK_DEADLINE_S=$TRAIN_S bash lab/gpu/gpu_check.sh > /tmp/loan-check.out 2>&1 &
CONDUIT_GPU_RESULTS=$TB TESTBED_DEADLINE_S=$TRAIN_S bash lab/gpu/testbed.sh "${STEPS:-1200}" "$SEEDS"
wait
CONDUIT_GPU_RESULTS=$TIMING CONDUIT_GPU_CHECK_STEPS=check_bf16,ttft \
  CONDUIT_GPU_CHECK_DEADLINE_S=$(left 15) bash lab/gpu/gpu_check.sh
cp /tmp/loan-check.out "$CHECK/steps.out" 2> /dev/null
bash lab/gpu/testbed_pack.sh "$TB" "$OUT"
tar -czf "$OUT/gpu_check.tgz" -C /tmp "$(basename "$CHECK")" "$(basename "$TIMING")"
ls -l "$OUT"
