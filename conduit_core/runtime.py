"""The reuse runtime: what the product calls to run one VLM over cached pages.

The worker calls six methods: `prefill_pages` (each page prefilled once, under the canonical
page context, returned on the host for the page KV store), `prefill_steps` (an answer's
prefill in phases, for the answer engine to run other work between them), `step` (one decode
step of many answers, batched), `result` and `release` (an answer's accounting; its decode
slot given back) and `prepare_decode` (the decode step captured or compiled before the first
answer). Nothing else is public: the steps a prefill walks are `ReuseSteps`
(`conduit_core.reuse_steps`, reached as `.reuse`), which the lab and the tests also call one
by one, and what only they need (a whole answer at once, a full prefill from images, labels
computed ahead) is built on this surface in `lab/answering.py`. The lab watches the passes
through `.reuse.observer` (`conduit_core.pass_observer`), not by overriding methods.

What the runtime decides (its options):
  head_cache: the prompt head (template opening + prefix, rows before the first page label)
      is computed once per prefix and copied into each assembled cache
      (`conduit_core.passes.prompt_head`); False computes it with every question.
  label_cache: page labels are computed once after the head and reused stale like their
      pages (`conduit_core.label_cache`; needs head_cache); False computes them as text rows
      in every pass. A label computed for an answer is charged to it. label_entries: labels
      kept (least recently used dropped).
  label_refresh: with the label cache, which labels a refresh recomputes: "page" those of the
      pages it refreshes whole, "always" every stale label (the scoring pass reads them stale;
      the first, right after the head, is exact as cached; `Layout.label_refresh`; the
      default, as the service's `CONDUIT_LABEL_REFRESH`), "budget" the same labels, their
      rows counted against the refresh budget.
  never_above_full: before a policy runs, its LM FLOPs are predicted
      (`conduit_core.cost.cost_model`); where they exceed a full prefill from the cached page
      embeddings, that runs instead (`AnswerResult.fallback`).
  decode_slots, decode_positions: the answers being generated share one `DecodePool` of at
      most this many slots and positions (`.pool`; one attention call a layer for all of
      them); an answer it cannot hold decodes from its own cache.
  decode_compile: "off", "auto" or "on": how a step of the pooled answers runs
      (`conduit_core.passes.step_graphs`: CUDA graphs, compiled, or eager); other than eager,
      the pool is fixed at its largest (`DecodePool(fixed=True)`).
"""

from __future__ import annotations

import time
from collections.abc import Generator

import torch
from PIL import Image

from conduit_core.answer_state import AnswerState, answer_result
from conduit_core.answer_types import AnswerRequest, AnswerResult, TokenCallback
from conduit_core.cost.cost_model import RefreshPlan
from conduit_core.decode import decode_step
from conduit_core.kv.kv_pool import DecodePool
from conduit_core.model.loader import LoadedVLM
from conduit_core.page_kv import PageKV
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.page_prefill import prefill_pages
from conduit_core.passes.step_graphs import StepGraphs, kind_for
from conduit_core.prompt.layout import LABEL_REFRESH, LabelRefresh
from conduit_core.reuse_steps import ReuseSteps

PrefillSteps = Generator[str, None, AnswerState]  # phase names, then the state


class ReuseRuntime:
    """Runs one loaded VLM over cached pages; see the module docstring."""

    def __init__(self, vlm: LoadedVLM, *, page_batch_size: int = 8, head_cache: bool = True,
                 label_cache: bool = True, label_entries: int = 1024,
                 label_refresh: LabelRefresh = "always",
                 never_above_full: bool = True,
                 decode_slots: int = 16, decode_positions: int = 65536,
                 decode_compile: str = "off"):
        if label_refresh not in LABEL_REFRESH:
            raise ValueError(f"label_refresh must be one of {LABEL_REFRESH}, "
                             f"got {label_refresh!r}")
        if label_cache and not head_cache:
            raise ValueError("label_cache needs head_cache: labels are computed after the head")
        self.vlm = vlm
        self.adapter = vlm.adapter
        self.page_batch_size = page_batch_size
        self.never_above_full = never_above_full
        self.reuse = ReuseSteps(vlm, head_cache=head_cache, label_cache=label_cache,
                                label_entries=label_entries, label_refresh=label_refresh)
        kind = kind_for(decode_compile, self.adapter.device)
        self.pool = DecodePool(self.adapter, decode_slots, decode_positions,
                               fixed=kind != "eager")
        self.graphs = StepGraphs(self.adapter, self.pool, decode_compile)

    @torch.no_grad()
    def prefill_pages(self, images: list[Image.Image]) -> list[PageKV]:
        """Each page prefilled once under the canonical page context (template opening +
        segment), with the positions that context gives; pages batched (right padding);
        returned on the host (`PageKV.to_host`: pinned where CUDA is available)."""
        return prefill_pages(self.vlm, images, self.page_batch_size)

    @torch.no_grad()
    def prefill_steps(self, request: AnswerRequest, on_token: TokenCallback | None = None,
                      t0: float | None = None) -> PrefillSteps:
        """An answer's prefill over its cached pages, in phases for a scheduler that runs
        other work between them: assemble the pages under the new prefix, let
        `request.policy` choose the visual tokens to refresh, recompute them with all text
        tokens after the head, take the first token's logits. Both passes compute the last
        layer in full only for the row whose logits are read. Where the policy is predicted
        to cost more than a full prefill from the cached page embeddings, that runs instead
        (`AnswerResult.fallback`).

        It yields the name of each phase done ("assembled": the pages' K/V loaded and
        re-rotated; "chosen": scoring pass and selection) and returns the `AnswerState` that
        `step` decodes."""
        t0 = time.perf_counter() if t0 is None else t0
        choice = request.policy
        assembly = self.reuse.assemble(request.prefix, request.pages, request.question,
                                       extra_capacity=request.max_new_tokens, last_only=True,
                                       labels=False, namespace=request.namespace)
        yield "assembled"
        ctx = self.reuse.policy_context(assembly, request.budget, request.seed)
        key = (request.namespace, choice, round(request.budget, 4))
        plan = self.reuse.plan(assembly, ctx, choice.select, key)
        fallback = self.never_above_full and plan.fallback
        if fallback:  # a forward pass the policy ran while planning is spent: charged
            visual, resume, extra = assembly.layout.visual_rows(), None, ctx.extra_flops
            if plan.fallback_whole:  # cheaper on the plain causal path: the head is rewritten
                assembly.head = None  # with the same values
        else:  # the labels the refresh will not recompute (computed now if missing)
            self.reuse.load_labels(assembly, self._whole_labels(assembly, plan))
            # distinct rows; a forward pass's choice stays on the device until the first token
            visual = plan.visual if plan.visual is not None else choice.select(ctx)
            visual = visual.to(torch.long)
            resume, extra = ctx.resume, ctx.extra_flops
        yield "chosen"
        hidden, computed = self.reuse.refresh(assembly, visual, resume)
        state = self.reuse.start_decode(assembly, hidden, t0=t0, policy=choice.name,
                                        refreshed=int(visual.numel()),
                                        flops_used_lm=extra + assembly.fill_flops,
                                        fill_flops_lm=assembly.fill_flops,
                                        vision_ran=False, max_new_tokens=request.max_new_tokens,
                                        temperature=request.temperature, top_p=request.top_p,
                                        seed=request.seed, on_token=on_token, plan=plan,
                                        fallback=fallback)
        # after the first token's logits: the device's choice read back for the accounting
        state.flops_used_lm += self.reuse.refresh_flops(assembly, computed.cpu(), resume)
        if not fallback and plan.visual is None:  # a forward pass's choice: where it fell
            self.reuse.choices.record(key, assembly.layout.visual_rows(), visual.cpu(), plan.cap)
        return state

    @staticmethod
    def _whole_labels(assembly: Assembly, plan: RefreshPlan) -> torch.Tensor | None:
        """Label rows a planned refresh recomputes (None: not known before the policy runs)."""
        if plan.visual is None:
            return None
        return assembly.layout.refreshed_label_rows(plan.visual)

    def step(self, states: list[AnswerState]) -> None:
        """One decode step of every unfinished answer in `states`: one token each, their
        forwards batched (`conduit_core.decode.decode_step`); a batch of one is the
        single-answer path."""
        decode_step(self.adapter, [s.decode for s in states], self.pool, self.graphs)

    def prepare_decode(self, budget_s: float) -> str:
        """Capture or compile the decode step's batch-size buckets within `budget_s`
        (`StepGraphs.prepare`; before any answer takes a decode slot); the line to log."""
        return self.graphs.prepare(budget_s)

    def release(self, state: AnswerState) -> None:
        """Give back `state`'s decode slot now (an answer dropped before its end; one that
        ends in `step` gives it back there)."""
        self.pool.release(state.decode)

    def result(self, state: AnswerState) -> AnswerResult:
        """The result of a finished (or abandoned) answer; its decode slot is given back."""
        self.release(state)
        return answer_result(state, self.reuse.costs, self.adapter)
