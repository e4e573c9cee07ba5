"""torch's intra-op CPU threads: a process leaves one core to its Python threads unless the
settings say otherwise, and opening a context applies the figure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from worker.context import build_context
from worker.settings import Settings


def test_the_default_leaves_a_core_and_a_setting_overrides_it(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert Settings(home=tmp_path).worker.cpu_threads == max(1, cores - 1)
    assert Settings(home=tmp_path, torch_threads=3).worker.cpu_threads == 3
    with pytest.raises(ValueError):
        Settings(home=tmp_path, torch_threads=0)


def test_opening_a_context_sets_the_threads(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        ctx = build_context(Settings(home=tmp_path, torch_threads=before + 1))
        assert torch.get_num_threads() == before + 1
        ctx.close()
    finally:
        torch.set_num_threads(before)
