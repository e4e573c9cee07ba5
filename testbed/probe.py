"""In-process accuracy of the testbed model per family and policy, with no PDFs or stores.

The fast loop used while training (`conduit testbed probe`): pages are drawn as images (the
same pixels the ingest path renders), prefilled once under the canonical page context by the
runtime, and every question is answered by full prefill and by each policy over the gold
pages, with the service's answer prefix and page labels. It also reports, per policy, how often
the refreshed set contained the asked record's result cell (the token whose stale KV lacks the
cross-page value), which shows *why* a policy wins or loses.

Public API:
  load_checkpoint_vlm(path) -> LoadedVLM      a training checkpoint or a weights file
  probe(vlm, n, seed, policies, budgets) -> list[dict]   rows per (family, policy, budget)
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import torch

from conduit_core.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.loader import LoadedVLM
from conduit_core.page_kv import ModelFingerprint
from conduit_core.policies import get_policy
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import MAX_IMAGE_TOKENS, NAME, build_testbed
from testbed.batches import Sample, draw_sample, page_image
from testbed.train import model_tensors
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


def _gold(sample: Sample) -> Sample:
    pages = [p - 1 for p in sample.record.evidence_pages]
    return Sample(sample.doc, sample.record, pages, sample.doc_name)


def probe(vlm: LoadedVLM, n: int = 200, seed: int = 7,
          policies: tuple[str, ...] = ("full_reuse", "conduit", "random"),
          budgets: tuple[float, ...] = (0.1,)) -> list[dict[str, object]]:
    """Exact match per family for full prefill and each policy x budget (gold pages)."""
    runtime = ReuseRuntime(vlm)
    rng = random.Random(f"probe:{seed}")
    hits: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    covered: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    for _ in range(n):
        s = _gold(draw_sample(rng))
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
    if s.record.page not in s.pages:
        return False
    assembly = runtime.assemble(req.prefix, req.pages, req.question)
    ctx = runtime.policy_context(assembly, req.budget, req.seed)
    chosen = set(get_policy(req.policy)(ctx).tolist())
    seg = assembly.layout.segments[s.pages.index(s.record.page)]
    return seg.start + 1 + s.record.cell in chosen
