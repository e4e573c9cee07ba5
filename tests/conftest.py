"""Suite-wide settings: no model hub, deterministic CPU threads."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The service's default model is builtin:small-qwen2-vl (pages of ~300 visual tokens, 26M
# parameters); the suite runs its services on the tiny test model to stay fast, and tests the
# default model itself where it matters (tests/core/test_default_model.py).
os.environ.setdefault("CONDUIT_MODEL", "builtin:tiny-qwen2-vl")
