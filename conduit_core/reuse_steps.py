"""The steps an answer's prefill walks over cached pages, and the caches they share.

`ReuseRuntime.prefill_steps` composes these steps in one order: assemble the request from
cached pages (`assemble`: layout, the pages' re-rotated K/V, the cached head), plan the
refresh on warm cost (`policy_context`, `plan`), fill the labels the refresh keeps stale
(`load_labels`), let the policy choose (its scoring pass: `scoring`), recompute the chosen
visual rows and all text rows after the head (`refresh`, charged by `refresh_flops`), and
start decoding from the first token's logits (`start_decode`, `logits`). The lab and the
tests call the same steps one by one to check or measure each.

What it decides: the head and label caches are keyed by the request's namespace, and what a
miss computes is charged to the answer (`Assembly.fill_flops`) but never changes its plan
(`plan`'s docstring); an assembled cache is taken from the runtime's workspace
(`workspace`, `conduit_core.kv.workspace`) and given back there when assembling fails (by the
runtime once nothing reads it otherwise); the scoring pass reads every stale row, so labels
still pending are loaded before it; the choices a forward-pass policy made are remembered per
key (`choices`) so that the next plan places its rows where they fell.

Each phase runs inside the context of `observer` (`conduit_core.pass_observer`), unset in
the product.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Hashable
from contextlib import AbstractContextManager
from functools import partial

import torch

from conduit_core.answer_state import AnswerState
from conduit_core.answer_types import PageInput, TokenCallback
from conduit_core.cost.choice_history import ChoiceHistory, even_rows
from conduit_core.cost.cost_model import RefreshPlan, RowCosts, plan_refresh
from conduit_core.decode import DecodeState, Sampler
from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.page_loads import load_pages
from conduit_core.kv.workspace import KVWorkspace
from conduit_core.label_cache import LabelCache, load_labels
from conduit_core.model.flops import FlopsModel
from conduit_core.model.loader import LoadedVLM
from conduit_core.pass_observer import UNOBSERVED, PassObserver, Phase
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.buckets import key_bucket, lent
from conduit_core.passes.layer_forward import logits_of
from conduit_core.passes.layer_graphs import layer_graphs
from conduit_core.passes.layer_groups import drain
from conduit_core.passes.prompt_head import HeadCache
from conduit_core.passes.refresh_pass import Resume, refresh_steps
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.passes.stale_pass import StaleScores, stale_steps
from conduit_core.policies.policy_context import PolicyContext, RefreshPolicy
from conduit_core.prompt.layout import LabelRefresh, Layout, build_layout


class ReuseSteps:
    """The prefill's steps over one loaded VLM (module docstring). `heads` and `labels` are
    None where the runtime runs without those caches; `observer` is the lab's hook."""

    def __init__(self, vlm: LoadedVLM, *, head_cache: bool, label_cache: bool,
                 label_entries: int, label_refresh: LabelRefresh, layer_group: int = 0,
                 workspace_bytes: int = 2**30):
        self.vlm = vlm
        self.adapter = vlm.adapter
        self.flops = FlopsModel.from_adapter(self.adapter)
        self.costs = RowCosts(self.adapter, self.flops)
        self.heads: HeadCache | None = HeadCache() if head_cache else None
        self.labels: LabelCache | None = LabelCache(label_entries) if label_cache else None
        self.label_refresh = label_refresh
        self.choices = ChoiceHistory()
        self.stop_ids = self.adapter.stop_token_ids()
        self.observer: PassObserver | None = None
        self.layer_group = layer_group  # layers a step of a pass runs (0: the whole pass)
        self.workspace = KVWorkspace(self.adapter, workspace_bytes)  # assembled caches

    def _phase(self, name: Phase, assembly: Assembly) -> AbstractContextManager[object]:
        """The context phase `name` runs in: the observer's, or one shared no-op."""
        return UNOBSERVED if self.observer is None else self.observer.phase(name, assembly)

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
        cache = self.take_cache(layout.n, extra_capacity)
        try:
            return self._fill(pages, layout, cache, grids, last_only=last_only,
                              labels=labels, namespace=namespace)
        except BaseException:  # its cache goes back: nothing of this request reads it
            self.workspace.give(cache)
            raise

    def take_cache(self, n: int, extra_capacity: int) -> KVCache:
        """A cache from the workspace for a layout of `n` rows and `extra_capacity` more (an
        answer's tokens), lent until given back."""
        capacity = n + extra_capacity
        if layer_graphs(self.adapter) is not None or self.workspace.max_bytes:
            # room for the passes' key bucket, and a capacity from a small set: the compiled
            # layers' graphs are specialised on the cache's strides, which follow from it,
            # and the workspace reuses a cache for the next request of its capacity
            capacity = max(key_bucket(n), key_bucket(capacity - 1))
        cache = self.workspace.take(capacity)
        lent(cache)  # what its last user left there is cleared before a compiled pass reads it
        return cache

    def _fill(self, pages: list[PageInput], layout: Layout, cache: KVCache,
              grids: list[torch.Tensor], *, last_only: bool, labels: bool,
              namespace: str) -> Assembly:
        """`assemble`'s part after its cache is taken: the pages, the head, the labels."""
        embeds = self.adapter.embed_tokens(layout.token_ids)  # (N, hidden)
        assembly = Assembly(layout=layout, cache=cache, embeds=embeds, image_grids=grids,
                            last_only=last_only, labels_pending=layout.stale_labels,
                            layer0_exact=not any(p.kv.quantized for p in pages),
                            namespace=namespace)
        with self._phase("page_load", assembly):
            load_pages(self.adapter, layout, [p.kv for p in pages], cache, embeds)
        if self.heads is not None and layout.head:
            head, computed = self.heads.get(self.adapter, namespace,
                                            layout.token_ids[:layout.head],
                                            layout.position_ids[:, :layout.head])
            head.copy_into(cache)
            assembly.head = head
            assembly.fill_flops = self.costs.head(head.n) if computed else 0.0
        if labels:
            self.load_labels(assembly)
        return assembly

    def load_labels(self, assembly: Assembly, skip: torch.Tensor | None = None) -> None:
        """Fill the stale label rows of `assembly` from the label cache, computing the labels
        it lacks (`conduit_core.label_cache.load_labels`); labels in rows `skip` (their pages
        are refreshed whole) are left to the refresh."""
        if self.labels is not None:
            load_labels(self.labels, self.adapter, self.costs, assembly, skip)
        assembly.labels_pending = False

    def scoring(self, assembly: Assembly,
                config: ScoreConfig | None = None) -> tuple[StaleScores, float]:
        """`scoring_steps` run to their end in one go."""
        return drain(self.scoring_steps(assembly, config))

    @torch.no_grad()
    def scoring_steps(self, assembly: Assembly, config: ScoreConfig | None = None
                      ) -> Generator[str, None, tuple[StaleScores, float]]:
        """The scoring pass over the assembled cache and its FLOPs (the text rows' forward
        as computed, plus the scored rows' float32 probabilities and value norms), yielding
        "scoring" between groups of `layer_group` layers. The pass reads every stale row:
        labels still pending (a policy the cost model runs before the answer path loads
        them) are loaded first."""
        if assembly.labels_pending:
            self.load_labels(assembly)
        layout = assembly.layout
        config = config or ScoreConfig()
        text, question = assembly.fresh_text_rows(), layout.question_rows()
        with self._phase("scoring", assembly):
            result = yield from stale_steps(self.adapter, assembly.cache, assembly.embeds,
                                            layout.position_ids, text, question, layout.n,
                                            config, last_only=assembly.last_only,
                                            n_prompt=layout.prompt, group=self.layer_group)
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

    def refresh(self, assembly: Assembly, visual_rows: torch.Tensor,
                resume: Resume | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`refresh_steps` run to their end in one go."""
        return drain(self.refresh_steps(assembly, visual_rows, resume))

    @torch.no_grad()
    def refresh_steps(self, assembly: Assembly, visual_rows: torch.Tensor,
                      resume: Resume | None = None
                      ) -> Generator[str, None, tuple[torch.Tensor, torch.Tensor]]:
        """Recompute `visual_rows` and all text rows in sequence order, writing their K/V,
        yielding "refresh" between groups of `layer_group` layers: their last-layer hidden
        states (R, hidden) in row order (with `assembly.last_only`, (1, hidden) of the last
        row) and the rows actually computed (R_c,); which rows it reuses and where each
        starts: `conduit_core.passes.refresh_pass.refresh_steps`."""
        with self._phase("refresh", assembly):
            return (yield from refresh_steps(self.adapter, assembly, visual_rows, resume,
                                             self.layer_group))

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

    def start_decode(self, assembly: Assembly, hidden: torch.Tensor, *, t0: float,
                     policy: str, refreshed: int, flops_used_lm: float, vision_ran: bool,
                     max_new_tokens: int, temperature: float, top_p: float,
                     seed: int | None, on_token: TokenCallback | None,
                     fill_flops_lm: float = 0.0, plan: RefreshPlan | None = None,
                     fallback: bool = False) -> AnswerState:
        """The end of a prefill: the first token's logits from the last row of `hidden`, and
        the answer's state before its first decode step (its accounting carried along)."""
        layout = assembly.layout
        with self._phase("logits", assembly):
            first = self.logits(hidden[-1:])[-1]  # (vocab,)
        state = DecodeState.start(
            self.adapter, assembly.cache, first, n_keys=layout.n,
            next_position=layout.next_position(), max_new_tokens=max_new_tokens,
            sampler=Sampler(temperature, top_p, seed), stop_ids=self.stop_ids,
            tokenizer=self.vlm.tokenizer, on_token=on_token, t0=t0)
        return AnswerState(decode=state, layout=layout, image_grids=assembly.image_grids,
                           last_only=assembly.last_only, exact_rows=assembly.exact_rows,
                           policy=policy, refreshed=refreshed, flops_used_lm=flops_used_lm,
                           fill_flops_lm=fill_flops_lm,
                           vision_ran=vision_ran, plan=plan, fallback=fallback,
                           prefill_s=time.perf_counter() - t0,
                           page_attention=assembly.page_attention())
