"""Int8 page KV against float page KV on the testbed: every product policy's answers, paired.

Each question's pages are prefilled once by the runtime (float32, the testbed model's dtype)
and answered twice by every policy at one budget: over the float pages, and over the same
pages as an int8 tier returns them (`storage.kv.codec.quantize_roundtrip`: the bytes the disk
and Redis tiers would hold with `CONDUIT_KV_INT8`, dequantised by the runtime on its device).
Full prefill reads no page KV and is answered once, as the reference. Questions are the
probe's (`lab.testbed.probe.probe_samples`, evidence plus distractors, 6 pages).

What counts as measurable is fixed before the run: for each policy the 95% paired bootstrap
interval of accuracy(int8) - accuracy(float) over the same questions
(`lab.testbed.intervals.paired_interval`); int8 "loses nothing measurable" for a policy when
that interval contains 0 or lies above it, and for the product when it does so for every
policy. The per-question answers are compared too (how many differ at all).

Records are appended one line per question and answer as they are made (`--records`), and a
rerun with the same file skips the questions it holds, so the run can be stopped and resumed.

    conduit-lab testbed kv-int8 --n 300 --seed 31 --budget 0.1 \
        --records RUN.records.jsonl --out lab/testbed/results/kv_int8.json

Public API:
  FORMS = ("float", "int8")
  run(vlm, n, seed, budget, policies, records_path) -> None      resumable, appends records
  summarise(records_path, budget, command) -> dict               the table `--out` writes
  to_markdown(summary) -> str
  command(args) -> int                 `conduit-lab testbed kv-int8`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.loader import LoadedVLM
from conduit_core.page_kv import PageKV
from conduit_core.policies import choose_policy
from conduit_core.policies.registry import PRODUCT_POLICIES
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.testbed.batches import page_image
from lab.testbed.intervals import mean_interval, paired_interval
from lab.testbed.probe import MAX_NEW_TOKENS, probe_samples
from storage.kv.codec import quantize_roundtrip
from worker.prompt import ANSWER_PREFIX, page_label

FORMS = ("float", "int8")
FULL = "full_prefill"


def _done_ids(path: Path) -> set[str]:
    """Question ids whose records are complete in `path` (the full prefill line is the last
    one written for a question)."""
    if not path.exists():
        return set()
    done = set()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("policy") == FULL:
            done.add(str(row["id"]))
    return done


def run(vlm: LoadedVLM, n: int, seed: int, budget: float, policies: list[str],
        records_path: Path) -> None:
    """Answer the first `n` probe questions of `seed` (those not yet in `records_path`) with
    every policy over float and int8 pages, appending one record per answer."""
    runtime = ReuseRuntime(vlm, never_above_full=False)
    done = _done_ids(records_path)
    records_path.parent.mkdir(parents=True, exist_ok=True)
    with records_path.open("a") as out:
        for i, s in enumerate(probe_samples(n, seed, "distractors")):
            qid = f"q{i}-{s.question.family}-s{seed}"
            if qid in done:
                continue
            t0 = time.perf_counter()
            images = [page_image(s.doc.pages[p]) for p in s.pages]
            labels = [page_label(s.doc_name, p + 1) for p in s.pages]
            kvs = runtime.prefill_pages(images)
            forms: dict[str, list[PageKV]] = {
                "float": kvs, "int8": [quantize_roundtrip(kv) for kv in kvs]}
            rows: list[dict[str, Any]] = []
            for form, pages in forms.items():
                inputs = [PageInput(label=lab, kv=kv) for lab, kv in zip(labels, pages,
                                                                         strict=True)]
                for policy in policies:
                    req = AnswerRequest(prefix=ANSWER_PREFIX, pages=inputs, question=s.text,
                                        policy=choose_policy(policy), budget=budget,
                                        max_new_tokens=MAX_NEW_TOKENS, seed=0)
                    text = answering.answer(runtime, req).text.strip()
                    rows.append({"id": qid, "policy": policy, "form": form, "budget": budget,
                                 "text": text, "score": float(text == s.question.answer)})
            full = answering.answer_full_prefill(runtime,
                ANSWER_PREFIX, list(zip(labels, images, strict=True)), s.text,
                max_new_tokens=MAX_NEW_TOKENS).text.strip()
            rows.append({"id": qid, "policy": FULL, "form": "none", "budget": 1.0,
                         "text": full, "score": float(full == s.question.answer)})
            out.write("".join(json.dumps(r) + "\n" for r in rows))
            out.flush()
            print(f"{qid} {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)


def summarise(records_path: Path, budget: float, command: str) -> dict[str, Any]:
    """Per policy: accuracy over float and int8 pages, their paired difference with its 95%
    interval, answers that differ, and the verdict (module docstring)."""
    by: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for line in records_path.read_text().splitlines():
        row = json.loads(line)
        by.setdefault((row["policy"], row["form"]), {})[row["id"]] = row
    full = by.get((FULL, "none"), {})
    ids = sorted(full)
    table = []
    for policy in sorted({p for p, f in by if f in FORMS}):
        a = {i: by[(policy, "int8")][i]["score"] for i in ids}
        b = {i: by[(policy, "float")][i]["score"] for i in ids}
        diff = paired_interval(a, b, ids, "diff")
        table.append({
            "policy": policy, "questions": len(ids),
            "accuracy_float": sum(b.values()) / len(ids),
            "accuracy_int8": sum(a.values()) / len(ids),
            "int8_minus_float": (sum(a.values()) - sum(b.values())) / len(ids),
            "interval_95": [diff.lo, diff.hi],
            "answers_differ": sum(by[(policy, "int8")][i]["text"]
                                  != by[(policy, "float")][i]["text"] for i in ids),
            "loses_nothing_measurable": diff.hi >= 0.0})
    scores = {i: full[i]["score"] for i in ids}
    ci = mean_interval(scores, ids)
    return {"meta": {"command": command, "budget": budget, "questions": len(ids),
                     "measurable": "the 95% paired bootstrap interval of accuracy(int8) - "
                     "accuracy(float) excludes 0 from below"},
            "full_prefill": {"accuracy": sum(scores.values()) / max(1, len(ids)),
                             "interval_95": [ci.lo, ci.hi]},
            "policies": table,
            "int8_loses_nothing_measurable": all(r["loses_nothing_measurable"] for r in table)}


def to_markdown(summary: dict[str, Any]) -> str:
    """The summary as a markdown table with its command."""
    meta = summary["meta"]
    lines = [f"# Int8 against float page KV on the testbed, budget {meta['budget']:g}", "",
             "    " + meta["command"], "",
             f"{meta['questions']} questions; measurable: {meta['measurable']}. Full prefill "
             f"(reads no page KV): {summary['full_prefill']['accuracy']:.3f}.", "",
             "| policy | float | int8 | int8 - float [95%] | answers differ | loses nothing "
             "measurable |", "|---|---:|---:|---:|---:|---|"]
    for r in summary["policies"]:
        lo, hi = r["interval_95"]
        lines.append(f"| {r['policy']} | {r['accuracy_float']:.3f} | {r['accuracy_int8']:.3f} "
                     f"| {r['int8_minus_float']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                     f"{r['answers_differ']} | "
                     f"{'yes' if r['loses_nothing_measurable'] else 'no'} |")
    verdict = "yes" if summary["int8_loses_nothing_measurable"] else "no"
    lines += ["", f"Int8 loses nothing measurable for every policy: **{verdict}**."]
    return "\n".join(lines) + "\n"


def command(args: argparse.Namespace) -> int:
    """`conduit-lab testbed kv-int8`: run (resumably), then write the summary JSON to
    `args.out` and its markdown beside it."""
    from lab import command_line
    from lab.testbed.probe import load_checkpoint_vlm

    policies = [p for p in args.policies.split(",") if p] if args.policies else sorted(
        PRODUCT_POLICIES - {FULL})
    run(load_checkpoint_vlm(args.weights), args.n, args.seed, args.budget, policies,
        args.records)
    summary = summarise(args.records, args.budget, command_line())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(to_markdown(summary))
    print(to_markdown(summary))
    return 0
