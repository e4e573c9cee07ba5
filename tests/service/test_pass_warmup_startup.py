"""A worker whose passes run compiled warms their shape buckets when its model loads
(`CoreSettings.compile_warmup_pages`, `conduit_core.pass_warmup`), each page count logged
with the buckets it compiled, before any question; eager passes warm nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conduit_core.passes.layer_graphs import compile_layers, layer_graphs
from worker.context import build_context
from worker.settings import Settings


def test_compiled_passes_are_warmed_when_the_model_loads(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    ctx = build_context(Settings(home=tmp_path / "home", model="builtin:tiny-qwen2-vl",
                                 compile_passes="on", compile_warmup_pages=1))
    caplog.set_level(logging.INFO, logger="worker.context")
    try:
        graphs = layer_graphs(ctx.runtime.adapter)
        assert graphs is not None and graphs.shapes, "buckets compiled at load"
        lines = [r.getMessage() for r in caplog.records if "pass warm-up" in r.getMessage()]
        assert lines[0].startswith("pass warm-up: 1 page(s) compiled"), lines
        assert "over 1..1 pages" in lines[-1], lines
    finally:
        compile_layers(ctx.runtime.adapter, "off")
        ctx.close()


def test_eager_passes_warm_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ctx = build_context(Settings(home=tmp_path / "home", model="builtin:tiny-qwen2-vl",
                                 compile_passes="off"))
    caplog.set_level(logging.INFO, logger="worker.context")
    try:
        assert layer_graphs(ctx.runtime.adapter) is None
        assert [r.getMessage() for r in caplog.records if "pass warm-up" in r.getMessage()] \
            == ["pass warm-up: passes run eagerly (nothing to compile)"]
    finally:
        ctx.close()
