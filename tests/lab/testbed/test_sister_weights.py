"""The testbed's sister checkpoints (lab/testbed/weights/): every file there is named in the
folder's README with the command that made it, every file the README names is there, each
loads as the testbed model and differs from the committed checkpoint, and the testbed
weights in git stay within the house's 20 MB."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from conduit_core.model.testbed_model import WEIGHTS, build_testbed

ROOT = Path(__file__).parents[3]
SISTERS = ROOT / "lab" / "testbed" / "weights"
NAME = re.compile(r"testbed-qwen2-vl-seed\d+\.safetensors")


def _files() -> list[Path]:
    return sorted(SISTERS.glob("*.safetensors"))


def test_each_file_is_named_with_its_command_and_each_named_file_is_there() -> None:
    readme = (SISTERS / "README.md").read_text()
    named = set(NAME.findall(readme))
    assert named, "the README names no checkpoint"
    assert {f.name for f in _files()} == named
    for name in named:
        assert f"--out lab/testbed/weights/{name}" in readme, f"no command writes {name}"


def test_each_loads_as_the_testbed_and_is_its_own_checkpoint() -> None:
    committed = load_file(str(WEIGHTS))
    for f in _files():
        model, _ = build_testbed(weights=f)  # raises where a tensor is missing or extra
        sister = load_file(str(f))
        assert sister.keys() == committed.keys()
        assert any(not torch.equal(sister[k], committed[k]) for k in committed), f.name
        assert model.model.language_model.embed_tokens.weight.dtype == torch.float32


def test_the_testbed_weights_fit_the_allowance() -> None:
    total = WEIGHTS.stat().st_size + sum(f.stat().st_size for f in _files())
    assert total < 20 * 2**20
