"""Issue 67's bar for a cheaper default, on probe runs of one checkpoint: does a policy keep
at least `SHARE` of full prefill's accuracy on every family at a mean of at most `FLOPS` of
its LM FLOPs, and what does it give up against the reference (`conduit_per_page`)?

Reads probe files (`python -m lab.testbed.variants ... --out X.json --records
X.records.jsonl`), every one over the same questions with full prefill in each, and the
records beside them; writes a table (JSON and markdown) of, per policy and budget, each
family's accuracy and ratio to full prefill, the overall accuracy, the mean LM FLOPs ratio,
whether the bar holds, and the paired 95% bootstrap interval of (policy minus reference)
overall accuracy (`lab.testbed.intervals`).

A run given as RUN.json:TAG has its policies named `policy (TAG)` (the same policies under
another runtime option, side by side with the untagged runs).

    python -m lab.testbed.cheaper_report RUN.json[:TAG] [...] --out RESULT.json \
        [--title TITLE] [--reference conduit_per_page] [--policies A,B] \
        [--command "COMMAND THAT MADE RUNS"]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lab.testbed.intervals import Scores, family_of, paired_interval, read_scores, records_beside

SHARE = 0.97
FLOPS = 0.10
FULL = ("full_prefill", 1.0)


def summarize(runs: list[str], reference: str,
              policies: set[str] | None = None) -> list[dict[str, Any]]:
    """One entry per (policy, budget) other than full prefill (module docstring), of
    `policies` only where given (a tagged one by its untagged name)."""
    scores: Scores = {}
    flops: dict[tuple[str, float], list[tuple[float, int]]] = {}
    for spec in runs:
        run, _, tag = str(spec).partition(":")

        def named(key: tuple[str, float], tag: str = tag) -> tuple[str, float]:
            return key if key == FULL or not tag else (f"{key[0]} ({tag})", key[1])

        for key, by_id in read_scores(records_beside(Path(run))).items():
            scores.setdefault(named(key), {}).update(by_id)
        for r in json.loads(Path(run).read_text())["rows"]:
            flops.setdefault(named((r["policy"], float(r["budget"]))), []).append(
                (float(r["flops_ratio_lm"]), int(r["n"])))
    full = scores[FULL]
    families = sorted({family_of(i) for i in full})
    out = []
    for (policy, budget), mine in sorted(scores.items()):
        if (policy, budget) == FULL or (
                policies is not None and policy.split(" (")[0] not in policies):
            continue
        ids = sorted(set(mine) & set(full))  # the questions this policy answered
        fam: dict[str, dict[str, float]] = {}
        for f in families:
            sub = [i for i in ids if family_of(i) == f]
            acc, base = sum(mine[i] for i in sub) / len(sub), sum(full[i] for i in sub) / len(sub)
            fam[f] = {"n": len(sub), "accuracy": acc, "full": base,
                      "ratio": acc / base if base else float("nan")}
        spent = flops[(policy, budget)]
        mean_flops = sum(v * n for v, n in spent) / sum(n for _, n in spent)
        accuracy = sum(mine[i] for i in ids) / len(ids)
        entry: dict[str, Any] = {
            "policy": policy, "budget": budget, "n": len(ids), "families": fam,
            "accuracy": accuracy, "full": sum(full[i] for i in ids) / len(ids),
            "flops_ratio_lm": mean_flops,
            "meets": all(f["ratio"] >= SHARE for f in fam.values()) and mean_flops <= FLOPS}
        ref = scores.get((reference, budget))
        both = [i for i in ids if ref is not None and i in ref]
        if ref is not None and policy != reference and both:
            lo_hi = paired_interval(mine, ref, both, "diff")
            diff = (sum(mine[i] for i in both) - sum(ref[i] for i in both)) / len(both)
            entry["minus_reference"] = {"reference": reference, "n": len(both), "diff": diff,
                                        "lo": lo_hi.lo, "hi": lo_hi.hi}
        out.append(entry)
    return out


def markdown(title: str, command: str, entries: list[dict[str, Any]]) -> str:
    """The table of `summarize`'s entries, under `title`, with the command that made them."""
    families = sorted(entries[0]["families"]) if entries else []
    lines = [f"# {title}", "", "Produced by:", "", "```", command, "```", "",
             f"The bar: every family at least {SHARE:.0%} of full prefill on the same "
             f"questions, mean LM FLOPs at most {FLOPS:.2f}. Cells: accuracy (ratio to full "
             "prefill); n: questions; minus reference: paired, on the questions both answered.",
             ""]
    lines += ["| policy | budget | n | full prefill | " + " | ".join(families)
              + " | all | LM FLOPs | minus reference [95%] | bar |",
              "|---|---:|---:|---:|" + "---:|" * (len(families) + 3) + ":---:|"]
    for e in entries:
        fam = e["families"]
        diff = e.get("minus_reference")
        lines.append(
            f"| {e['policy']} | {e['budget']:g} | {e['n']} | {e['full']:.3f} | "
            + " | ".join(f"{fam[f]['accuracy']:.3f} ({fam[f]['ratio']:.3f})" for f in families)
            + f" | **{e['accuracy']:.3f}** | {e['flops_ratio_lm']:.3f} | "
            + (f"{diff['diff']:+.3f} [{diff['lo']:+.3f}, {diff['hi']:+.3f}]" if diff else "-")
            + f" | {'yes' if e['meets'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Write the table of the runs to --out (JSON) and beside it (markdown)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="probe files, each RUN.json or RUN.json:TAG")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="Cheaper default: candidates on the development seed")
    ap.add_argument("--reference", default="conduit_per_page")
    ap.add_argument("--policies", default=None,
                    help="comma-separated policies to report (default: every one)")
    ap.add_argument("--command", default="", help="the command(s) that made the runs")
    args = ap.parse_args()
    keep = set(args.policies.split(",")) if args.policies else None
    entries = summarize(args.runs, args.reference, keep)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": args.command, "reference": args.reference,
                                    "entries": entries}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(args.title, args.command, entries))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
