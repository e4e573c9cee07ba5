"""Markdown table and PNG plot of an answer evaluation document (`runner.run_answer_eval`).

Public API:
  write_table(doc, path) -> None   command, setup, the `all` rows (accuracy, FLOPs, TTFT and
                                   its speed-ups over both references), accuracy by group,
                                   accuracy by task family at the budget nearest 0.1
  write_plot(doc, path) -> None    accuracy and agreement with full prefill vs budget, one line
                                   per policy, full prefill as a horizontal line
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lab.answers.results import CACHED_REFERENCE, REFERENCE  # noqa: E402

RANDOM_WEIGHTS_NOTE = (
    "**Random weights answer nothing.** `{model}` is a tiny model with random weights: its "
    "answers are noise, so every accuracy here is (close to) zero and the ratios to full "
    "prefill are undefined or meaningless. This run exercises the machinery (ingest, page "
    "KV, assembly, every refresh policy, scoring, resumable records, the FLOPs accounting) "
    "on real documents; answer accuracy needs a trained checkpoint (`--model` a local "
    "Qwen2-VL / Qwen2.5-VL folder, see `lab/gpu/answers.sh`). Its pages are a few dozen "
    "visual tokens, so text dominates each prompt and the scoring pass of the CONDUIT family "
    "can make its LM FLOPs exceed a full prefill's; with real pages of hundreds of visual "
    "tokens they are the small fraction the method is for."
)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _pages_caption(meta: dict[str, Any]) -> str:
    """Which pages the questions were answered on, and the questions that fell back."""
    mode = meta["pages_mode"]
    if mode == "retrieved":
        return (f"top-{meta['top_k']} pages retrieved within the question's document "
                f"(gold-page recall {_fmt(meta['retrieved_gold_page_recall'])})")
    without = (f"{meta['questions_on_retrieved_pages_without_evidence']} without listed pages "
               f"answered on the top-{meta['top_k']} retrieved pages")
    if mode == "shown":
        return (f"evidence pages plus distractors, "
                f"{_fmt(meta['pages_per_question_mean'], 2)} pages per question on average, "
                f"in document order, at most {meta['max_pages']} "
                f"({meta['questions_capped']} question(s) capped; "
                f"{meta.get('questions_on_evidence_pages_without_shown_pages', 0)} without "
                f"shown pages answered on their evidence pages; {without})")
    return (f"gold evidence pages in document order, at most {meta['max_pages']} "
            f"({meta['questions_capped']} question(s) capped; {without})")


def _setup_lines(meta: dict[str, Any]) -> list[str]:
    cap = _pages_caption(meta)
    failed = meta["documents_failed"]
    return [
        f"Model `{meta['model']}` on {meta['device']} ({meta['dtype']}). Pages: {cap}; "
        f"{_fmt(meta['pages_per_question_mean'], 2)} pages and "
        f"{_fmt(meta['visual_tokens_per_question_mean'], 0)} visual tokens per question on "
        f"average. Greedy answers of at most {meta['max_new_tokens']} tokens under the "
        "service's prefix and page labels.",
        "",
        f"Questions: {meta['questions_answered']} answered of {meta['questions_selected']} "
        f"selected ({meta['questions_in_files']} in the files); "
        f"{len(meta['questions_skipped'])} skipped; {meta['documents_ingested']} documents "
        f"ingested" + (f", {len(failed)} failed ({', '.join(failed)})" if failed else "")
        + ".",
    ]


def write_table(doc: dict[str, Any], path: Path) -> None:
    """Write the markdown report of `doc` to `path`."""
    meta, rows = doc["meta"], doc["rows"]
    lines = [f"# Answer accuracy: `{meta['model']}`, {meta['pages_mode']} pages", "",
             "Produced by:", "", "```", meta["command"] or "(Python API)", "```", ""]
    lines += _setup_lines(meta)
    if meta.get("random_weights"):
        lines += ["", RANDOM_WEIGHTS_NOTE.format(model=meta["model"])]
    check = meta.get("budget_one_check")
    if check:
        lines += ["", f"Correctness check (CONDUIT at budget 1.0 vs full prefill, first-token "
                      f"logits, the rows after the {check.get('head_tokens', 0)}-token cached "
                      f"head on the masked path): max rel. diff "
                      f"{check['budget_one_rel_diff']:.2e}, top-1 equal {check['top1_equal']}; "
                      f"re-rotated layer-0 keys vs full prefill's: max rel. diff "
                      f"{check.get('rerotation_layer0_rel_diff', float('nan')):.2e}; passed "
                      f"{check['passed']}."]
    lines += [
        "", "Scoring: MMLongBench-Doc's rules (`lab/answers/grading.py`). accuracy = "
        "mean score; ratio = accuracy / full prefill's on the same questions; agreement = "
        "same normalised answer as full prefill; FLOPs = prefill FLOPs / a full prefill's "
        "(LM only, and with the vision tower); TTFT = median time to first token (reuse "
        "rows include loading the page KV); speed-up = the median TTFT of full prefill from "
        f"the page images (`{REFERENCE}`, vision tower included) or of full prefill from the "
        f"cached page embeddings (`{CACHED_REFERENCE}`: the `full_prefill` policy over the "
        "cached pages, every row after the cached head recomputed, no vision tower) / the "
        "row's, over the same questions; fallback = share of answers where the policy was "
        "predicted to cost more than a full prefill from cached page embeddings, which ran "
        f"instead (never_above_full: {meta.get('never_above_full', False)}).", "",
        "| policy | budget | n | accuracy | ratio to full | agreement | FLOPs LM | "
        "FLOPs total | TTFT ms | speed-up vs full | speed-up vs cached | fallback |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in (r for r in rows if r["group"] == "all"):
        lines.append(
            f"| {r['policy']} | {r['budget']:.2f} | {r['n']} | {_fmt(r['accuracy'])} | "
            f"{_fmt(r['accuracy_ratio_to_full'])} | {_fmt(r['agreement_with_full'])} | "
            f"{_fmt(r['flops_ratio_lm'])} | {_fmt(r['flops_ratio_total'])} | "
            f"{_fmt(r['ttft_ms_median'], 1)} | {_fmt(r.get('ttft_speedup_vs_full'), 2)} | "
            f"{_fmt(r.get('ttft_speedup_vs_cached'), 2)} | {_fmt(r.get('fallback_share'))} |")
    budgets = meta["budgets"]
    near = min(budgets, key=lambda b: abs(b - 0.1)) if budgets else 1.0
    policies = [p for p in meta["policies"] if p != REFERENCE]
    lines += ["", f"Accuracy by group (policies at budget {near:g}):", "",
              f"| group | n | {REFERENCE} | {CACHED_REFERENCE} | " + " | ".join(policies) + " |",
              "|---|---:|---:|---:|" + "---:|" * len(policies)]
    cell = {(r["group"], r["policy"], r["budget"]): r for r in rows}
    for group in dict.fromkeys(r["group"] for r in rows):
        ref = cell.get((group, REFERENCE, 1.0))
        if ref is None:
            continue
        accs = [_fmt((cell.get((group, p, b)) or {}).get("accuracy"))
                for p, b in [(CACHED_REFERENCE, 1.0), *((p, near) for p in policies)]]
        lines.append(f"| {group} | {ref['n']} | {_fmt(ref['accuracy'])} | "
                     + " | ".join(accs) + " |")
    lines += _family_lines(rows, policies, near)
    lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")


def _family_lines(rows: list[dict[str, Any]], policies: list[str], near: float) -> list[str]:
    """Accuracy per task family (columns, then `all`) of both references and each policy at
    budget `near` (rows); nothing when no question names a family."""
    families = [g for g in dict.fromkeys(r["group"] for r in rows) if g.startswith("family=")]
    if not families:
        return []
    cell = {(r["group"], r["policy"], r["budget"]): r for r in rows}
    columns = [*families, "all"]
    lines = ["", f"Accuracy by task family (references at 1.0, policies at budget {near:g}):",
             "", "| policy | " + " | ".join(g.removeprefix("family=") for g in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for policy, budget in [(REFERENCE, 1.0), (CACHED_REFERENCE, 1.0),
                           *((p, near) for p in policies)]:
        accs = [_fmt((cell.get((g, policy, budget)) or {}).get("accuracy")) for g in columns]
        lines.append(f"| {policy} | " + " | ".join(accs) + " |")
    return lines


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """Write accuracy and agreement vs budget (group `all`) to `path` (PNG)."""
    meta = doc["meta"]
    rows = [r for r in doc["rows"] if r["group"] == "all"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = plt.get_cmap("tab20")
    ref = next((r for r in rows if r["policy"] == REFERENCE), None)
    for i, name in enumerate(p for p in meta["policies"] if p != REFERENCE):
        mine = sorted((r for r in rows if r["policy"] == name), key=lambda r: r["budget"])
        if not mine:
            continue
        style = {"marker": "o", "markersize": 4, "color": colors(i % 20), "label": name,
                 "linewidth": 2.5 if name == "conduit" else 1.2,
                 "linestyle": "--" if name in ("full_reuse", "prefix_reuse") else "-"}
        for ax, key in zip(axes, ("accuracy", "agreement_with_full"), strict=True):
            ax.plot([r["budget"] for r in mine],
                    [float("nan") if r[key] is None else r[key] for r in mine], **style)
    for ax, key, title in zip(axes, ("accuracy", "agreement_with_full"),
                              ("accuracy (MMLongBench-Doc scoring)",
                               "agreement with full prefill's answer"), strict=True):
        if ref is not None:
            ax.axhline(ref[key] if ref[key] is not None else float("nan"), color="black",
                       linestyle=":", linewidth=2, label="full_prefill")
        ax.set_xlabel("budget (fraction of visual tokens refreshed)")
        ax.set_title(title)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=7, loc="best")
    n = ref["n"] if ref else 0
    fig.suptitle(f"{meta['model']}: {n} questions, {meta['pages_mode']} pages")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
