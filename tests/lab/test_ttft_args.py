"""The torch-free option list of `conduit-lab bench ttft` names exactly the benchmark's shapes
and dtypes, and neither `conduit --help` nor `conduit-lab --help` imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conduit_core.model.loader import DTYPES
from lab.ttft.args import DTYPE_NAMES, SHAPE_NAMES
from lab.ttft.model import SHAPES


def test_option_names_match_the_benchmark() -> None:
    assert SHAPE_NAMES == sorted(SHAPES)
    assert DTYPE_NAMES == sorted(DTYPES)


@pytest.mark.parametrize("module", ["service.cli", "lab.cli"])
def test_cli_parser_is_built_without_torch(module: str) -> None:
    code = (f"import sys; from {module} import _parser; _parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
