"""The reuse runtime: page prefill, assembly from cached pages, refresh and decode.

Public API:
  ReuseRuntime(vlm: LoadedVLM, *, page_batch_size=8, head_cache=True, label_cache=True,
               label_entries=1024, label_refresh="always", never_above_full=True,
               decode_slots=16, decode_positions=65536, decode_compile="off")
    head_cache: the prompt head (template opening + prefix, rows before the first page label)
        is computed once per prefix and copied into each assembled cache
        (`conduit_core.passes.prompt_head`); False computes it with every question.
    label_cache: page labels are computed once after the head and reused stale like their
        pages (`conduit_core.label_cache`; needs head_cache); False computes them as text
        rows in every pass. A label computed for an answer is charged to it. label_entries:
        labels kept (least recently used dropped).
    label_refresh: with the label cache, which labels a refresh recomputes: "page" those of
        the pages it refreshes whole, "always" every stale label (the scoring pass reads them
        stale; the first, right after the head, is exact as cached; `Layout.label_refresh`;
        the default, as the service's `CONDUIT_LABEL_REFRESH`), "budget" the same labels,
        their rows counted against the refresh budget.
    never_above_full: before a policy runs, its LM FLOPs are predicted
        (`conduit_core.cost.cost_model`); where they exceed a full prefill from the cached page
        embeddings, that runs instead (`AnswerResult.fallback`).
    decode_slots, decode_positions: the answers being generated share one `DecodePool` of at
        most this many slots and positions (`.pool`; one attention call a layer for all of
        them); an answer it cannot hold decodes from its own cache.
    decode_compile: "off", "auto" or "on": how a step of the pooled answers runs
        (`conduit_core.passes.step_graphs`: CUDA graphs, compiled, or eager); other than
        eager, the pool is fixed at its largest (`DecodePool(fixed=True)`).
    .prepare_decode(budget_s) -> str   capture/compile the decode step's buckets now
        (before any answer; `.graphs`), the line to log
    .prefill_pages(images: list[PIL.Image]) -> list[PageKV]
        each page prefilled under the canonical page context (template opening + segment),
        with the positions that context gives; pages batched (right padding); returned on
        the host (`PageKV.to_host`: pinned where CUDA is available).
    .answer(request: AnswerRequest, on_token=None) -> AnswerResult
        assemble the cached pages under the new prefix, let `request.choice` choose visual
        tokens to refresh, recompute them with all text tokens after the head, decode. Both
        passes compute the last layer in full only for the row whose logits are read.
        = .finish(.start_answer(request, on_token)), the two halves below:
    .start_answer(request, on_token=None, t0=None) -> AnswerState   the prefill half: its
        own cache, first-token logits, sampler, stop ids, timing (`conduit_core.answer_state`)
    .prefill_steps(request, on_token=None, t0=None) -> PrefillSteps   the same in phases
        (yields "assembled", "chosen"; returns the AnswerState) for the answer engine
    .step(states: list[AnswerState]) -> None   one decode step of many answers: one token
        each, one batched forward (`conduit_core.decode.decode_step`); a batch of one is the
        single-answer path
    .result(state) -> AnswerResult;  .finish(state) -> AnswerResult (step alone until done)
    .release(state)   give back its pool slot (an answer its owner drops before its end)
    .answer_full_prefill(prefix, pages: list[tuple[str, PIL.Image]], question, *,
        max_new_tokens=64, temperature=0.0, top_p=1.0, seed=None, on_token=None) -> AnswerResult
    Lower level (tests, policies, diagnostics):
    .assemble(prefix, pages: list[PageInput], question, extra_capacity=0, last_only=False,
              labels=True, namespace="") -> Assembly  (the head's K/V copied from the head
        cache; with the label cache the labels' from it, or with labels=False later; both
        caches keyed by `namespace`, their misses charged in `Assembly.fill_flops`:)
    .load_labels(assembly, skip=None)  fill the stale label rows, computing misses (charged),
        except those in rows `skip` (the answer path plans, then fills only the labels its
        refresh keeps stale)
    .warm_labels(prefix, pages, namespace="") -> FLOPs   the head and labels computed ahead
        (evaluations)
    .assemble_fresh(prefix, pages: list[tuple[str, PIL.Image]], question, extra_capacity=0)
        -> Assembly  (vision tower run now; no cached K/V)
    .prefill(assembly, visual_rows) -> Tensor (R, hidden): recompute visual_rows + all text,
        reusing what is exact (`conduit_core.passes.refresh_pass`)
    .refresh(assembly, visual_rows, resume=None) -> (hidden (R, hidden), rows computed);
        with `assembly.last_only`, hidden is (1, hidden) of the last row
    .refresh_flops(assembly, computed, resume=None) -> LM FLOPs of that refresh, as computed
    .logits(hidden) -> (R, vocab) float32
    .scoring(assembly, config=ScoreConfig()) -> (StaleScores, flops)
    .policy_context(assembly, budget, seed=None) -> PolicyContext
    .plan(assembly, ctx, policy, key=None) -> RefreshPlan   predicted LM FLOPs of the policy
        and of the fallback (`conduit_core.cost.cost_model`); a forward-pass policy's k rows are
        placed where its choices under the same `key` (namespace, policy, options, budget)
        fell before (`.choices`, a `conduit_core.cost.choice_history.ChoiceHistory`; answers
        record theirs)
  (the Assembly it works on: `conduit_core.passes.assembly`)
"""

from __future__ import annotations

import time
from collections.abc import Generator, Hashable
from functools import partial

import torch
from PIL import Image

from conduit_core.answer_state import AnswerState, answer_result
from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput, TokenCallback
from conduit_core.cost.choice_history import ChoiceHistory, even_rows
from conduit_core.cost.cost_model import RefreshPlan, RowCosts, plan_refresh
from conduit_core.decode import DecodeState, Sampler, decode_step
from conduit_core.errors import InvalidRequestError
from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.kv_pool import DecodePool
from conduit_core.kv.page_loads import load_pages
from conduit_core.label_cache import LabelCache, fetch, load_labels
from conduit_core.model.flops import FlopsModel
from conduit_core.model.loader import LoadedVLM
from conduit_core.page_kv import PageKV
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_forward import logits_of
from conduit_core.passes.page_prefill import prefill_pages
from conduit_core.passes.prompt_head import HeadCache
from conduit_core.passes.refresh_pass import Resume, refresh_pass
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.passes.stale_pass import StaleScores, stale_pass
from conduit_core.passes.step_graphs import StepGraphs, kind_for
from conduit_core.policies.policy_context import PolicyContext, RefreshPolicy
from conduit_core.prompt.layout import LABEL_REFRESH, LabelRefresh, Layout, build_layout

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
        self.flops = FlopsModel.from_adapter(self.adapter)
        self.costs = RowCosts(self.adapter, self.flops)
        self.heads: HeadCache | None = HeadCache() if head_cache else None
        self.labels: LabelCache | None = LabelCache(label_entries) if label_cache else None
        self.label_refresh = label_refresh
        self.choices = ChoiceHistory()
        self.never_above_full = never_above_full
        self._stop_ids = self.adapter.stop_token_ids()
        kind = kind_for(decode_compile, self.adapter.device)
        self.pool = DecodePool(self.adapter, decode_slots, decode_positions,
                               fixed=kind != "eager")
        self.graphs = StepGraphs(self.adapter, self.pool, decode_compile)

    # ---- pages ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill_pages(self, images: list[Image.Image]) -> list[PageKV]:
        """Prefill each page once under the canonical page context (see module doc)."""
        return prefill_pages(self.vlm, images, self.page_batch_size)

    # ---- assembly -------------------------------------------------------------------
    def _embeds(self, layout: Layout, segment_embeds: list[torch.Tensor]) -> torch.Tensor:
        embeds = self.adapter.embed_tokens(layout.token_ids)  # (N, hidden)
        for seg, emb in zip(layout.segments, segment_embeds, strict=True):
            embeds[seg.start:seg.stop] = emb.to(embeds.device, embeds.dtype)
        return embeds

    @torch.no_grad()
    def assemble(self, prefix: str, pages: list[PageInput], question: str,
                 extra_capacity: int = 0, last_only: bool = False,
                 labels: bool = True, namespace: str = "") -> Assembly:
        """Lay out the request and fill the cache with the pages' re-rotated K/V, the
        cached head's exact K/V and, with the label cache, the labels' stale K/V (`labels`
        False: left for `load_labels`); the head and labels are read from (and computed
        into) `namespace`'s entries, what is computed charged in `fill_flops`."""
        for p in pages:
            p.kv.check_fingerprint(self.vlm.fingerprint)
        grids = [p.kv.image_grid for p in pages]
        layout = build_layout(self.adapter, prefix, [p.label for p in pages],
                              [p.kv.token_ids for p in pages], grids, question,
                              stale_labels=self.labels is not None and bool(pages),
                              label_refresh=self.label_refresh)
        cache = KVCache.allocate(self.adapter, 1, layout.n + extra_capacity)
        embeds = self.adapter.embed_tokens(layout.token_ids)  # (N, hidden)
        load_pages(self.adapter, layout, [p.kv for p in pages], cache, embeds)
        head, fill = None, 0.0
        if self.heads is not None and layout.head:
            head, computed = self.heads.get(self.adapter, namespace,
                                            layout.token_ids[:layout.head],
                                            layout.position_ids[:, :layout.head])
            head.copy_into(cache)
            fill = self.costs.head(head.n) if computed else 0.0
        assembly = Assembly(layout=layout, cache=cache, embeds=embeds, image_grids=grids,
                            head=head, last_only=last_only, labels_pending=layout.stale_labels,
                            layer0_exact=not any(p.kv.quantized for p in pages),
                            namespace=namespace, fill_flops=fill)
        if labels:
            self.load_labels(assembly)
        return assembly

    def warm_labels(self, prefix: str, pages: list[PageInput], namespace: str = "") -> float:
        """Compute the labels of `pages` under `prefix` that the label cache lacks, without
        assembling anything (an evaluation does it with the pages, before its policies, so
        that no policy's row carries them); returns their LM FLOPs."""
        if self.labels is None or self.heads is None or not pages:
            return 0.0
        layout = build_layout(self.adapter, prefix, [p.label for p in pages],
                              [p.kv.token_ids for p in pages],
                              [p.kv.image_grid for p in pages], "")
        head, computed = self.heads.get(self.adapter, namespace,
                                        layout.token_ids[:layout.head],
                                        layout.position_ids[:, :layout.head])
        spent = self.costs.head(head.n) if computed else 0.0
        return spent + sum(fetch(self.labels, self.adapter, self.costs, namespace, head,
                                 layout.token_ids[s.start:s.stop])[1] for s in layout.labels)

    def load_labels(self, assembly: Assembly, skip: torch.Tensor | None = None) -> None:
        """Fill the stale label rows of `assembly` from the label cache, computing the labels
        it lacks (`conduit_core.label_cache.load_labels`); labels in rows `skip` (their pages
        are refreshed whole) are left to the refresh."""
        if self.labels is not None:
            load_labels(self.labels, self.adapter, self.costs, assembly, skip)
        assembly.labels_pending = False

    @torch.no_grad()
    def assemble_fresh(self, prefix: str, pages: list[tuple[str, Image.Image]], question: str,
                       extra_capacity: int = 0, last_only: bool = False) -> Assembly:
        """Lay out the request from images (vision tower run now); the cache starts empty."""
        images = [img for _, img in pages]
        prepared = self.adapter.prepare_pages(images) if images else []
        seg_embeds = self.adapter.page_embeds(prepared) if prepared else []
        grids = [p.image_grid for p in prepared]
        layout = build_layout(self.adapter, prefix, [label for label, _ in pages],
                              [p.token_ids for p in prepared], grids, question)
        cache = KVCache.allocate(self.adapter, 1, layout.n + extra_capacity)
        return Assembly(layout=layout, cache=cache, embeds=self._embeds(layout, seg_embeds),
                        image_grids=grids, last_only=last_only)

    # ---- passes ---------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, assembly: Assembly, visual_rows: torch.Tensor) -> torch.Tensor:
        """Recompute `visual_rows` and all text rows in sequence order, writing their K/V;
        returns their last-layer hidden states (R, hidden) in row order."""
        return self.refresh(assembly, visual_rows)[0]

    @torch.no_grad()
    def refresh(self, assembly: Assembly, visual_rows: torch.Tensor,
                resume: Resume | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`prefill`, also returning the rows it actually computed (R_c,); which rows it
        reuses and where each starts: `conduit_core.passes.refresh_pass.refresh_pass`."""
        return refresh_pass(self.adapter, assembly, visual_rows, resume)

    def refresh_flops(self, assembly: Assembly, computed: torch.Tensor,
                      resume: Resume | None = None) -> float:
        """Language-model FLOPs of a `refresh` that computed rows `computed`, charged as
        its attention computes them (see `conduit_core.model.flops`)."""
        if assembly.text_from_one:
            return self.costs.after_scoring(assembly.layout, computed, assembly.last_only)
        return self.costs.refresh(assembly.layout, computed, assembly.last_only,
                                  start_layer=0 if resume is None else resume.layer)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (R, vocab) float32 of last-layer hidden states (R, hidden)."""
        return logits_of(self.adapter, hidden.unsqueeze(0))[0]

    @torch.no_grad()
    def scoring(self, assembly: Assembly,
                config: ScoreConfig | None = None) -> tuple[StaleScores, float]:
        """The scoring pass over the assembled cache and its FLOPs (the text rows' forward
        as computed, plus the scored rows' float32 probabilities and value norms). The pass
        reads every stale row: labels still pending (a policy the cost model runs before the
        answer path loads them) are loaded first."""
        if assembly.labels_pending:
            self.load_labels(assembly)
        layout = assembly.layout
        config = config or ScoreConfig()
        text, question = assembly.fresh_text_rows(), layout.question_rows()
        result = stale_pass(self.adapter, assembly.cache, assembly.embeds, layout.position_ids,
                            text, question, layout.n, config, last_only=assembly.last_only,
                            n_prompt=layout.prompt)
        assembly.stale, assembly.stale_writes = result, assembly.cache.writes
        return result, self.costs.scoring(layout, text, config, assembly.last_only)

    def policy_context(self, assembly: Assembly, budget: float,
                       seed: int | None = None) -> PolicyContext:
        """What a refresh policy sees for this assembly (scoring pass on demand)."""
        return PolicyContext(layout=assembly.layout, budget=budget, seed=seed,
                             scorer=lambda cfg: self.scoring(assembly, cfg),
                             cache=assembly.cache,
                             embeds=assembly.embeds, adapter=self.adapter)

    def plan(self, assembly: Assembly, ctx: PolicyContext, policy: RefreshPolicy,
             key: Hashable | None = None) -> RefreshPlan:
        """Predicted LM FLOPs of `policy` on this assembly and of a full prefill from the
        cached embeddings (`conduit_core.cost.cost_model.plan_refresh`); with `key`, a
        forward-pass policy's rows are placed from `self.choices` under it. A policy with no
        cost profile runs here to learn its rows.

        The plan compares the two paths' own work on warm caches: a head or label computed
        because a cache missed is charged to the answer (`Assembly.fill_flops`) but never
        decides its path, so that the path, and so the answer, depends on the request, the
        settings and the model only, not on which caches are warm."""
        place = even_rows if key is None else partial(self.choices.rows, key)
        return plan_refresh(self.costs, assembly.layout, assembly.exact_rows,
                            assembly.last_only, ctx, policy, place,
                            text_from_one=assembly.layer0_exact)

    @staticmethod
    def _whole_labels(assembly: Assembly, plan: RefreshPlan) -> torch.Tensor | None:
        """Label rows a planned refresh recomputes (None: not known before the policy runs)."""
        if plan.visual is None:
            return None
        return assembly.layout.refreshed_label_rows(plan.visual)

    # ---- answers --------------------------------------------------------------------
    def _start(self, assembly: Assembly, hidden: torch.Tensor, *, t0: float, policy: str,
               refreshed: int, flops_used_lm: float, vision_ran: bool, max_new_tokens: int,
               fill_flops_lm: float = 0.0,
               temperature: float, top_p: float, seed: int | None,
               on_token: TokenCallback | None, plan: RefreshPlan | None = None,
               fallback: bool = False) -> AnswerState:
        """The end of a prefill: first-token logits and the decode state after them."""
        layout = assembly.layout
        first = self.logits(hidden[-1:])[-1]  # (vocab,)
        state = DecodeState.start(
            self.adapter, assembly.cache, first, n_keys=layout.n,
            next_position=layout.next_position(), max_new_tokens=max_new_tokens,
            sampler=Sampler(temperature, top_p, seed), stop_ids=self._stop_ids,
            tokenizer=self.vlm.tokenizer, on_token=on_token, t0=t0)
        return AnswerState(decode=state, layout=layout, image_grids=assembly.image_grids,
                           last_only=assembly.last_only, exact_rows=assembly.exact_rows,
                           policy=policy, refreshed=refreshed, flops_used_lm=flops_used_lm,
                           fill_flops_lm=fill_flops_lm,
                           vision_ran=vision_ran, plan=plan, fallback=fallback,
                           prefill_s=time.perf_counter() - t0,
                           page_attention=assembly.page_attention())

    def step(self, states: list[AnswerState]) -> None:
        """One decode step of every unfinished answer in `states`: one token each, their
        forwards batched (`conduit_core.decode.decode_step`)."""
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
        return answer_result(state, self.costs, self.adapter)

    def finish(self, state: AnswerState) -> AnswerResult:
        """Decode one answer alone to its end (`step` with a batch of one); what its token
        callback raised is raised here."""
        while not state.done:
            self.step([state])
        if state.error is not None:
            raise state.error
        return self.result(state)

    @torch.no_grad()
    def answer(self, request: AnswerRequest, on_token: TokenCallback | None = None) -> AnswerResult:
        """Answer over cached pages with the request's refresh policy (see module doc); where
        the policy is predicted to cost more than a full prefill from the cached page
        embeddings, that runs instead (`AnswerResult.fallback`). `start_answer` + `finish`."""
        return self.finish(self.start_answer(request, on_token))

    def start_answer(self, request: AnswerRequest, on_token: TokenCallback | None = None,
                     t0: float | None = None) -> AnswerState:
        """The prefill half of `answer`: assemble, choose, refresh, first-token logits
        (`prefill_steps` run to its end)."""
        steps = self.prefill_steps(request, on_token, t0)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                state: AnswerState = done.value
                return state

    @torch.no_grad()
    def prefill_steps(self, request: AnswerRequest, on_token: TokenCallback | None = None,
                      t0: float | None = None) -> PrefillSteps:
        """`start_answer` in phases, for a scheduler that runs other work between them: it
        yields the name of each phase done ("assembled": the pages' K/V loaded and
        re-rotated; "chosen": scoring pass and selection) and returns the `AnswerState`
        after the refresh. The same computation as `start_answer`, in the same order."""
        t0 = time.perf_counter() if t0 is None else t0
        choice = request.choice
        assembly = self.assemble(request.prefix, request.pages, request.question,
                                 extra_capacity=request.max_new_tokens, last_only=True,
                                 labels=False, namespace=request.namespace)
        yield "assembled"
        ctx = self.policy_context(assembly, request.budget, request.seed)
        key = (request.namespace, choice, round(request.budget, 4))
        plan = self.plan(assembly, ctx, choice.select, key)
        fallback = self.never_above_full and plan.fallback
        if fallback:  # a forward pass the policy ran while planning is spent: charged
            visual, resume, extra = assembly.layout.visual_rows(), None, ctx.extra_flops
            if plan.fallback_whole:  # cheaper on the plain causal path: the head is rewritten
                assembly.head = None  # with the same values
        else:  # the labels the refresh will not recompute (computed now if missing)
            self.load_labels(assembly, self._whole_labels(assembly, plan))
            visual = plan.visual if plan.visual is not None else choice.select(ctx)
            visual = visual.to(torch.long).cpu().unique()
            if plan.visual is None:  # chosen by a forward pass: where it fell, for next time
                self.choices.record(key, assembly.layout.visual_rows(), visual, plan.cap)
            resume, extra = ctx.resume, ctx.extra_flops
        yield "chosen"
        hidden, computed = self.refresh(assembly, visual, resume)
        used = extra + assembly.fill_flops + self.refresh_flops(assembly, computed, resume)
        return self._start(assembly, hidden, t0=t0, policy=choice.name,
                           refreshed=int(visual.numel()), flops_used_lm=used,
                           fill_flops_lm=assembly.fill_flops,
                           vision_ran=False, max_new_tokens=request.max_new_tokens,
                           temperature=request.temperature, top_p=request.top_p,
                           seed=request.seed, on_token=on_token, plan=plan, fallback=fallback)

    @torch.no_grad()
    def answer_full_prefill(self, prefix: str, pages: list[tuple[str, Image.Image]],
                            question: str, *, max_new_tokens: int = 64,
                            temperature: float = 0.0, top_p: float = 1.0,
                            seed: int | None = None,
                            on_token: TokenCallback | None = None) -> AnswerResult:
        """Answer with no reuse at all: vision tower and every token computed now."""
        t0 = time.perf_counter()
        if max_new_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
            raise InvalidRequestError("need max_new_tokens >= 1, temperature >= 0, "
                                      "0 < top_p <= 1")
        assembly = self.assemble_fresh(prefix, pages, question, extra_capacity=max_new_tokens,
                                       last_only=True)
        visual = assembly.layout.visual_rows()
        hidden, computed = self.refresh(assembly, visual)
        return self.finish(self._start(
            assembly, hidden, t0=t0, policy="full_prefill", refreshed=int(visual.numel()),
            flops_used_lm=self.refresh_flops(assembly, computed), vision_ran=True,
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
            on_token=on_token))
