"""Issue 67's bar on probe runs (`lab.testbed.cheaper_report`): ratios to full prefill per
family on each policy's own questions, the FLOPs cap, tagged runs beside untagged ones."""

from __future__ import annotations

import json
from pathlib import Path

from lab.testbed.cheaper_report import markdown, summarize


def _run(path: Path, scores: dict[str, list[float]], flops: dict[str, float],
         first: int = 0) -> str:
    """A probe file and its records: `scores[policy]`, one per question, families alternating
    split and legend from question `first` on."""
    records: list[dict[str, object]] = [{"config": {}}]
    rows: list[dict[str, object]] = []
    for policy, values in scores.items():
        budget = 1.0 if policy == "full_prefill" else 0.1
        for j, v in enumerate(values):
            fam = ("split", "legend")[j % 2]
            records.append({"id": f"q{first + j}-{fam}-s28", "policy": policy, "budget": budget,
                            "score": v})
        for fam in ("split", "legend"):
            rows.append({"family": fam, "policy": policy, "budget": budget, "n": len(values) // 2,
                         "accuracy": 0.0, "flops_ratio_lm": flops[policy]})
    path.write_text(json.dumps({"rows": rows}))
    path.with_suffix(".records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_the_bar_per_family_and_tags(tmp_path: Path) -> None:
    full = [1.0] * 40
    a = _run(tmp_path / "a.json", {"full_prefill": full, "conduit_per_page": full,
                                   "cheap": [0.0] + [1.0] * 39},  # one split lost: 0.95
             {"full_prefill": 1.0, "conduit_per_page": 0.17, "cheap": 0.08})
    b = _run(tmp_path / "b.json", {"full_prefill": full[:20], "cheap": full[:20]},
             {"full_prefill": 1.0, "cheap": 0.05})
    entries = {e["policy"]: e for e in summarize([a, f"{b}:other"], "conduit_per_page")}
    cheap = entries["cheap"]
    assert cheap["families"]["split"]["ratio"] == 0.95 and not cheap["meets"]
    assert cheap["minus_reference"]["diff"] == -1 / 40
    tagged = entries["cheap (other)"]
    assert tagged["n"] == 20 and tagged["meets"] and tagged["flops_ratio_lm"] == 0.05
    assert not entries["conduit_per_page"]["meets"]  # every family kept, at 0.17 of the FLOPs
    assert "| cheap (other) | 0.1 | 20 |" in markdown("t", "cmd", list(entries.values()))
    assert set(e["policy"] for e in summarize([a], "conduit_per_page", {"cheap"})) == {"cheap"}
