"""A worker loads its model (and fingerprints a local checkpoint) at startup, in the
background: the first task, a question included, pays neither."""

from __future__ import annotations

from pathlib import Path

from worker.context import build_context
from worker.settings import Settings


def test_preload_loads_the_model_before_any_task(tmp_path: Path) -> None:
    ctx = build_context(Settings(home=tmp_path / "home", model="builtin:tiny-qwen2-vl"))
    try:
        assert not ctx.model_loaded
        ctx.preload_model().join(timeout=120)
        assert ctx.model_loaded
        assert ctx.runtime.vlm.fingerprint.revision.startswith("sha256:")
    finally:
        ctx.close()


def test_a_failed_preload_is_retried_by_the_first_task(tmp_path: Path) -> None:
    ctx = build_context(Settings(home=tmp_path / "home", model=str(tmp_path / "missing")))
    try:
        ctx.preload_model().join(timeout=60)
        assert not ctx.model_loaded  # logged, not raised in the thread
    finally:
        ctx.close()
