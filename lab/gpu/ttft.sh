#!/usr/bin/env bash
# TTFT benchmark at Qwen2.5-VL-7B shapes in bfloat16 on one CUDA GPU (see lab/gpu/ttft.py).
# Usage: bash lab/gpu/ttft.sh [extra args for python -m lab.gpu.ttft]
# Stops after 10 minutes whatever happens; correctness (budget 1.0 == full prefill) runs first.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 600 "$PY" -m lab.gpu.ttft "$@"
