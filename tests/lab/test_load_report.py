"""The load bench's engine comparison: `--engine` runs are labelled, and the report writes a
table and a plot of every (form, engine) series."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.cli import _parser as build_parser
from lab.load.bench import ENGINES
from lab.load.report import markdown, write_report


def _row(engine: str, clients: int, ttft: float) -> dict[str, object]:
    pct = {"count": 3, "p50": ttft, "p95": ttft * 2, "p99": ttft * 2, "max": ttft * 2}
    return {"form": "embedded", "engine": engine, "upload_every": 0, "command": "bench",
            "clients": clients, "duration_s": 20.0, "throughput_rps": 1.0 / ttft,
            "query_latency_s": pct, "ttft_s": pct, "upload_latency_s": pct,
            "healthz_latency_s": pct, "errors": {}, "peak_rss_mb": {"service": 700.0}}


def test_report_has_a_line_per_run_and_a_plot(tmp_path: Path) -> None:
    rows = [_row(e, c, t) for e, t in (("serial", 2.0), ("batched", 0.5)) for c in (1, 8)]
    path = tmp_path / "load.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md, png = write_report(path, tmp_path / "engines")
    table = md.read_text()
    assert table.count("| embedded | serial |") == 2 and table.count("| embedded | batched |") == 2
    assert png.stat().st_size > 1000
    assert "| none |" in markdown(rows)  # uploads column: questions only


def test_engine_option() -> None:
    assert set(ENGINES) == {"serial", "batched"}
    assert ENGINES["serial"] == {"CONDUIT_MAX_ACTIVE_ANSWERS": "1"}
    args = build_parser().parse_args(["bench", "load", "--engine", "serial,batched"])
    assert args.engine == "serial,batched"
    with pytest.raises(SystemExit):
        args.func(build_parser().parse_args(["bench", "load", "--engine", "fast"]))
