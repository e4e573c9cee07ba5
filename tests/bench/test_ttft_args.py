"""The torch-free option list of `conduit bench ttft` names exactly the benchmark's shapes and
dtypes, and `conduit --help` does not import torch."""

from __future__ import annotations

import subprocess
import sys

from bench.ttft_args import DTYPE_NAMES, SHAPE_NAMES
from bench.ttft_model import SHAPES
from conduit_core.loader import DTYPES


def test_option_names_match_the_benchmark() -> None:
    assert SHAPE_NAMES == sorted(SHAPES)
    assert DTYPE_NAMES == sorted(DTYPES)


def test_cli_parser_is_built_without_torch() -> None:
    code = ("import sys; from service.cli import _parser; _parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
