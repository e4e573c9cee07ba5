"""The GPU check's options, torch-free (`conduit-lab --help` imports no torch).

Public API:
  DTYPE_NAMES;  add_arguments(parser)   used by `python -m lab.gpu.gpu_check` and
                                        `conduit-lab gpu check`
"""

from __future__ import annotations

import argparse
from pathlib import Path

DTYPE_NAMES = ["bfloat16", "float16", "float32"]  # the keys of check_parts.TOLERANCES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The check's options."""
    p.add_argument("--device", default=None, help="default: cuda (required)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPE_NAMES)
    p.add_argument("--model-shape", default=None,
                   help="timing model (lab.ttft.model): default 7b on a GPU, tiny on the CPU")
    p.add_argument("--pages", type=int, default=None, help="default 8 on a GPU, 2 on the CPU")
    p.add_argument("--tokens-per-page", type=int, default=None,
                   help="default 256 on a GPU, 16 on the CPU")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-timings", action="store_true", help="correctness only")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default lab/gpu/results/check_<device>_<dtype>)")
