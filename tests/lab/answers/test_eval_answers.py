"""`conduit-lab eval answers` end to end as a user runs it: 2 real PDFs, 4 questions, 2 policies,
the builtin model; the rows (both references, the TTFT speed-ups, the family groups), the three
outputs, resuming, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.cli import main
from tests.lab.answers.slice import QUESTIONS, write_slice

ROW_KEYS = {"group", "policy", "budget", "n", "accuracy", "accuracy_ratio_to_full",
            "agreement_with_full", "flops_ratio_lm", "flops_ratio_total", "ttft_ms_median",
           "fallback_share", "ttft_speedup_vs_full", "ttft_speedup_vs_cached"}


def _conduit(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONDUIT_HOME": str(tmp / "home"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lab.cli", "eval", "answers", *args],
                          env=env, capture_output=True, text=True, timeout=900)


def _in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The same command run in this process (no interpreter start): exit code, stderr."""
    capsys.readouterr()
    code = main(["eval", "answers", *args])
    return code, capsys.readouterr().err


def test_eval_answers_end_to_end_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    pdfs, questions = write_slice(tmp_path)
    out = tmp_path / "res" / "answers.json"
    args = ["--pdfs", str(pdfs), "--questions", str(questions), "--out", str(out),
            "--policies", "conduit,full_reuse", "--budgets", "0.1,0.5", "--max-new-tokens",
            "4", "--top-k", "2", "--no-progress"]
    done = _conduit(tmp_path, *args, "--check-budget-one")
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    check = doc["meta"]["budget_one_check"]  # budget 1.0 on the masked path, and re-rotation
    assert check["passed"] and check["mixed_path"] and check["head_tokens"] > 0
    assert check["int8_pages"]  # the store's default; re-rotation is within int8 rounding
    assert check["rerotation_layer0_rel_diff"] <= check["rerotation_tolerance"]
    assert doc["meta"]["policy_options"]["conduit"]["gamma"] == "1.0"
    assert doc["meta"]["never_above_full"] is True
    assert out.with_suffix(".md").read_text().startswith("# Answer accuracy")
    assert "Random weights answer nothing" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 10_000
    meta, rows = doc["meta"], doc["rows"]
    assert meta["command"].startswith("conduit-lab eval answers --pdfs")
    assert meta["questions_answered"] == 4 and meta["documents_ingested"] == 2
    assert meta["questions_on_retrieved_pages_without_evidence"] == 1  # q4
    assert meta["answers_computed_this_run"] == 4 * (2 + 2 * 2)
    assert all(set(r) == ROW_KEYS for r in rows)
    cells = {(r["policy"], r["budget"]) for r in rows if r["group"] == "all"}
    assert cells == {("full_prefill", 1.0), ("full_prefill_cached", 1.0), ("conduit", 0.1),
                     ("conduit", 0.5), ("full_reuse", 0.1), ("full_reuse", 0.5)}
    for group in ("family=lookup", "family=multi"):  # every cell per family too
        assert {(r["policy"], r["budget"]) for r in rows if r["group"] == group} == cells
    groups = {r["group"]: r["n"] for r in rows if r["policy"] == "full_prefill"}
    assert groups == {"all": 4, "doc_type=Manual": 2, "doc_type=Financial report": 2,
                      "source=Pure-text (Plain-text)": 1, "source=Table": 1,
                      "source=Chart": 1, "family=lookup": 2, "family=multi": 1}
    for r in rows:  # both speed-ups over the same questions, positive
        assert r["ttft_speedup_vs_full"] > 0 and r["ttft_speedup_vs_cached"] > 0
    by = {(r["group"], r["policy"], r["budget"]): r for r in rows}
    full = by[("all", "full_prefill", 1.0)]
    assert full["agreement_with_full"] == 1.0 and full["flops_ratio_lm"] == 1.0
    assert full["flops_ratio_total"] == 1.0 and full["ttft_ms_median"] > 0
    assert full["ttft_speedup_vs_full"] == 1.0
    cached = by[("all", "full_prefill_cached", 1.0)]  # the exact recompute, no vision tower
    assert cached["agreement_with_full"] == 1.0 and cached["ttft_speedup_vs_cached"] == 1.0
    assert cached["flops_ratio_total"] < 1.0
    table = out.with_suffix(".md").read_text()
    assert "speed-up vs cached" in table and "full_prefill_cached" in table
    assert "| policy | lookup | multi | all |" in table  # the per-family table at 0.1
    reuse = [by[("all", "full_reuse", b)] for b in (0.1, 0.5)]
    assert reuse[0]["flops_ratio_lm"] == reuse[1]["flops_ratio_lm"]  # budget-free: run once
    assert reuse[0]["flops_ratio_lm"] < by[("all", "conduit", 0.5)]["flops_ratio_lm"]
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["agreement_with_full"] <= 1.0
        assert r["flops_ratio_total"] > 0 and r["n"] >= 1
    records = out.with_suffix(".records.jsonl").read_text().splitlines()
    assert len(records) == 1 + 4 * 6  # header + one line per answer
    first = json.loads(records[1])
    assert first["policy"] == "full_prefill" and first["pages"] == [2]  # q1's gold page
    answers = [json.loads(line) for line in records[1:]]
    ref = {a["id"]: a["answer"] for a in answers if a["policy"] == "full_prefill"}
    again = [(a["id"], a["budget"], a["answer"]) for a in answers
             if a["policy"] == "full_prefill_cached"]
    assert sorted(again) == sorted((q, 1.0, text) for q, text in ref.items())  # once, equal

    monkeypatch.setenv("CONDUIT_HOME", str(tmp_path / "home"))
    code, err = _in_process(capsys, *args)  # resumes: nothing left to compute
    assert code == 0, err
    redo = json.loads(out.read_text())
    assert redo["meta"]["answers_computed_this_run"] == 0
    assert redo["rows"] == rows
    assert len(out.with_suffix(".records.jsonl").read_text().splitlines()) == len(records)

    code, err = _in_process(capsys, *args, "--max-new-tokens", "5")  # other settings, same out
    assert code == 2 and "other settings (max_new_tokens)" in err


def test_eval_answers_bad_input_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CONDUIT_HOME", str(tmp_path / "home"))
    pdfs, questions = write_slice(tmp_path)
    out = tmp_path / "answers.json"
    base = ["--pdfs", str(pdfs), "--out", str(out), "--no-progress"]
    code, err = _in_process(capsys, *base, "--questions", str(questions), "--policies", "nope")
    assert code == 2 and "unknown policy nope" in err
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({**QUESTIONS[0], "doc": "absent.pdf"}) + "\n")
    code, err = _in_process(capsys, *base, "--questions", str(missing))
    assert code == 2 and "absent.pdf" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({**QUESTIONS[0], "answer_format": "Date"}) + "\n")
    code, err = _in_process(capsys, *base, "--questions", str(broken))
    assert code == 2 and "broken.jsonl:1" in err and "Date" in err
    code, err = _in_process(capsys, *base, "--questions", str(questions), "--budgets", "0.1,2")
    assert code == 2 and "budgets must be in [0, 1]" in err
    assert not out.exists()  # nothing written for bad input
    (pdfs / "damaged.pdf").write_bytes(b"%PDF-1.7 this is not really a PDF")
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text(json.dumps({**QUESTIONS[0], "doc": "damaged.pdf"}) + "\n")
    code, err = _in_process(capsys, *base, "--questions", str(damaged))
    assert code == 1 and "no question could be answered" in err
    meta = json.loads(out.read_text())["meta"]
    assert meta["questions_skipped"]["q1"].startswith("document not ingested: ")
    assert list(meta["documents_failed"]) == ["damaged.pdf"]
