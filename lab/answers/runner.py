"""`conduit-lab eval answers`: answer accuracy of every refresh policy x budget against full
prefill.

Steps:
  1. the documents the questions name are ingested once through the normal pipeline into
     an eval home (a throwaway temporary folder, or `work_dir` to keep it across reruns);
     `pages="gold"` and `pages="shown"` ingest without OCR and prefill only the pages
     questions use (on first use, as the service does for a missing page);
     `pages="retrieved"` ingests exactly as the service does (OCR per `CONDUIT_OCR`, prefill
     on ingest);
  2. per question, its pages: `gold` = the evidence pages in document order, at most
     `max_pages` (the first ones; capped questions are counted); `shown` = the same with the
     question's `shown_pages` (its evidence pages plus distractor pages of the document),
     or its evidence pages where the row has no `shown_pages` (counted); a question with no
     pages listed ("Not answerable") gets the retrieved pages in both modes (counted).
     `retrieved` = the service's retrieval (`worker.answer_job.retrieve`) within the
     question's document, top-k, in the service's reading order (`reading_order`: page
     order within a document);
  3. two references, then every policy x budget from the cached page KV, all under the
     service's `ANSWER_PREFIX` and page labels, greedy, `max_new_tokens` (with the label
     cache on, the question's labels are computed once before them, like the page KV at
     ingest, so no policy's FLOPs carry them and each runs on the same cached labels):
       `full_prefill` (budget 1.0): full prefill from the page images
         (`lab.answering.answer_full_prefill`: vision tower, then every row on the plain
         causal path);
       `full_prefill_cached` (budget 1.0): `lab.answering.answer` with the registered `full_prefill`
         policy over the cached pages. The page KV is assembled (loaded, re-rotated) as for
         any policy, the policy selects every visual row, and the refresh recomputes every
         visual row from the page's cached layer-0 embeddings (the vision tower's output at
         ingest; the tower does not run) together with every text row after the cached
         head, through every layer (the last only for the row whose logits are read, as
         in the reference), so no stale K/V is read: the same values as a full prefill,
         without the vision tower. With the head cache on, the head's rows come from the
         head cache (exact: they depend only on the head's tokens) and the rest runs on
         the masked path; where `never_above_full` predicts the plain causal path over
         every row cheaper, the runtime runs that instead, head included, and records
         `fallback`. Its TTFT includes the page-KV load like a policy's (the run's first
         such answer also fills the head cache once); it is not a registered policy
         (`results.CACHED_REFERENCE`);
  4. grades (`grading`), records (`results.Records`: a rerun with the same out skips what
     is done, both references included) and the outputs: OUT (JSON `{"meta", "rows"}`),
     OUT.md and OUT.png.

`full_reuse` and `prefix_reuse` ignore the budget: each runs once per question and its
answer is recorded at every budget. `full_prefill` is the reference row itself.

Public API (the run's configuration, `AnswerEvalConfig`, is in `lab.answers.config`):
  BudgetOneError(RuntimeError)
  run_answer_eval(config) -> dict   (the document written to `config.out`)
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from tqdm import tqdm

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from conduit_core import AnswerRequest, PageInput
from conduit_core.answer_types import AnswerResult
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import PolicyOptions
from lab import answering
from lab.answers.config import (
    AnswerEvalConfig,
    check_config,
    eval_settings,
    resolve_policies,
)
from lab.answers.corpus import EvalCorpus, ingest_documents
from lab.answers.grading import agreement, score_answer
from lab.answers.questions import EvalItem, load_items
from lab.answers.report import write_plot, write_table
from lab.answers.results import (
    BUDGET_FREE,
    CACHED_REFERENCE,
    REFERENCE,
    Record,
    Records,
    build_rows,
)
from lab.refresh_probe import probe_full_prefill, probe_refresh
from storage.keys import PageHash
from storage.metadata import Page
from worker.answer_job import Question, reading_order, retrieve
from worker.context import WorkerContext, build_context
from worker.ingest_job import ensure_prefilled
from worker.policy_options import settle_policy
from worker.prompt import ANSWER_PREFIX, page_label
from worker.settings import Settings

TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}  # as lab.ttft.bench's check
INT8_STEP = 1 / 127  # int8 page KV: a key is within half a step of its scale group's max
CHECKPOINT_EVERY = 10  # questions between rewrites of the outputs


class BudgetOneError(RuntimeError):
    """CONDUIT at budget 1.0 did not reproduce full prefill's first token."""


@dataclass
class _Run:
    cfg: AnswerEvalConfig
    ctx: WorkerContext
    corpus: EvalCorpus
    records: Records
    policies: list[str]
    computed: int = 0
    check: dict[str, Any] | None = None

    def pages_for(self, item: EvalItem) -> tuple[list[Page], dict[str, Any]]:
        doc = self.corpus.documents[item.doc]
        info: dict[str, Any] = {"capped": False, "fallback": False, "missing_pages": 0}
        listed = item.evidence_pages
        if self.cfg.pages == "shown":
            info["shown_fallback"] = not item.shown_pages and bool(item.evidence_pages)
            listed = item.shown_pages or item.evidence_pages
        if self.cfg.pages != "retrieved" and listed:
            by_number = {p.number: p for p in self.ctx.meta.list_pages(
                self.corpus.collection_id, [doc.id])}
            wanted = [n for n in listed if n in by_number]  # document order
            info["missing_pages"] = len(listed) - len(wanted)
            info["capped"] = len(wanted) > self.cfg.max_pages
            if wanted:
                return [by_number[n] for n in wanted[:self.cfg.max_pages]], info
        info["fallback"] = self.cfg.pages != "retrieved"
        hits = retrieve(self.ctx, Question(
            collection_id=self.corpus.collection_id, question=item.question,
            top_k=self.cfg.top_k, max_new_tokens=self.cfg.max_new_tokens,
            document_ids=[doc.id]))
        pages = reading_order(hits)
        if item.evidence_pages:
            got = {p.number for p in pages}
            info["gold_recall"] = len(got & set(item.evidence_pages)) / len(item.evidence_pages)
        return pages, info

    def record(self, item: EvalItem, policy: str, budget: float, result: AnswerResult,
               reference: str, **more: Any) -> Record:
        return {
            "id": item.id, "policy": policy, "budget": budget, "answer": result.text,
            "score": score_answer(item.answer, result.text, item.answer_format),
            "agree": agreement(result.text, reference, item.answer_format),
            "flops_ratio_lm": round(result.flops_ratio_lm, 6),
            "flops_ratio_total": round(result.flops_ratio_total, 6),
            "ttft_ms": round(result.ttft_s * 1000, 3),
            "refreshed": result.refreshed_visual_tokens, "visual": result.visual_tokens,
            "fallback": result.fallback, **more}

    def run_question(self, item: EvalItem) -> None:
        cells = [(p, float(b)) for p in self.policies for b in self.cfg.budgets]
        todo = [c for c in cells if not self.records.done(item.id, *c)]
        ref_rec = self.records.get(item.id, REFERENCE, 1.0)
        cached_done = self.records.done(item.id, CACHED_REFERENCE, 1.0)
        if ref_rec is not None and cached_done and not todo and (
                self.check is not None or not self.cfg.check_budget_one):
            return
        pages, info = self.pages_for(item)
        ensure_prefilled(self.ctx, pages)
        t0 = time.perf_counter()
        kvs = self.ctx.kv.get_many([PageHash(p.page_hash) for p in pages])
        kv_load_ms = round((time.perf_counter() - t0) * 1000, 3)
        filename = self.corpus.documents[item.doc].filename
        labels = [page_label(filename, p.number) for p in pages]
        inputs = [PageInput(label=lab, kv=kvs[PageHash(p.page_hash)])
                  for lab, p in zip(labels, pages, strict=True)]
        rt = self.ctx.runtime
        with self.ctx.model_lock:  # the labels computed with the pages, charged to no answer
            answering.warm_labels(rt, ANSWER_PREFIX, inputs)
        new: list[Record] = []
        if self.check is None and self.cfg.check_budget_one:
            self.check = self.budget_one(labels, pages, inputs, item.question)
        if ref_rec is None:
            images = [(lab, Image.open(self.ctx.page_image_path(p.image_path)).convert("RGB"))
                      for lab, p in zip(labels, pages, strict=True)]
            with self.ctx.model_lock:
                ref = answering.answer_full_prefill(rt, ANSWER_PREFIX, images, item.question,
                                             max_new_tokens=self.cfg.max_new_tokens)
            ref_rec = self.record(item, REFERENCE, 1.0, ref, ref.text,
                                  pages=[p.number for p in pages], kv_load_ms=0.0, **info)
            new.append(ref_rec)
        reference = str(ref_rec["answer"])
        if not cached_done:  # the registered full_prefill policy over the cached pages
            result = self.answer(item, inputs, REFERENCE, 1.0)
            new.append(self.record(item, CACHED_REFERENCE, 1.0, result, reference,
                                   kv_load_ms=kv_load_ms, head_tokens=result.head_tokens))
        same: dict[str, Record] = {}
        for policy, budget in todo:
            if policy in BUDGET_FREE and policy in same:
                new.append({**same[policy], "budget": budget})
                continue
            result = self.answer(item, inputs, policy, budget)
            rec = self.record(item, policy, budget, result, reference, kv_load_ms=kv_load_ms)
            same[policy] = rec
            new.append(rec)
        self.computed += len(new)
        self.records.add(new)

    def answer(self, item: EvalItem, inputs: list[PageInput], policy: str,
               budget: float) -> AnswerResult:
        """The question answered over its cached pages with a registered policy."""
        request = AnswerRequest(
            prefix=ANSWER_PREFIX, pages=inputs, question=item.question,
            policy=settle_policy(self.ctx.settings, policy, PolicyOptions()), budget=budget,
            max_new_tokens=self.cfg.max_new_tokens, seed=self.cfg.seed)
        with self.ctx.model_lock:
            return answering.answer(self.ctx.runtime, request)

    def budget_one(self, labels: list[str], pages: list[Page], inputs: list[PageInput],
                   question: str) -> dict[str, Any]:
        """The run's correctness check on its first question; raises `BudgetOneError`.

        CONDUIT at budget 1.0 from the cached pages against full prefill from the images
        (first-token logits): with the head cache the refresh computes the rows after the
        head on the masked (mixed) path, not the plain causal one. And re-rotation: layer-0
        keys of the reused pages, re-rotated to their new positions, against the keys a full
        prefill computes there (exact: layer 0 sees only the token and its position)."""
        rt = self.ctx.runtime
        images = [(lab, Image.open(self.ctx.page_image_path(p.image_path)).convert("RGB"))
                  for lab, p in zip(labels, pages, strict=True)]
        request = AnswerRequest(ANSWER_PREFIX, inputs, question,
                                policy=choose_policy("conduit"), budget=1.0,
                                max_new_tokens=1)
        with self.ctx.model_lock:
            ref = probe_full_prefill(rt, ANSWER_PREFIX, images, question).logits[-1]  # (V,)
            probe = probe_refresh(rt, request)
            fresh = answering.assemble_fresh(rt, ANSWER_PREFIX, images, question)
            answering.prefill(rt, fresh, fresh.layout.visual_rows())
            reused = rt.reuse.assemble(ANSWER_PREFIX, inputs, question)
        got = probe.logits[-1]  # (V,)
        vis = reused.layout.visual_rows().to(reused.cache.keys.device)
        k_reused = reused.cache.keys[0, 0][:, vis].float()  # (G, N_v, hd) re-rotated
        k_fresh = fresh.cache.keys[0, 0][:, vis].float()  # (G, N_v, hd)
        rerotation = float((k_reused - k_fresh).abs().max() / k_fresh.abs().max().clamp_min(
            1e-12))
        dtype = str(rt.adapter.dtype).removeprefix("torch.")
        rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        top1 = bool(got.argmax() == ref.argmax())
        tolerance = TOLERANCE.get(dtype, 1e-4)
        mixed = int(probe.computed_rows.numel()) < reused.layout.n  # not the plain causal path
        # int8 pages (the store's default) hold keys rounded to their scale's step: the
        # re-rotation is checked within that rounding, the budget-1.0 logits exactly
        int8 = any(p.kv.quantized for p in inputs)
        rotation_tolerance = max(tolerance, INT8_STEP) if int8 else tolerance
        check = {"budget_one_rel_diff": rel, "top1_equal": top1, "tolerance": tolerance,
                 "rerotation_layer0_rel_diff": rerotation,
                 "rerotation_tolerance": rotation_tolerance, "int8_pages": int8,
                 "mixed_path": mixed, "head_tokens": reused.exact_rows, "pages": len(pages),
                 "passed": top1 and rel <= tolerance and rerotation <= rotation_tolerance}
        if not check["passed"]:
            raise BudgetOneError(f"budget 1.0 or re-rotation differs from full prefill: {check}")
        return check


def _config_key(cfg: AnswerEvalConfig, settings: Settings) -> dict[str, Any]:
    return {"model": cfg.model, "dtype": settings.core.torch_dtype, "pages": cfg.pages,
            "top_k": cfg.top_k, "max_pages": cfg.max_pages,
            "max_new_tokens": cfg.max_new_tokens, "max_page_tokens": cfg.max_page_tokens,
            "prefix": ANSWER_PREFIX, "seed": cfg.seed}


def _knobs(settings: Settings, policy: str) -> dict[str, str]:
    """The knobs a policy ran with: its configuration after the deployment's options (a
    plain-function policy has none)."""
    if policy == REFERENCE:
        return {}
    configured = settle_policy(settings, policy, PolicyOptions()).select
    config = getattr(configured, "config", configured)
    if not is_dataclass(config):
        return {}
    return {f.name: repr(getattr(config, f.name)) for f in fields(config)}


def _meta(run: _Run, items: list[EvalItem], selected: list[EvalItem], skipped: dict[str, str],
          started: float) -> dict[str, Any]:
    refs = [r for i in selected if (r := run.records.get(i.id, REFERENCE, 1.0)) is not None]
    recalls = [r["gold_recall"] for r in refs if "gold_recall" in r]
    cfg, s = run.cfg, run.ctx.settings
    return {
        "command": cfg.command, "model": cfg.model, "device": cfg.device,
        "dtype": s.core.torch_dtype, "random_weights": cfg.model.startswith("builtin:tiny-"),
        "pages_mode": cfg.pages, "top_k": cfg.top_k, "max_pages": cfg.max_pages,
        "max_new_tokens": cfg.max_new_tokens, "policies": run.policies,
        "policy_options": {p: _knobs(s, p) for p in run.policies},
        "head_cache": s.core.head_cache, "label_cache": s.core.label_cache,
        "label_refresh": s.core.label_refresh,
        "never_above_full": s.core.never_above_full,
        "budgets": [float(b) for b in cfg.budgets], "prefix": ANSWER_PREFIX,
        "questions_in_files": len(items), "questions_selected": len(selected),
        "limit": cfg.limit, "docs": cfg.docs,
        "questions_answered": len(refs), "questions_skipped": skipped,
        "questions_capped": sum(bool(r.get("capped")) for r in refs),
        "questions_on_retrieved_pages_without_evidence": sum(
            bool(r.get("fallback")) for r in refs),
        "questions_on_evidence_pages_without_shown_pages": sum(
            bool(r.get("shown_fallback")) for r in refs),
        "evidence_pages_out_of_range": sum(int(r.get("missing_pages", 0)) for r in refs),
        "pages_per_question_mean": round(sum(len(r["pages"]) for r in refs)
                                         / max(len(refs), 1), 3),
        "visual_tokens_per_question_mean": round(sum(r["visual"] for r in refs)
                                                 / max(len(refs), 1), 1),
        "retrieved_gold_page_recall": (round(sum(recalls) / len(recalls), 4)
                                       if recalls else None),
        "documents_ingested": len(run.corpus.documents),
        "documents_failed": run.corpus.failed, "ingest_s": round(run.corpus.seconds, 1),
        "answers_computed_this_run": run.computed,
        "wall_s_this_run": round(time.perf_counter() - started, 1),
        "budget_one_check": run.check, **cfg.extra,
    }


def _write(run: _Run, items: list[EvalItem], selected: list[EvalItem], skipped: dict[str, str],
           started: float) -> dict[str, Any]:
    rows = build_rows(selected, run.records.all(), run.policies, run.cfg.budgets)
    doc = {"meta": _meta(run, items, selected, skipped, started), "rows": rows}
    out = run.cfg.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    write_table(doc, out.with_suffix(".md"))
    write_plot(doc, out.with_suffix(".png"))
    return doc


def _running(run: _Run, done: list[EvalItem]) -> str:
    def acc(policy: str, budget: float) -> str:
        got = [r["score"] for i in done if (r := run.records.get(i.id, policy, budget))]
        return f"{sum(got) / len(got):.3f}" if got else "-"

    b = min(run.cfg.budgets, key=lambda x: abs(x - 0.1))
    first = "conduit" if "conduit" in run.policies else (run.policies or [REFERENCE])[0]
    return f"acc full={acc(REFERENCE, 1.0)} {first}@{b:g}={acc(first, float(b))}"


def _select(items: list[EvalItem], docs: int | None, limit: int | None) -> list[EvalItem]:
    """The questions of the first `docs` documents (in question order), then the first
    `limit` of those."""
    if docs is not None:
        keep = set(list(dict.fromkeys(i.doc for i in items))[:docs])
        items = [i for i in items if i.doc in keep]
    return items[:limit] if limit else items


def run_answer_eval(cfg: AnswerEvalConfig) -> dict[str, Any]:
    """Run (or resume) the evaluation and write its three outputs; returns the JSON document.

    Raises `ValueError` (including `QuestionsError` and `RecordsMismatchError`) on bad input
    before any model work, and `BudgetOneError` when `check_budget_one` fails."""
    started = time.perf_counter()
    check_config(cfg)
    policies = resolve_policies(cfg.policies)
    items = load_items(cfg.questions)
    selected = _select(items, cfg.docs, cfg.limit)
    absent = sorted({i.doc for i in selected if not (cfg.pdfs / i.doc).is_file()})
    if absent:
        raise ValueError(f"{len(absent)} document(s) named by the questions are not in "
                         f"{cfg.pdfs}: {', '.join(absent[:5])}")
    with contextlib.ExitStack() as stack:
        home = cfg.work_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="conduit-eval-")))
        settings = eval_settings(cfg, home)
        records = Records(cfg.out.with_suffix(".records.jsonl"), _config_key(cfg, settings))
        ctx = build_context(settings)
        stack.callback(ctx.close)
        corpus = ingest_documents(ctx, cfg.pdfs, [i.doc for i in selected],
                                  collection=f"answer-eval-{cfg.pages}", progress=cfg.progress)
        records.pin_model(ctx.runtime.vlm.fingerprint.revision)  # the weights answered with
        run = _Run(cfg, ctx, corpus, records, policies)
        skipped = {i.id: f"document not ingested: {corpus.failed[i.doc]}"
                   for i in selected if i.doc in corpus.failed}
        todo = [i for i in selected if i.id not in skipped]
        done: list[EvalItem] = []
        bar = tqdm(todo, desc="questions", unit="q", disable=not cfg.progress)
        for n, item in enumerate(bar, start=1):
            run.run_question(item)
            done.append(item)
            bar.set_postfix_str(_running(run, done))
            if n % CHECKPOINT_EVERY == 0:
                _write(run, items, selected, skipped, started)
        return _write(run, items, selected, skipped, started)

