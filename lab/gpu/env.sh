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
SITE="${CONDUIT_GPU_SITE:-/tmp/conduit-site}"
install_into_site() {  # WHEEL...: into $SITE, from these files alone
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$@"
}
if compgen -G "$WHEELS/*.whl" > /dev/null && ! "$PY" -c "import pydantic_settings" 2>/dev/null
then
  STAMP="$SITE/.installed-$(ls "$WHEELS" | sha256sum | cut -c1-16)"
  if [[ ! -f "$STAMP" ]]; then
    install_into_site "$WHEELS"/*.whl || { echo "installing $WHEELS failed" >&2; exit 2; }
    touch "$STAMP"
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

# The large wheels (PDF ingest, the retrieval embedder: `lab/gpu/wheels.sh --large`), carried
# in parts over several calls into CONDUIT_GPU_LARGE (default .carry; a warm machine keeps
# ignored paths between calls): once every part is there and the whole checks out, they are
# installed into the same site; until then a script says which parts are missing and runs
# without them (its load and answers steps are skipped).
LARGE_DIR="${CONDUIT_GPU_LARGE:-.carry}"
if [[ -f "$LARGE_DIR/large-1/whole" ]] && ! "$PY" -c "import pymupdf" 2>/dev/null; then
  read -r LARGE_SUM LARGE_N < "$LARGE_DIR/large-1/whole"
  missing=()
  for (( k = 1; k <= LARGE_N; k++ )); do
    [[ -f "$LARGE_DIR/large-$k/part" ]] || missing+=("large-$k")
  done
  if (( ${#missing[@]} )); then
    echo "large wheels not installed: ${missing[*]} of $LARGE_N not carried yet" >&2
  elif [[ ! -f "$SITE/.installed-large-$LARGE_SUM" ]]; then
    LARGE_TMP=$(mktemp -d)
    for (( k = 1; k <= LARGE_N; k++ )); do cat "$LARGE_DIR/large-$k/part"; done \
      > "$LARGE_TMP/large.tar"
    if [[ "$(sha256sum "$LARGE_TMP/large.tar" | cut -d' ' -f1)" != "$LARGE_SUM" ]]; then
      echo "large wheels not installed: the parts do not make the whole (sha256)" >&2
    else
      tar -xf "$LARGE_TMP/large.tar" -C "$LARGE_TMP"
      install_into_site "$LARGE_TMP"/*.whl \
        || { echo "installing large wheels failed" >&2; exit 2; }
      touch "$SITE/.installed-large-$LARGE_SUM"
    fi
    rm -rf "$LARGE_TMP"
  fi
  [[ ":${PYTHONPATH:-}:" == *":$SITE:"* ]] || export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
