"""`conduit-lab eval answers`: answer accuracy of refresh policies against full prefill."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lab import command_line
from lab.argtypes import floats


def add_answers_command(ev: Any) -> None:
    """Register `eval answers` on the `eval` subparsers."""
    ans = ev.add_parser(
        "answers", help="answer accuracy (MMLongBench-Doc scoring) of policies x budgets",
        description="Ingest the PDFs once into a throwaway home, answer every question with "
        "full prefill (from the page images, and from the cached page embeddings) and with "
        "every policy x budget over the same pages, score the answers "
        "and write OUT (JSON), OUT.md and OUT.png. A rerun with the same --out resumes.")
    ans.add_argument("--pdfs", type=Path, required=True, help="folder of the PDFs")
    ans.add_argument("--questions", type=Path, required=True, nargs="+",
                     help="JSONL file(s) in MMLongBench-Doc form")
    ans.add_argument("--out", type=Path, required=True, help="results JSON")
    ans.add_argument("--model", default=None, help="default: CONDUIT_MODEL")
    ans.add_argument("--device", default=None, help="default: CONDUIT_DEVICE")
    ans.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                     help="default: CONDUIT_DTYPE")
    ans.add_argument("--policies", default="all", help="comma-separated registry names or all")
    ans.add_argument("--budgets", type=floats, default=[0.05, 0.1, 0.2])
    ans.add_argument("--pages", choices=["gold", "retrieved", "shown"], default="gold",
                     help="gold: the evidence pages; retrieved: the service's top-k within "
                     "the document; shown: each question's shown_pages (evidence plus "
                     "distractor pages)")
    ans.add_argument("--top-k", type=int, default=None, help="default: CONDUIT_TOP_K")
    ans.add_argument("--max-pages", type=int, default=8,
                     help="cap on gold or shown pages per question (the first ones are kept)")
    ans.add_argument("--limit", type=int, default=None, help="first N questions only")
    ans.add_argument("--docs", type=int, default=None,
                     help="only the questions of the first N documents (in question order): "
                     "bounds the ingest")
    ans.add_argument("--max-new-tokens", type=int, default=32)
    ans.add_argument("--max-page-tokens", type=int, default=None,
                     help="visual tokens per page (default: CONDUIT_MAX_PAGE_TOKENS or the "
                     "model's)")
    ans.add_argument("--work-dir", type=Path, default=None,
                     help="keep the eval home here (reruns skip the ingest); default: a "
                     "temporary folder")
    ans.add_argument("--check-budget-one", action="store_true",
                     help="first check that CONDUIT at budget 1.0 reproduces full prefill")
    ans.add_argument("--no-progress", action="store_true")
    ans.set_defaults(func=_eval_answers)


def add_across_command(ev: Any) -> None:
    """Register `eval across` on the `eval` subparsers."""
    acr = ev.add_parser(
        "across", help="several checkpoints' answer evaluations: mean and spread per policy",
        description="Combine `eval answers` documents of the same questions on independently "
        "trained checkpoints: each policy's mean, min and max over them, and the policy with "
        "the best mean accuracy at the budget nearest 0.1; writes OUT (JSON), OUT.md, OUT.png.")
    acr.add_argument("runs", type=Path, nargs="+", help="`eval answers` result JSON files")
    acr.add_argument("--out", type=Path, required=True, help="combined JSON")
    acr.set_defaults(func=_eval_across)


def _eval_across(args: argparse.Namespace) -> int:
    from lab.answers.across import combine, discordant, write_markdown, write_plot
    from worker.settings import Settings

    try:
        docs = [json.loads(p.read_text()) for p in args.runs]
        doc = combine(docs, [p.stem for p in args.runs], command_line())
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot combine the runs: {exc}", file=sys.stderr)
        return 2
    choice = doc["choice"]
    if choice["policy"] and choice["runner_up"]:
        choice["discordant"] = []
        for path in args.runs:
            records = path.with_name(path.stem + ".records.jsonl")
            if records.is_file():
                lines = records.read_text().splitlines()[1:]
                d = discordant([json.loads(x) for x in lines if x.strip()], choice["policy"],
                               choice["runner_up"], choice["budget"])
                choice["discordant"].append({"run": path.stem, **d})
    args.out.write_text(json.dumps(doc, indent=1))
    write_markdown(doc, args.out.with_suffix(".md"), Settings().core.policy)
    write_plot(doc, args.out.with_suffix(".png"))
    print(args.out.with_suffix(".md").read_text())
    return 0


def _eval_answers(args: argparse.Namespace) -> int:
    from lab.answers.config import AnswerEvalConfig
    from lab.answers.runner import BudgetOneError, run_answer_eval
    from worker.settings import Settings

    s = Settings()
    cfg = AnswerEvalConfig(
        pdfs=args.pdfs, questions=args.questions, out=args.out,
        model=args.model or s.core.model, device=args.device or s.core.device,
        dtype=args.dtype or s.core.dtype, policies=args.policies, budgets=args.budgets,
        pages=args.pages, top_k=args.top_k or s.worker.top_k, max_pages=args.max_pages,
        limit=args.limit, docs=args.docs, max_new_tokens=args.max_new_tokens,
        max_page_tokens=args.max_page_tokens or s.core.max_page_tokens, work_dir=args.work_dir,
        check_budget_one=args.check_budget_one, progress=not args.no_progress,
        command=command_line())
    try:
        doc = run_answer_eval(cfg)
    except BudgetOneError as exc:
        print(f"correctness check failed: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    meta = doc["meta"]
    if not meta["questions_answered"]:
        print(f"no question could be answered: {len(meta['questions_skipped'])} skipped, "
              f"documents not ingested: {meta['documents_failed']}", file=sys.stderr)
        return 1
    for r in doc["rows"]:
        if r["group"] == "all":
            print(f"{r['policy']:18s} {r['budget']:.2f}  n={r['n']:4d}  acc={r['accuracy']:.3f}"
                  f"  agree={r['agreement_with_full']:.3f}  flops_lm={r['flops_ratio_lm']:.3f}"
                  f"  ttft={r['ttft_ms_median']:.1f}ms"
                  f"  vs_full={_times(r['ttft_speedup_vs_full'])}"
                  f"  vs_cached={_times(r['ttft_speedup_vs_cached'])}")
    print(f"wrote {args.out}, {args.out.with_suffix('.md')}, {args.out.with_suffix('.png')}")
    return 0


def _times(speedup: float | None) -> str:
    """A TTFT speed-up for the console ('-' where there is none)."""
    return "-" if speedup is None else f"{speedup:.2f}x"
