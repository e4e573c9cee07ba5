# Sourced by the lab/gpu scripts after they cd to the repository root: the Python to run
# ($PYTHON, else the project's .venv, else python3), offline model hubs, and the device
# (CONDUIT_GPU_CHECK_DEVICE, default cuda; "cpu" runs a script's CPU form as a dry run).
# require_device: exit 2 with a message when the device is CUDA and none is there.
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
DEVICE="${CONDUIT_GPU_CHECK_DEVICE:-cuda}"

require_device() {
  if [[ "$DEVICE" != cpu ]] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"
  then
    echo "no CUDA device: CONDUIT_GPU_CHECK_DEVICE=cpu runs this script's CPU form" >&2
    exit 2
  fi
}

# Wheels carried with a GPU call (lab/gpu/wheels.sh; CONDUIT_GPU_WHEELS, default .whl): where
# $PY lacks the project's packages (the device image's python3), they are installed once into
# CONDUIT_GPU_SITE (default /tmp/conduit-site), which goes first on PYTHONPATH, so the carried
# pins (transformers among them) win over the image's.
WHEELS="${CONDUIT_GPU_WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" > /dev/null && ! "$PY" -c "import pydantic_settings" 2>/dev/null
then
  SITE="${CONDUIT_GPU_SITE:-/tmp/conduit-site}"
  STAMP="$SITE/.installed-$(ls "$WHEELS" | sha256sum | cut -c1-16)"
  if [[ ! -f "$STAMP" ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WHEELS"/*.whl || { echo "installing $WHEELS failed" >&2; exit 2; }
    touch "$STAMP"
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
