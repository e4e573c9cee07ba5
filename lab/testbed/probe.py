"""In-process accuracy of the testbed model per family and policy, with no PDFs or stores.

The fast loop used while training (`conduit-lab testbed probe`): pages are drawn as images (the
same pixels the ingest path renders), prefilled once under the canonical page context by the
runtime, and every question is answered by full prefill and by each policy, with the service's
answer prefix and page labels, over its evidence pages (`pages="gold"`) or over them plus
distractor pages of the same document, `SHOWN` in all (`"distractors"`), in document order.
It also reports, per policy, how often the refreshed set contained the asked records' result
cells (the tokens whose stale KV lacks the cross-page value; a pair question counts when both
are refreshed), which shows *why* a policy wins or loses, and the mean language-model FLOPs
against a full prefill of the same layout.

Public API:
  PAGE_MODES = ("gold", "distractors");  SHOWN = 6
  load_checkpoint_vlm(path) -> LoadedVLM      a training checkpoint or a weights file
  probe(vlm, n, seed, policies, budgets, pages, label_cache, label_refresh, records, first)
      -> list[dict]
      rows per (family, policy, budget); `records`, a list, gets one record per question and
      row as `eval answers` writes them ({"id", "policy", "budget", "score"}; the id
      `q<i>-<family>-s<seed>`), for `lab.testbed.intervals`
  probe_samples(n, seed, pages) -> Iterator[Sample]   the probe's samples over the shown pages
  page_cell_rows(assembly, sample, page) -> range   sequence indices of a shown page's cells
  refreshed_cells(runtime, assembly, sample, policy, budget, seed) -> [(page, cell) | None]
  key_cells(sample) -> [(page, cell)]          the asked records' key (= result) cells
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.model.loader import LoadedVLM
from conduit_core.model.testbed_model import MAX_IMAGE_TOKENS, NAME, build_testbed
from conduit_core.page_kv import ModelFingerprint
from conduit_core.passes.assembly import Assembly
from conduit_core.policies import choose_policy, get_policy
from conduit_core.prompt.layout import LabelRefresh
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.testbed.batches import Sample, draw_sample, page_image, shown_pages
from lab.testbed.train import model_tensors
from worker.prompt import ANSWER_PREFIX, page_label

PAGE_MODES = ("gold", "distractors")
SHOWN = 6  # pages shown with distractors (evidence included), as `testbed generate` writes
MAX_NEW_TOKENS = 4  # a pair's answer is three tokens ("5 7"), then the end of the turn


def load_checkpoint_vlm(path: Path) -> LoadedVLM:
    """The testbed model with weights from `path` (checkpoint or plain weights file); a file
    whose tensors are not the testbed model's (a model folder's `model.safetensors`, whose
    names differ) is refused rather than leaving weights random."""
    model, processor = build_testbed(weights=None)
    loaded = model.load_state_dict(model_tensors(path), strict=False)
    missing = set(loaded.missing_keys) - {"lm_head.weight"}  # tied to the embeddings
    if missing or loaded.unexpected_keys:
        raise ValueError(f"{path} does not hold the testbed model's tensors ({len(missing)} "
                         f"missing, {len(loaded.unexpected_keys)} unexpected; for a model "
                         "folder pass the run's checkpoint or `testbed export` it to a file)")
    model.tie_weights()
    model.eval()
    adapter = Qwen2VLAdapter(model, processor, processor.tokenizer, MAX_IMAGE_TOKENS)
    fp = ModelFingerprint(name=f"probe:{NAME}", revision=str(path), dtype="float32",
                          config_hash="probe", template_version=adapter.template_version)
    return LoadedVLM(name=NAME, model=model, processor=processor, tokenizer=processor.tokenizer,
                     adapter=adapter, fingerprint=fp, device=torch.device("cpu"),
                     dtype=torch.float32)


def probe_samples(n: int, seed: int = 7, pages: str = "gold") -> Iterator[Sample]:
    """The probe's `n` samples for `seed`: the same documents and questions in either mode,
    each over its question's evidence pages (`"gold"`) or over them plus distractors drawn
    per sample, `SHOWN` pages in all or every page (`"distractors"`), in document order."""
    if pages not in PAGE_MODES:
        raise ValueError(f"pages must be one of {PAGE_MODES}, got {pages!r}")
    rng = random.Random(f"probe:{seed}")
    for i in range(n):
        s = draw_sample(rng)
        needed = s.question.evidence_indices
        shown = sorted(needed) if pages == "gold" else shown_pages(
            s.doc, needed, SHOWN, random.Random(f"probe:{seed}:{i}:shown"))
        yield Sample(s.doc, s.question, shown, s.doc_name)


def key_cells(s: Sample) -> list[tuple[int, int]]:
    """The (page, cell) of each asked record's key cell: the result cell a question reads."""
    return [(r.page, r.cell) for r in s.question.records]


def page_cell_rows(assembly: Assembly, s: Sample, page: int) -> range:
    """The sequence indices of shown page `page`'s glyph cells, in cell order (after the
    page's start token)."""
    start = assembly.layout.segments[s.pages.index(page)].start + 1
    return range(start, start + s.doc.shape.cells)


def refreshed_cells(runtime: ReuseRuntime, assembly: Assembly, s: Sample, policy: str,
                    budget: float, seed: int | None = 0) -> list[tuple[int, int] | None]:
    """The tokens `policy` refreshes at `budget`, each as (page, cell) of `s`, or None for a
    token that is no glyph cell (a page's delimiters)."""
    cells = {row: (page, cell) for page in s.pages
             for cell, row in enumerate(page_cell_rows(assembly, s, page))}
    chosen = get_policy(policy)(runtime.reuse.policy_context(assembly, budget, seed)).tolist()
    return [cells.get(i) for i in chosen]


def probe(vlm: LoadedVLM, n: int = 200, seed: int = 7,
          policies: tuple[str, ...] = ("full_reuse", "conduit", "random"),
          budgets: tuple[float, ...] = (0.1,), pages: str = "gold",
          label_cache: bool = True, label_refresh: LabelRefresh = "read",
          records: list[dict[str, object]] | None = None,
          first: int = 0) -> list[dict[str, object]]:
    """Exact match per family for full prefill and each policy x budget, over the pages of
    `probe_samples(n, seed, pages)`; with the share of questions whose asked key cells were
    all refreshed and the mean LM FLOPs ratio to a full prefill. `label_cache`: page labels
    stale from the runtime's label cache, computed with the pages (charged to no policy);
    `label_refresh`: which of them a refresh recomputes (the runtime's option and default).
    `first`: the samples before it are drawn and skipped (a run that extends an earlier one)."""
    runtime = ReuseRuntime(vlm, never_above_full=False,  # each policy's own choice
                           label_cache=label_cache, label_refresh=label_refresh)
    hits: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    covered: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    flops: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    def record(qid: str, policy: str, budget: float, right: bool) -> None:
        if records is not None:
            records.append({"id": qid, "policy": policy, "budget": budget,
                            "score": float(right)})

    for i, s in enumerate(probe_samples(n, seed, pages)):
        if i < first:
            continue
        qid = f"q{i}-{s.question.family}-s{seed}"
        images = [page_image(s.doc.pages[p]) for p in s.pages]
        labels = [page_label(s.doc_name, p + 1) for p in s.pages]
        kvs = runtime.prefill_pages(images)
        fam, want = s.question.family, s.question.answer
        full = answering.answer_full_prefill(runtime,
            ANSWER_PREFIX, list(zip(labels, images, strict=True)),
                                           s.text, max_new_tokens=MAX_NEW_TOKENS)
        hits[(fam, "full_prefill", 1.0)].append(full.text.strip() == want)
        record(qid, "full_prefill", 1.0, full.text.strip() == want)
        flops[(fam, "full_prefill", 1.0)].append(full.flops_ratio_lm)
        inputs = [PageInput(label=lab, kv=kv) for lab, kv in zip(labels, kvs, strict=True)]
        answering.warm_labels(runtime, ANSWER_PREFIX, inputs)  # the labels, with the pages
        for policy in policies:
            for budget in budgets:
                req = AnswerRequest(prefix=ANSWER_PREFIX, pages=inputs, question=s.text,
                                    policy=choose_policy(policy), budget=budget,
                                    max_new_tokens=MAX_NEW_TOKENS,
                                    seed=0)
                res = answering.answer(runtime, req)
                hits[(fam, policy, budget)].append(res.text.strip() == want)
                record(qid, policy, budget, res.text.strip() == want)
                flops[(fam, policy, budget)].append(res.flops_ratio_lm)
                covered[(fam, policy, budget)].append(_covers(runtime, req, s))
    rows = []
    for key, h in sorted(hits.items()):
        fam, policy, budget = key
        cov = covered.get(key)
        rows.append({"family": fam, "policy": policy, "budget": budget, "pages": pages,
                     "n": len(h), "accuracy": sum(h) / len(h),
                     "result_cell_refreshed": sum(cov) / len(cov) if cov else None,
                     "flops_ratio_lm": sum(flops[key]) / len(flops[key])})
    return rows


def _covers(runtime: ReuseRuntime, req: AnswerRequest, s: Sample) -> bool:
    """Whether the policy's refreshed set holds every asked record's result cell."""
    assembly = runtime.reuse.assemble(req.prefix, req.pages, req.question)
    chosen = set(refreshed_cells(runtime, assembly, s, req.policy.name, req.budget, req.seed))
    return all(cell in chosen for cell in key_cells(s))
