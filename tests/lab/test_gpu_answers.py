"""The GPU answer-accuracy script's code path on CPU: builtin model in bfloat16, the paper's
policies and budgets, correctness check first (lab/gpu/answers.sh runs the same main)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from lab.gpu.answers import PAPER_POLICIES, main
from tests.lab.answers.slice import write_slice


def test_gpu_answers_runs_on_cpu_with_a_builtin_model_in_bf16(tmp_path: Path) -> None:
    pdfs, questions = write_slice(tmp_path)
    out = tmp_path / "gpu_answers.json"
    rc = main(["builtin:tiny-qwen2-vl", "--device", "cpu", "--dtype", "bfloat16",
               "--pdfs", str(pdfs), "--questions", str(questions), "--limit", "2",
               "--max-new-tokens", "3", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    meta = doc["meta"]
    assert meta["dtype"] == "bfloat16" and meta["pages_mode"] == "gold"
    assert meta["questions_answered"] == 2 and meta["max_pages"] == 4
    check = meta["budget_one_check"]
    assert check["passed"] and check["top1_equal"] and check["tolerance"] == 5e-2
    assert meta["command"].startswith("bash lab/gpu/answers.sh builtin:tiny-qwen2-vl")
    cells = {(r["policy"], r["budget"]) for r in doc["rows"] if r["group"] == "all"}
    assert cells == {("full_prefill", 1.0), ("full_prefill_cached", 1.0)} | {
        (p, b) for p in PAPER_POLICIES.split(",") for b in (0.05, 0.1, 0.2)}


def test_gpu_answers_needs_a_gpu_unless_told_otherwise(tmp_path: Path) -> None:
    if not torch.cuda.is_available():  # no --device: it refuses to run on CPU
        assert main(["builtin:tiny-qwen2-vl", "--out", str(tmp_path / "x.json")]) == 2
        assert not (tmp_path / "x.json").exists()
    usage = subprocess.run(["bash", "lab/gpu/answers.sh"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
