"""The load bench's engine comparison: `--engine` runs are labelled, the report writes a table
of runs, a batched-vs-serial table of ratios and a plot of every (form, engine) series, and
the command line's comma lists reach the bench."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import lab.load.bench as bench
from lab.cli import _parser as build_parser
from lab.load.memory import rss_bounds
from lab.load.report import markdown, ratios, write_report
from lab.load.services import ENGINES


def _row(engine: str, clients: int, ttft: float, rps: float | None = None, *,
         form: str = "embedded", upload_every: int = 0,
         tokens: float | None = None) -> dict[str, Any]:
    pct = {"count": 3, "p50": ttft, "p95": ttft * 2, "p99": ttft * 2, "max": ttft * 2}
    rate = 1.0 / ttft if rps is None else rps
    counted = {} if tokens is None else {"tokens_per_answer": tokens,
                                          "output_tokens_per_s": rate * tokens}
    return {**counted, "form": form, "engine": engine, "model": "builtin:tiny-qwen2-vl",
            "upload_every": upload_every, "max_new_tokens": 64, "top_k": 2,
            "command": "bench", "clients": clients, "duration_s": 20.0,
            "throughput_rps": rate,
            "query_latency_s": pct, "ttft_s": pct, "upload_latency_s": pct,
            "healthz_latency_s": pct, "errors": {}, "peak_rss_mb": {"service": 850.0},
            "peak_process_rss_mb": {"service": 700.0},
            "rss_baseline_mb": {"service": 600.0}, "rss_bound_mb": {"service": 800.0},
            "rss_within_bound": {"service": True}}


def test_report_has_a_line_per_run_and_a_plot(tmp_path: Path) -> None:
    rows = [_row(e, c, t) for e, t in (("serial", 2.0), ("batched", 0.5)) for c in (1, 8)]
    rows.append(_row("batched", 8, 0.5, form="distributed (2 workers)", upload_every=10))
    path = tmp_path / "load.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md, png = write_report(path, tmp_path / "engines")
    table = md.read_text()
    assert table.count("| embedded | serial | builtin:tiny-qwen2-vl | 64 | none |") == 2
    assert table.count("| embedded | batched |") == 2
    assert "| distributed (2 workers) | batched | builtin:tiny-qwen2-vl | 64 | 1 in 10 | 8 |" \
        in table
    assert "| service 850 | service yes (700 of 800) |" in table
    assert png.stat().st_size > 1000


def test_rows_from_before_the_new_fields_still_report() -> None:
    old = _row("serial", 1, 1.0)
    for key in ("model", "max_new_tokens", "peak_process_rss_mb", "rss_bound_mb",
                "rss_within_bound"):
        del old[key]
    line = markdown([old]).splitlines()[2]
    assert line.startswith("| embedded | serial | - | - | none | 1 |") and line.endswith("| - |")


def test_batched_vs_serial_ratios() -> None:
    rows = [_row("serial", 1, 0.2, 3.0), _row("batched", 1, 0.3, 2.4),
            _row("serial", 8, 2.0, 3.0, tokens=60), _row("batched", 8, 0.5, 4.5, tokens=40),
            _row("serial", 8, 4.0, 1.0, upload_every=10),  # uploads: its own pair
            _row("batched", 8, 1.0, 2.0, upload_every=10),
            _row("batched", 32, 1.0, 5.0)]  # no serial row at 32 clients: no ratio
    table = ratios(rows)
    got = {(t["uploads"], t["clients"]): (t["throughput_ratio"], t["ttft_p50_ratio"])
           for t in table}
    assert got.keys() == {("none", 1), ("none", 8), ("1 in 10", 8)}
    assert got[("none", 1)] == pytest.approx((0.8, 1.5))
    assert got[("none", 8)] == pytest.approx((1.5, 0.25))
    assert got[("1 in 10", 8)] == pytest.approx((2.0, 0.25))
    md = markdown(rows)
    # output tokens/s: 4.5 * 40 against 3 * 60 (rows before tokens were counted: "-")
    assert "| embedded | builtin:tiny-qwen2-vl | 64 | none | 8 | 1.50 | 1.00 | 0.25 |" in md
    assert "| embedded | builtin:tiny-qwen2-vl | 64 | 1 in 10 | 8 | 2.00 | - | 0.25 |" in md
    assert "| 8 | 4.500 | 40.0 |" in md
    # a repeated run: the last row of each engine counts
    again = ratios([*rows, _row("serial", 8, 1.0, 9.0)])
    assert {(t["uploads"], t["clients"]): t["throughput_ratio"] for t in again}[
        ("none", 8)] == pytest.approx(0.5)


def test_rss_bound() -> None:
    # embedded: 1.25 * 800 + 1 engine * 2 * 65536 positions * 8192 B = 1000 + 1024 MB
    assert rss_bounds({"service": 800.0}, {"service": 1}, 65536, 8192) == {"service": 2024.0}
    # distributed: the API holds no model, the workers' role two
    assert rss_bounds({"service": 400.0, "workers": 1600.0}, {"service": 0, "workers": 2},
                      1024, 4096) == {"service": 500.0, "workers": 2016.0}
    # each model process's page-KV memory tier counts too (64 MiB here)
    assert rss_bounds({"service": 800.0}, {"service": 1}, 65536, 8192, 64 * 2**20) == \
        {"service": 2088.0}


def test_engine_option() -> None:
    assert set(ENGINES) == {"serial", "batched"}
    assert ENGINES["serial"] == {"CONDUIT_MAX_ACTIVE_ANSWERS": "1"}
    args = build_parser().parse_args(["bench", "load", "--engine", "serial,batched"])
    assert args.engine == "serial,batched"
    with pytest.raises(SystemExit):
        args.func(build_parser().parse_args(["bench", "load", "--engine", "fast"]))
    with pytest.raises(SystemExit):
        args.func(build_parser().parse_args(["bench", "load", "--form", "cluster"]))


@pytest.mark.parametrize(("argv", "forms"), [
    ([], ["embedded"]),
    (["--distributed"], ["distributed"]),
    (["--form", "embedded,distributed"], ["embedded", "distributed"]),
    (["--form", "embedded", "--distributed"], ["embedded", "distributed"]),
])
def test_comma_lists_reach_the_bench(argv: list[str], forms: list[str], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(bench, "main", lambda **kw: seen.update(kw) or [])
    args = build_parser().parse_args(
        ["bench", "load", "--clients", "1,8,32", "--upload-every", "0,10", "--engine",
         "serial,batched", "--max-new-tokens", "16", "--top-k", "3", "--model",
         "builtin:tiny-qwen2-vl", "--out", str(tmp_path / "x.jsonl"), *argv])
    assert args.func(args) == 0
    assert seen["forms"] == forms and seen["engines"] == ["serial", "batched"]
    assert seen["clients"] == [1, 8, 32] and seen["upload_every"] == [0, 10]
    assert (seen["max_new_tokens"], seen["top_k"], seen["model"]) == \
        (16, 3, "builtin:tiny-qwen2-vl")


def test_defaults() -> None:
    args = build_parser().parse_args(["bench", "load"])
    assert (args.max_new_tokens, args.top_k, args.model, args.upload_every) == \
        (64, 2, None, [10])
