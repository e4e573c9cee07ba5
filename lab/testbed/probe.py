"""In-process accuracy of the testbed model per family and policy, with no PDFs or stores.

The fast loop used while training (`conduit-lab testbed probe`): pages are drawn as images (the
same pixels the ingest path renders), prefilled once under the canonical page context by the
runtime, and every question is answered by full prefill and by each policy over the gold
pages, with the service's answer prefix and page labels. It also reports, per policy, how often
the refreshed set contained the asked record's result cell (the token whose stale KV lacks the
cross-page value), which shows *why* a policy wins or loses.

Public API:
  load_checkpoint_vlm(path) -> LoadedVLM      a training checkpoint or a weights file
  probe(vlm, n, seed, policies, budgets) -> list[dict]   rows per (family, policy, budget)
  gold_samples(n, seed) -> Iterator[Sample]   the probe's samples, over their evidence pages
  refreshed_cells(runtime, assembly, sample, policy, budget, seed) -> [(page, cell) | None]
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch

from conduit_core.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.loader import LoadedVLM
from conduit_core.page_kv import ModelFingerprint
from conduit_core.policies import get_policy
from conduit_core.runtime import Assembly, ReuseRuntime
from conduit_core.testbed_model import MAX_IMAGE_TOKENS, NAME, build_testbed
from lab.testbed.batches import Sample, draw_sample, page_image
from lab.testbed.task import COLS
from lab.testbed.train import model_tensors
from worker.answer_job import ANSWER_PREFIX, page_label


def load_checkpoint_vlm(path: Path) -> LoadedVLM:
    """The testbed model with weights from `path` (checkpoint or plain weights file)."""
    model, processor = build_testbed(weights=None)
    model.load_state_dict(model_tensors(path), strict=False)
    model.tie_weights()
    model.eval()
    adapter = Qwen2VLAdapter(model, processor, processor.tokenizer, MAX_IMAGE_TOKENS)
    fp = ModelFingerprint(name=f"probe:{NAME}", revision=str(path), dtype="float32",
                          config_hash="probe", template_version=adapter.template_version)
    return LoadedVLM(name=NAME, model=model, processor=processor, tokenizer=processor.tokenizer,
                     adapter=adapter, fingerprint=fp, device=torch.device("cpu"),
                     dtype=torch.float32)


def gold_samples(n: int, seed: int = 7) -> Iterator[Sample]:
    """The probe's `n` samples for `seed`, each over its question's evidence pages only."""
    rng = random.Random(f"probe:{seed}")
    for _ in range(n):
        s = draw_sample(rng)
        yield Sample(s.doc, s.record, [p - 1 for p in s.record.evidence_pages], s.doc_name)


def refreshed_cells(runtime: ReuseRuntime, assembly: Assembly, s: Sample, policy: str,
                    budget: float, seed: int | None = 0) -> list[tuple[int, int] | None]:
    """The tokens `policy` refreshes at `budget`, each as (page, cell) of `s`, or None for a
    token that is no glyph cell (a page's delimiters)."""
    cells: dict[int, tuple[int, int]] = {}  # sequence index -> (page, cell)
    for seg, page in zip(assembly.layout.segments, s.pages, strict=True):
        for cell in range(len(s.doc.pages[page]) * COLS):
            cells[seg.start + 1 + cell] = (page, cell)
    chosen = get_policy(policy)(runtime.policy_context(assembly, budget, seed)).tolist()
    return [cells.get(i) for i in chosen]


def probe(vlm: LoadedVLM, n: int = 200, seed: int = 7,
          policies: tuple[str, ...] = ("full_reuse", "conduit", "random"),
          budgets: tuple[float, ...] = (0.1,)) -> list[dict[str, object]]:
    """Exact match per family for full prefill and each policy x budget (gold pages)."""
    runtime = ReuseRuntime(vlm, never_above_full=False)  # each policy's own choice
    hits: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    covered: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    for s in gold_samples(n, seed):
        images = [page_image(s.doc.pages[p]) for p in s.pages]
        labels = [page_label(s.doc_name, p + 1) for p in s.pages]
        kvs = runtime.prefill_pages(images)
        fam, want = s.record.family, s.record.answer
        full = runtime.answer_full_prefill(ANSWER_PREFIX, list(zip(labels, images, strict=True)),
                                           s.question, max_new_tokens=2)
        hits[(fam, "full_prefill", 1.0)].append(full.text.strip() == want)
        pages = [PageInput(label=lab, kv=kv) for lab, kv in zip(labels, kvs, strict=True)]
        for policy in policies:
            for budget in budgets:
                req = AnswerRequest(prefix=ANSWER_PREFIX, pages=pages, question=s.question,
                                    policy=policy, budget=budget, max_new_tokens=2, seed=0)
                res = runtime.answer(req)
                hits[(fam, policy, budget)].append(res.text.strip() == want)
                covered[(fam, policy, budget)].append(
                    _covers(runtime, req, s))
    rows = []
    for (fam, policy, budget), h in sorted(hits.items()):
        cov = covered.get((fam, policy, budget))
        rows.append({"family": fam, "policy": policy, "budget": budget, "n": len(h),
                     "accuracy": sum(h) / len(h),
                     "result_cell_refreshed": sum(cov) / len(cov) if cov else None})
    return rows


def _covers(runtime: ReuseRuntime, req: AnswerRequest, s: Sample) -> bool:
    """Whether the policy's refreshed set holds the asked record's result cell."""
    assembly = runtime.assemble(req.prefix, req.pages, req.question)
    return (s.record.page, s.record.cell) in refreshed_cells(runtime, assembly, s, req.policy,
                                                            req.budget, req.seed)
