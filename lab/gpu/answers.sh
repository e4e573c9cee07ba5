#!/usr/bin/env bash
# MMLongBench-Doc answer accuracy with a local checkpoint on one CUDA GPU (lab/gpu/answers.py).
# Usage: bash lab/gpu/answers.sh MODEL_DIR [extra args for python -m lab.gpu.answers]
# Gold pages, policies conduit/cacheblend/epic/vlcache/random/full_reuse at 0.05/0.1/0.2,
# the first 100 dev-set questions; correctness (budget 1.0 == full prefill) runs first.
# Stops after 10 minutes whatever happens; a rerun resumes where it stopped.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: bash lab/gpu/answers.sh MODEL_DIR [args]" >&2
  exit 2
fi
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 600 "$PY" -m lab.gpu.answers "$@"
