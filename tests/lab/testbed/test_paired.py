"""`testbed probe --records` and `testbed paired`: per-question records from the in-process
probe, and one policy against full prefill and the other policies per checkpoint and pooled,
with paired intervals; a weights file that is not the testbed model's is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from conduit_core.model.testbed_model import WEIGHTS
from lab.cli import main
from lab.testbed.intervals import family_of, read_scores
from lab.testbed.paired import POOLED, paired_table
from lab.testbed.probe import load_checkpoint_vlm, probe

FAMILIES = ("reference", "split", "legend", "lookup", "pair")


def _records(path: Path, n: int, split_lost: int, baseline_lost: int) -> None:
    """n questions a family; the policy equals full prefill (always right) but loses
    `split_lost` split questions; the baseline loses `baseline_lost` lookup questions more."""
    rows: list[dict[str, object]] = [{"config": {"n": n}}]
    for fam in FAMILIES:
        for i in range(n):
            qid = f"q{i}-{fam}-s1"
            rows.append({"id": qid, "policy": "full_prefill", "budget": 1.0, "score": 1.0})
            lost = fam == "split" and i < split_lost
            rows.append({"id": qid, "policy": "mine", "budget": 0.1, "score": float(not lost)})
            lost_b = lost or (fam == "lookup" and i < baseline_lost)
            rows.append({"id": qid, "policy": "base", "budget": 0.1, "score": float(not lost_b)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_paired_table_per_checkpoint_and_pooled(tmp_path: Path) -> None:
    a, b = tmp_path / "ck_a.records.jsonl", tmp_path / "ck_b.records.jsonl"
    _records(a, 40, split_lost=4, baseline_lost=8)
    _records(b, 40, split_lost=0, baseline_lost=0)
    out = tmp_path / "paired.md"
    assert main(["testbed", "paired", str(a), str(b), "--policy", "mine", "--out",
                 str(out)]) == 0
    text = out.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| statistic"))
    assert header == f"| statistic | ck_a | ck_b | {POOLED} |"
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| statistic")}
    assert rows["questions"] == ["200", "200", "400 |"]
    assert rows["ratio to full prefill, split"][0].startswith("0.900 [")
    assert rows["ratio to full prefill, split"][1].startswith("1.000 [1.000, 1.000]")
    assert rows["ratio to full prefill, split"][2].startswith("0.950 [")
    assert rows["minus base, all"][0].startswith("0.040 [")  # 8 lookups of 200 questions
    assert rows["minus base, all"][2].startswith("0.020 [")  # 8 of 400
    lo = float(rows["minus base, all"][0].split("[")[1].split(",")[0])
    assert 0 < lo < 0.04  # resolved: every resample keeps the lead
    assert rows["minus base, lookup"][0].startswith("0.200 [")  # 8 of 40 lookups
    assert rows["minus base, split"][0].startswith("0.000 [0.000, 0.000]")
    assert main(["testbed", "paired", str(a), "--policy", "absent"]) == 2
    with pytest.raises(ValueError):
        paired_table({}, "mine", 0.1)


def test_probe_records_every_answer_of_every_row(tmp_path: Path) -> None:
    records: list[dict[str, object]] = []
    rows = probe(load_checkpoint_vlm(WEIGHTS), n=3, seed=3, policies=("full_reuse",),
                 budgets=(0.1,), pages="distractors", records=records)
    assert len(records) == 3 * 2  # full prefill and the one policy, per question
    path = tmp_path / "probe.records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    scores = read_scores(path)
    assert set(scores) == {("full_prefill", 1.0), ("full_reuse", 0.1)}
    for by_id in scores.values():
        assert len(by_id) == 3
    for r in rows:  # the rows' accuracies are the records' means
        key = (str(r["policy"]), float(str(r["budget"])))
        got = [s for qid, s in scores[key].items() if family_of(qid) == r["family"]]
        assert r["accuracy"] == pytest.approx(sum(got) / len(got))


def test_a_weights_file_of_other_names_is_refused(tmp_path: Path) -> None:
    """A model folder's `model.safetensors` names its tensors differently; loading it with
    strict=False used to leave the model random without a word."""
    renamed = {k.replace("model.language_model.", "model."): v
               for k, v in load_file(str(WEIGHTS)).items()}
    path = tmp_path / "model.safetensors"
    save_file(renamed, str(path))
    with pytest.raises(ValueError, match="does not hold the testbed model's tensors"):
        load_checkpoint_vlm(path)
    assert main(["testbed", "probe", "--weights", str(path), "--n", "1"]) == 2
