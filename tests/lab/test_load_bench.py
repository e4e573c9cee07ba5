"""The load bench end to end, short: an embedded service spawned per answer engine on the tiny
model, questions only and uploads mixed in against the same service, rows with the settings
and the memory bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.load.bench import main


def test_serial_and_batched_with_and_without_uploads(tmp_path: Path) -> None:
    out = tmp_path / "load.jsonl"
    rows = main(url=None, clients=[1], duration_s=2, pids=[], key=None, out=out,
                upload_every=[0, 2], forms=["embedded"], engines=["serial", "batched"],
                max_new_tokens=4, top_k=2, model="builtin:tiny-qwen2-vl")
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert [(r["engine"], r["upload_every"]) for r in rows] == \
        [("serial", 0), ("serial", 2), ("batched", 0), ("batched", 2)]
    for r in rows:
        assert r["errors"] == {}, r
        assert r["form"] == "embedded" and r["model"] == "builtin:tiny-qwen2-vl"
        assert (r["max_new_tokens"], r["top_k"], r["clients"]) == (4, 2, 1)
        assert r["query_latency_s"]["count"] > 0 and r["ttft_s"]["p50"] > 0
        assert 0 < r["tokens_per_answer"] <= 4 and r["output_tokens_per_s"] > 0
        # /healthz from the prober process and from the thread among the clients
        assert r["healthz_latency_s"]["count"] > 0 and r["healthz_in_load_latency_s"]["count"] > 0
        assert set(r["peak_rss_mb"]) == set(r["rss_bound_mb"]) == {"service"}
        assert r["peak_process_rss_mb"]["service"] <= r["peak_rss_mb"]["service"]
        assert r["rss_within_bound"]["service"] is \
            (r["peak_process_rss_mb"]["service"] <= r["rss_bound_mb"]["service"])
        # 1.25 x the idle baseline + 2 x 65536 positions x 1 KiB (the tiny model in float32:
        # 2 x 4 layers x 2 KV heads x head_dim 16 x 4 bytes) + the 512 MiB memory tier
        assert r["rss_bound_mb"]["service"] == \
            pytest.approx(1.25 * r["rss_baseline_mb"]["service"] + 128 + 512, abs=0.1)
    assert all(r["upload_latency_s"]["count"] == 0 for r in rows if r["upload_every"] == 0)
    assert all(r["upload_latency_s"]["count"] > 0 for r in rows if r["upload_every"] == 2)


def test_paired_one_client_runs_both_engines_at_once(tmp_path: Path) -> None:
    """`bench load-paired`: both embedded services up together, one client asking each the
    same questions in alternating order, an upload to both; the pairs' ratios and their
    interval come from the measured latencies."""
    from lab.load.paired import main as paired

    out = tmp_path / "paired.json"
    rows = paired(forms=["embedded"], pairs=4, upload_every=[3], max_new_tokens=4, top_k=2,
                  model="builtin:tiny-qwen2-vl", out=out)
    assert json.loads(out.read_text()) == rows
    (r,) = rows
    assert r["pairs"] == 4 and r["errors"] == {"serial": {}, "batched": {}}, r
    assert r["upload_every"] == 3 and r["form"] == "embedded"
    for k in ("latency_s", "ttft_s"):
        assert r[f"serial_{k}_p50"] > 0 and r[f"batched_{k}_p50"] > 0
        low, high = r[f"ratio_{k}_ci95"]
        assert low <= r[f"ratio_{k}_p50"] <= high
    assert "| embedded | 1 in 3 | 4 |" in out.with_suffix(".md").read_text()


def test_paired_summary_takes_ratios_pair_by_pair_and_skips_missing_ttfts() -> None:
    import random

    from lab.load.paired import summary

    rows: list[dict[str, float | None]] = [
        {"serial_latency_s": 1.0, "batched_latency_s": 0.9, "serial_ttft_s": None,
         "batched_ttft_s": 0.1},
        {"serial_latency_s": 2.0, "batched_latency_s": 2.2, "serial_ttft_s": 0.2,
         "batched_ttft_s": 0.1}]
    out = summary(rows, random.Random(0))
    assert (out["serial_latency_s_p50"], out["batched_latency_s_p50"]) == (1.5, 1.55)
    assert out["ratio_latency_s_p50"] == 1.0  # median of 0.9 and 1.1, not 1.55 / 1.5
    assert out["ratio_latency_s_ci95"] == [0.9, 1.1]
    assert (out["serial_ttft_s_p50"], out["ratio_ttft_s_p50"]) == (0.2, 0.5)  # one pair


def test_engine_alone_splits_an_answers_engine_time(tmp_path: Path) -> None:
    from lab.load.engine import main as engine_main

    out = tmp_path / "engine.json"
    doc = engine_main(model="builtin:tiny-qwen2-vl", slots=[1, 3], clients=4, duration_s=2.0,
                      max_new_tokens=8, threads=1, out=out, command="test")
    assert json.loads(out.read_text()) == doc
    serial, batched = doc["levels"]
    for lv in (serial, batched):
        assert lv["answers"] > 0 and lv["tokens_per_answer"] == 8  # stop tokens off
        assert lv["prefill_ms_per_answer"] > 0 and lv["step_ms_mean"] > 0
        assert lv["engine_ms_per_answer"] == pytest.approx(
            lv["prefill_ms_per_answer"] + lv["decode_ms_per_answer"], abs=0.2)
        # the timed work of the engine thread fits in the level's wall time, the answers
        # that ran past the window included (nothing counted twice): every decode step
        # plus the prefills of at least the answers finished in the window
        busy_s = (lv["answers"] * lv["prefill_ms_per_answer"]
                  + lv["decode_steps"] * lv["step_ms_mean"]) / 1e3
        assert lv["duration_s"] <= lv["wall_s"] and busy_s <= lv["wall_s"]
    assert serial["rows_per_step"] == 1.0 and 1.0 < batched["rows_per_step"] <= 3.0
    table = out.with_suffix(".md").read_text()
    assert table.count("\n| 1 | 4 |") == 1 and table.count("\n| 3 | 4 |") == 1
