"""`lab/testbed/recipe.sh`, the three-checkpoint recipe (hours of training per seed): every
command it runs is a valid `conduit-lab` command, in order, each stage starts from the one
before, a rerun skips what is DONE, and a stopped stage resumes.

The training itself is tested in `test_train.py`; here the interpreter the script calls (`PY`)
is a stand-in that records its arguments and writes the files each command leaves, so the
script's own logic (markers, resume, argument lists) runs in a second.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from lab.cli import _parser

ROOT = Path(__file__).parents[3]

STAND_IN = """#!/usr/bin/env bash
# records "$@" as one JSON line, then leaves the files the real command would
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$LOG"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --out|--folder) out=${args[i+1]} ;;
  esac
done
case "$4" in
  train) mkdir -p "$out" && touch "$out/model.safetensors" ;;
  export) mkdir -p "$out" ;;
  generate) mkdir -p "$out" ;;
  answers) touch "$out" ;;
esac
"""


def _run(runs: Path, stand_in: Path, log: Path) -> list[list[str]]:
    log.unlink(missing_ok=True)
    done = subprocess.run(["bash", str(ROOT / "lab/testbed/recipe.sh"), "7", str(runs), "1"],
                          env={**os.environ, "PY": str(stand_in), "LOG": str(log)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_recipe_commands_chain_resume_and_parse(tmp_path: Path) -> None:
    runs, log = tmp_path / "runs", tmp_path / "calls.jsonl"
    runs.mkdir()
    (runs / "stage1.safetensors").write_bytes(b"weights")  # else taken from git history
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)

    calls = _run(runs, stand_in, log)
    assert [c[:2] for c in calls] == [["-m", "lab.cli"]] * len(calls)
    assert [c[2:4] for c in calls] == [["testbed", "train"]] * 4 + [
        ["testbed", "export"], ["testbed", "generate"], ["eval", "answers"]]
    parser = _parser()
    for call in calls:  # every flag the script passes exists, with a valid value
        parser.parse_args(call[2:])
    seed = runs / "seed7"
    inits = [c[c.index("--init") + 1] for c in calls[:4]]
    assert inits == [str(runs / "stage1.safetensors"),
                     *(str(seed / f"s{k}" / "model.safetensors") for k in (2, 3, 4))]
    seeds = [c[c.index("--seed") + 1] for c in calls[:4]]
    assert seeds == ["7", "107", "207", "307"]
    assert all("--resume" not in c for c in calls)
    evaluate = parser.parse_args(calls[-1][2:])
    assert evaluate.budgets == [0.05, 0.1, 0.2] and evaluate.check_budget_one
    assert evaluate.model == str(seed / "folder") and evaluate.pages == "shown"
    assert calls[5][calls[5].index("--seed") + 1] == "31"  # the final table's question set

    assert [c[2:4] for c in _run(runs, stand_in, log)] == [["eval", "answers"]]  # all DONE

    (seed / "s4" / "DONE").unlink()  # as if stopped in stage 4, after a checkpoint
    (seed / "s4" / "state.json").write_text("{}")
    shutil.rmtree(seed / "s5")
    shutil.rmtree(seed / "folder")
    again = _run(runs, stand_in, log)
    assert [c[2:4] for c in again] == [["testbed", "train"]] * 2 + [
        ["testbed", "export"], ["eval", "answers"]]
    assert again[0][again[0].index("--out") + 1] == str(seed / "s4") and "--resume" in again[0]
    assert again[1][again[1].index("--out") + 1] == str(seed / "s5")
    assert "--resume" not in again[1]
