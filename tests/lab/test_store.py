"""`conduit-lab bench store` runs end to end on tiny pages and writes its JSON rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.processes import start_redis
from lab.store.bench import run_store_bench


def test_store_bench_rows(tmp_path: Path) -> None:
    redis_url, stop = start_redis(tmp_path)
    out = tmp_path / "store.json"
    result = run_store_bench(pages=3, tokens_per_page=16, layers=2, kv_heads=2, head_dim=32,
                             hidden=64, redis_url=redis_url, out=out, repeats=1)
    stop()
    assert json.loads(out.read_text()) == result
    rows = {(r["tier"], r["op"]): r for r in result["rows"]}
    assert set(rows) == {(t, op) for t in ("memory", "disk", "redis") for op in ("write", "read")}
    for r in rows.values():
        assert r["mb_per_s"] > 0 and r["raw_mb_per_s"] > 0
        assert r["fraction"] == pytest.approx(r["mb_per_s"] / r["raw_mb_per_s"], rel=0.05)
    assert result["config"]["pages"] == 3
