"""`conduit-lab testbed criteria`: issue 28's criteria on the committed final table, on a
table changed to miss some of them, and with the slack the issue allows other checkpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from lab.cli import main
from lab.testbed.criteria import check, markdown

TABLE = Path(__file__).parents[3] / "lab/testbed/results/answers_page_scale.json"


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(TABLE.read_text())


def _set(doc: dict, group: str, policy: str, budget: float, **fields: float) -> None:
    for r in doc["rows"]:
        if (r["group"], r["policy"], r["budget"]) == (group, policy, budget):
            r.update(fields)


def test_the_committed_table_holds_all_but_one_criterion(doc: dict) -> None:
    """Remade with the page labels recomputed by the refresh (the service's default since
    2026-12-04; the first label, exact as cached, left alone): split records keep 192 of 198
    questions, one short of 97%."""
    checks = check(doc, "conduit_per_page")
    missed = [c for c in checks if not c.holds]
    assert [c.name for c in missed] == ["conduit_per_page at 0.1: ratio to full prefill, split"]
    assert missed[0].value == pytest.approx(192 / 198, abs=1e-3)
    names = [c.name for c in checks]
    assert "full reuse on pair: full prefill minus it" not in names  # not a cross-page family
    assert "full reuse on legend: full prefill minus it" in names
    assert sum(n.startswith("conduit_per_page at 0.1 minus ") for n in names) == 5
    by = {c.name: c for c in checks}
    assert by["conduit_per_page at 0.1: LM FLOPs ratio"].value == pytest.approx(0.176, abs=5e-4)


def test_misses_are_reported_and_slack_forgives_only_accuracy(doc: dict) -> None:
    worse = copy.deepcopy(doc)
    _set(worse, "all", "full_prefill", 1.0, accuracy=0.885)
    _set(worse, "all", "raw_attention", 0.1, accuracy=0.91)  # 0.017 above the policy's 0.893
    _set(worse, "all", "conduit_per_page", 0.1, flops_ratio_lm=0.205)
    strict = {c.name: c.holds for c in check(worse, "conduit_per_page")}
    assert not strict["full prefill overall"]
    assert not strict["conduit_per_page at 0.1 minus raw_attention, overall"]
    assert not strict["conduit_per_page at 0.1: LM FLOPs ratio"]
    slack = {c.name: c.holds for c in check(worse, "conduit_per_page", slack=0.02)}
    assert slack["full prefill overall"]
    assert slack["conduit_per_page at 0.1 minus raw_attention, overall"]
    assert not slack["conduit_per_page at 0.1: LM FLOPs ratio"]  # no slack on FLOPs
    table = markdown({"committed": doc, "worse": worse}, "conduit_per_page")
    assert "| full prefill overall | >= 0.90 | 0.900 | **0.885 (no)** |" in table
    assert table.endswith("| **criteria held** | | 17 of 18 | 14 of 18 |")


def test_command(doc: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "criteria.md"
    # the committed table was made when conduit_per_page was the default (issue 28's)
    assert main(["testbed", "criteria", str(TABLE), "--policy", "conduit_per_page", "--slack",
                 "0.02", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Issue 28's criteria, `conduit_per_page` at 0.1, accuracy "
                           "thresholds less 0.02")
    assert "| 18 of 18 |" in text
    assert "Produced by `conduit-lab " in text  # the command that made it, as typed
    capsys.readouterr()
    assert main(["testbed", "criteria", str(TABLE), "--policy", "no_such_policy"]) == 2
    assert "lacks full_prefill or no_such_policy at 0.1" in capsys.readouterr().err


def test_a_table_without_full_reuse_fails_its_gaps(doc: dict) -> None:
    no_reuse = {**doc, "rows": [r for r in doc["rows"] if r["policy"] != "full_reuse"]}
    gaps = [c for c in check(no_reuse, "conduit_per_page") if c.name.startswith("full reuse")]
    assert len(gaps) == 4 and not any(c.holds for c in gaps)
    assert all(c.value is None for c in gaps)
