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
  label_refresh: with the label cache, which labels a refresh recomputes
      (`Layout.label_refresh`): "read" (the default, as the service's
      `CONDUIT_LABEL_REFRESH`) after a scoring pass only the labels the question reads most,
      chosen from its scores on the device (`Layout.read_label_rows`), without one as
      "always"; "always" every stale label (the scoring pass reads them stale; the first,
      right after the head, is exact as cached); "page" those of the pages it refreshes
      whole; "budget" the same labels as "always", their rows counted against the refresh
      budget.
  never_above_full: before a policy runs, its LM FLOPs are predicted
      (`conduit_core.cost.cost_model`); where they exceed a full prefill from the cached page
      embeddings, that runs instead (`AnswerResult.fallback`).
  decode_slots, decode_positions: the answers being generated share one `DecodePool` of at
      most this many slots and positions (`.pool`; one attention call a layer for all of
      them); an answer it cannot hold decodes from its own cache.
  decode_compile: "off", "auto" or "on": how a step of the pooled answers runs
      (`conduit_core.passes.step_graphs`: CUDA graphs, compiled, or eager); other than eager,
      the pool is a fixed ladder of short and long slots (`DecodePool(fixed=True)`), an
      answer that outgrows its slot moved into a longer one.
  compile_passes: "off", "auto" or "on": whether the scoring pass's and the refresh's
      layer bodies run compiled once per shape bucket (`conduit_core.passes.layer_graphs`;
      "auto": on CUDA only). The switch is the adapter's: it holds for every runtime over it.
  layer_group: the scoring pass and the refresh run in groups of this many decoder layers,
      `prefill_steps` yielding between groups ("scoring", "refresh"), so that a scheduler
      runs the streaming answers' decode steps inside a long pass
      (`conduit_core.passes.layer_groups`; the same operations either way); 0: each pass
      in one phase.
  kv_workspace_bytes: an answer's assembled cache comes from the runtime's workspace
      (`.reuse.workspace`, `conduit_core.kv.workspace`), its capacity rounded up to a key
      bucket, and goes back to it as soon as nothing reads it any more: when the prefill
      fails or is closed, when the answer's first decode step copies it into a decode-pool
      slot, or, for an answer the pool cannot hold, when the answer is released (a turn kept
      as a conversation prefix has taken its rows as its answer ended). The next
      answer of that capacity reuses it; idle caches take at most this many bytes (0: a
      fresh cache per answer, at the answer's exact capacity).
  conversation_prefixes, conversation_bytes: conversation prefixes kept
      (`.conversations`, `conduit_core.conversation.ConversationCache`): at most this many
      per namespace (tenant), and this many bytes of K/V in all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, replace
from functools import partial

import torch
from PIL import Image

from conduit_core.answer_state import AnswerState, answer_result
from conduit_core.answer_types import AnswerRequest, AnswerResult, TokenCallback
from conduit_core.conversation import (
    ConversationCache,
    KeptTurn,
    assemble_turn,
    complete_prefix,
    history_texts,
    page_ids,
    prefix_key,
    take_rows,
    turn_texts,
)
from conduit_core.cost.cost_model import RefreshPlan
from conduit_core.decode import decode_step
from conduit_core.kv.kv_pool import DecodePool
from conduit_core.model.loader import LoadedVLM
from conduit_core.page_kv import PageKV
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_graphs import compile_layers
from conduit_core.passes.layer_groups import drain
from conduit_core.passes.page_prefill import prefill_pages
from conduit_core.passes.prompt_head import HeadKV
from conduit_core.passes.refresh_pass import Resume
from conduit_core.passes.step_graphs import StepGraphs, kind_for
from conduit_core.policies.policy_context import PolicyContext, PolicyCost, RefreshPolicy
from conduit_core.prompt.conversation import history_ids, turn_layout
from conduit_core.prompt.layout import LABEL_REFRESH, LabelRefresh, Layout
from conduit_core.reuse_steps import ReuseSteps

PrefillSteps = Generator[str, None, AnswerState]  # phase names, then the state


class ReuseRuntime:
    """Runs one loaded VLM over cached pages; see the module docstring."""

    def __init__(self, vlm: LoadedVLM, *, page_batch_size: int = 8, head_cache: bool = True,
                 label_cache: bool = True, label_entries: int = 1024,
                 label_refresh: LabelRefresh = "read",
                 never_above_full: bool = True,
                 decode_slots: int = 16, decode_positions: int = 65536,
                 decode_compile: str = "off", conversation_prefixes: int = 8,
                 conversation_bytes: int = 2**30, layer_group: int = 0,
                 compile_passes: str = "off", kv_workspace_bytes: int = 2**30):
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
                                label_entries=label_entries, label_refresh=label_refresh,
                                layer_group=layer_group, workspace_bytes=kv_workspace_bytes)
        kind = kind_for(decode_compile, self.adapter.device)
        self.pool = DecodePool(self.adapter, decode_slots, decode_positions,
                               fixed=kind != "eager")
        self.graphs = StepGraphs(self.adapter, self.pool, decode_compile)
        compile_layers(self.adapter, compile_passes)
        self.conversations = ConversationCache(conversation_prefixes, conversation_bytes)

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

        A follow-up (`request.history`) is laid out as its conversation
        (`conduit_core.prompt.conversation`): its prefix, the earlier turns with their
        answers, comes from the conversation cache or is rebuilt turn by turn from their
        text and pages with the request's policy (`AnswerResult.conversation`), and only the
        rows after it are computed: the pages it adds refreshed by the policy with the whole
        conversation before them. With `request.keep` the turn is kept as a prefix when its
        result is taken (`conduit_core.conversation`).

        It yields the name of each phase done ("assembled": the pages' K/V loaded and
        re-rotated; "scoring": a group of the scoring pass's layers, `layer_group`; "chosen":
        the rest of the scoring pass and selection; "refresh": a group of the refresh's
        layers) and returns the `AnswerState` that `step` decodes."""
        t0 = time.perf_counter() if t0 is None else t0
        assembly, how = self._assemble(request)
        try:
            yield "assembled"
            done = yield from self._refresh_steps(assembly, request)
            state = self.reuse.start_decode(
                assembly, done.hidden, t0=t0, policy=request.policy.name,
                refreshed=int(done.visual.numel()),
                flops_used_lm=done.extra + assembly.fill_flops,
                fill_flops_lm=assembly.fill_flops, vision_ran=False,
                max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                top_p=request.top_p, seed=request.seed, on_token=on_token, plan=done.plan,
                fallback=done.fallback)
            # after the first token's logits: the device's choice read back for the accounting
            self._account(assembly, done)
        except BaseException:  # failed or closed mid-prefill: its cache goes back
            self.reuse.workspace.give(assembly.cache)
            raise
        state.flops_used_lm += done.refresh_lm
        state.conversation = how
        state.lease = assembly.cache
        if request.keep:
            state.kept = self._kept(request, assembly)
            state.decode.on_end = partial(self._take_kept, state)
        return state

    def _assemble(self, request: AnswerRequest) -> tuple[Assembly, str]:
        """The request's assembly; for a follow-up, whether its prefix was a hit or rebuilt
        (what a rebuild spent charged in `fill_flops`)."""
        if not request.history:
            return self.reuse.assemble(request.prefix, request.pages, request.question,
                                       extra_capacity=request.max_new_tokens, last_only=True,
                                       labels=False, namespace=request.namespace), ""
        layout = turn_layout(self.adapter, request.prefix,
                             turn_texts(request.history, request.pages, request.question))
        prefix, how, spent = self._prefix(request, layout.token_ids[:layout.head])
        assembly = self._assemble_after(request, prefix, layout)
        assembly.fill_flops += spent
        return assembly, how

    def _assemble_after(self, request: AnswerRequest, prefix: HeadKV,
                        layout: Layout) -> Assembly:
        """A follow-up's assembly of `layout` after its conversation's `prefix`."""
        for p in request.pages:
            p.kv.check_fingerprint(self.vlm.fingerprint)
        cache = self.reuse.take_cache(layout.n, request.max_new_tokens)
        try:
            return assemble_turn(self.adapter, layout, request.pages, prefix, cache,
                                 request.namespace)
        except BaseException:  # its cache goes back: nothing of this request reads it
            self.reuse.workspace.give(cache)
            raise

    def _refresh_steps(self, assembly: Assembly,
                       request: AnswerRequest) -> Generator[str, None, _Refreshed]:
        """Plan, choose (yielding "chosen") and refresh an assembly by the request's policy."""
        choice = request.policy
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
            if plan.visual is None:  # the policy's scoring pass, in layer groups
                yield from self._score_ahead(assembly, ctx, choice.select)
            # distinct rows; a forward pass's choice stays on the device until the first token
            visual = plan.visual if plan.visual is not None else choice.select(ctx)
            visual = visual.to(torch.long)
            resume, extra = ctx.resume, ctx.extra_flops
        yield "chosen"
        hidden, computed = yield from self.reuse.refresh_steps(assembly, visual, resume)
        return _Refreshed(hidden, visual, computed, plan, fallback, resume, extra, key)

    def _score_ahead(self, assembly: Assembly, ctx: PolicyContext,
                     policy: RefreshPolicy) -> Generator[str, None, None]:
        """Run the scoring pass `policy` declares (`cost_profile`) before it chooses, in the
        runtime's layer groups, and hand it to the policy: the same pass its `ctx.scores`
        would run in one go, with other work between its groups."""
        profile: Callable[[PolicyContext], PolicyCost] | None = getattr(policy, "cost_profile",
                                                                        None)
        config = None if profile is None else profile(ctx).scoring
        if config is not None and ctx.needs_scores(config):
            scores, flops = yield from self.reuse.scoring_steps(assembly, config)
            ctx.add_scores(config, scores, flops)

    def _account(self, assembly: Assembly, done: _Refreshed) -> None:
        """A refresh's LM FLOPs, and where a forward pass's choice fell (read back now)."""
        done.refresh_lm = self.reuse.refresh_flops(assembly, done.computed.cpu(), done.resume)
        if not done.fallback and done.plan.visual is None:
            self.reuse.choices.record(done.key, assembly.layout.visual_rows(),
                                      done.visual.cpu(), done.plan.cap)

    def _choice_key(self, request: AnswerRequest) -> str:
        """The policy as chosen and its budget, as a conversation prefix's key spells it."""
        return f"{request.policy.name}|{request.policy.options!r}|{round(request.budget, 4)}"

    def _kept(self, request: AnswerRequest, assembly: Assembly) -> KeptTurn:
        """What keeping this turn needs once its answer is known."""
        pages = [p for t in request.history for p in t.pages] + list(request.pages)
        return KeptTurn(namespace=_owner(request), choice=self._choice_key(request),
                        token_ids=assembly.layout.token_ids,
                        page_ids=tuple(page_ids(pages)),
                        next_position=assembly.layout.next_position())

    def _history_key(self, request: AnswerRequest, turns: int,
                     ids: torch.Tensor | None = None) -> str:
        """The key of the prefix made of the request's first `turns` answered turns (`ids`:
        its token ids, if known)."""
        history = request.history[:turns]
        if ids is None:
            ids = history_ids(self.adapter, request.prefix, history_texts(history))  # (P,)
        pages = page_ids([p for t in history for p in t.pages])
        return prefix_key(self.vlm.fingerprint.digest(), _owner(request),
                          self._choice_key(request), ids, pages)

    def _prefix(self, request: AnswerRequest,
                head_ids: torch.Tensor) -> tuple[HeadKV, str, float]:
        """A follow-up's prefix (token ids `head_ids`): kept ("hit"), or rebuilt from the
        longest kept prefix of its history (or from nothing) turn by turn with the request's
        policy, each turn's answer from its text ("rebuilt", with the LM FLOPs that spent);
        every rebuilt turn is kept."""
        turns = len(request.history)
        keys: dict[int, str] = {}  # k -> the key of the first k turns, made when looked up
        start, prefix = 0, None
        for k in range(turns, 0, -1):
            keys[k] = self._history_key(request, k, head_ids if k == turns else None)
            prefix = self.conversations.get(_owner(request), keys[k])
            if prefix is not None:
                start = k
                break
        if prefix is not None and start == turns:
            return prefix, "hit", 0.0
        spent = 0.0
        for k in range(start, turns):
            turn = request.history[k]
            sub = replace(request, history=request.history[:k], pages=list(turn.pages),
                          question=turn.question, keep=True)
            assembly = (self._assemble(sub)[0] if prefix is None else self._assemble_after(
                sub, prefix, turn_layout(self.adapter, sub.prefix, turn_texts(
                    sub.history, sub.pages, sub.question))))
            done = drain(self._refresh_steps(assembly, sub))
            self._account(assembly, done)
            spent += done.extra + assembly.fill_flops + done.refresh_lm
            rows = take_rows(self.adapter, self._kept(sub, assembly), assembly.cache,
                             turn.answer)
            self.reuse.workspace.give(assembly.cache)  # the prefix holds copies of its rows
            prefix, extended = complete_prefix(self.adapter, self.reuse.costs, rows)
            spent += extended
            self.conversations.put(_owner(request), keys[k + 1], prefix)
        assert prefix is not None
        return prefix, "rebuilt", spent

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
        for state in states:  # those now decoding from a pool slot read their cache no more
            if state.decode.slot is not None:
                self._hand_back(state)

    def _take_kept(self, state: AnswerState) -> None:
        """A turn to keep, as its answer ends (`DecodeState.on_end`), takes its prefix's rows
        out of the cache it decoded in (`conduit_core.conversation.take_rows`) before its
        decode slot is given back and written over."""
        assert state.kept is not None
        decode = state.decode
        decoded = decode.tokens[:max(decode.picked - 1, 0)]  # those fed back: K/V written
        state.kept_rows = take_rows(self.adapter, state.kept, decode.cache,
                                    decode.output().text, decoded)
        state.kept = None

    def prepare_decode(self, budget_s: float) -> str:
        """Capture or compile the decode step's batch-size buckets within `budget_s`
        (`StepGraphs.prepare`; before any answer takes a decode slot); the line to log."""
        return self.graphs.prepare(budget_s)

    def release(self, state: AnswerState) -> None:
        """Give back `state`'s decode slot now (an answer dropped before its end; one that
        ends in `step` gives it back there), and its assembled cache."""
        self.pool.release(state.decode)
        self._hand_back(state)

    def _hand_back(self, state: AnswerState) -> None:
        """Give `state`'s assembled cache back to the workspace (a turn to keep reads it no
        more: its rows are taken from its decode as it ends)."""
        if state.lease is not None:
            self.reuse.workspace.give(state.lease)
            state.lease = None

    def result(self, state: AnswerState) -> AnswerResult:
        """The result of a finished (or abandoned) answer; its decode slot is given back. A
        finished turn to keep (`AnswerRequest.keep`) is kept now, its answer's rows taken
        from its decode and the rest computed (`conduit_core.conversation.complete_prefix`,
        in `kept_flops_lm`)."""
        self.release(state)
        result = answer_result(state, self.reuse.costs, self.adapter)
        rows, state.kept, state.kept_rows = state.kept_rows, None, None
        if rows is None:
            return result
        prefix, spent = complete_prefix(self.adapter, self.reuse.costs, rows)
        kept = rows.kept
        key = prefix_key(self.vlm.fingerprint.digest(), kept.namespace, kept.choice,
                         torch.tensor(prefix.token_ids), kept.page_ids)
        self.conversations.put(kept.namespace, key, prefix)
        return replace(result, kept_flops_lm=spent)


@dataclass
class _Refreshed:
    """A refresh done: its states, rows and plan, and the LM FLOPs `_account` charges it."""

    hidden: torch.Tensor  # (1, hidden) the last row's last-layer state
    visual: torch.Tensor  # (k,) the visual rows refreshed
    computed: torch.Tensor  # (R_c,) the rows computed
    plan: RefreshPlan
    fallback: bool
    resume: Resume | None
    extra: float  # a forward pass the policy ran
    key: Hashable  # the choice history's key
    refresh_lm: float = 0.0


def _owner(request: AnswerRequest) -> str:
    """The conversation cache's namespace of a request: its tenant, else its pages'."""
    return request.tenant or request.namespace
