"""The int8 page-KV evaluation's verdict: "loses nothing measurable" holds exactly when the
paired interval of int8 minus float accuracy does not lie below zero."""

from __future__ import annotations

import json
from pathlib import Path

from lab.testbed.kv_int8 import summarise, to_markdown


def _records(path: Path, int8_wrong: int, n: int = 40) -> Path:
    """`n` questions, every one right over float pages; over int8 pages the first
    `int8_wrong` are wrong (conduit only); full_reuse identical in both forms."""
    rows = []
    for i in range(n):
        qid = f"q{i}-lookup-s31"
        for form in ("float", "int8"):
            for policy in ("conduit", "full_reuse"):
                wrong = form == "int8" and policy == "conduit" and i < int8_wrong
                rows.append({"id": qid, "policy": policy, "form": form, "budget": 0.1,
                             "text": "x" if wrong else "7", "score": 0.0 if wrong else 1.0})
        rows.append({"id": qid, "policy": "full_prefill", "form": "none", "budget": 1.0,
                     "text": "7", "score": 1.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_no_difference_loses_nothing(tmp_path: Path) -> None:
    s = summarise(_records(tmp_path / "r.jsonl", 0), 0.1, "cmd")
    assert s["int8_loses_nothing_measurable"] and s["meta"]["questions"] == 40
    assert all(r["answers_differ"] == 0 for r in s["policies"])
    assert "**yes**" in to_markdown(s)


def test_a_clear_loss_is_measurable(tmp_path: Path) -> None:
    s = summarise(_records(tmp_path / "r.jsonl", 10), 0.1, "cmd")
    by = {r["policy"]: r for r in s["policies"]}
    assert by["conduit"]["int8_minus_float"] == -0.25 and by["conduit"]["interval_95"][1] < 0
    assert not by["conduit"]["loses_nothing_measurable"]
    assert by["full_reuse"]["loses_nothing_measurable"]
    assert not s["int8_loses_nothing_measurable"] and "**no**" in to_markdown(s)
