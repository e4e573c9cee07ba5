"""The answer job: retrieve pages, load their cached KV (prefilling any miss), assemble them
under the question's prefix, refresh with the configured policy, decode, and cite the pages.
A follow-up (`Question.history`) reads its earlier turns: its retrieval reads their questions
too, the pages they added come first and keep their places, and only the pages it adds are
new to its conversation (`worker.conversation_turns`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from conduit_core import AnswerRequest, PageInput
from conduit_core.answer_types import Turn
from conduit_core.errors import InvalidRequestError, UnknownPolicyError
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies import PolicyChoice
from conduit_core.policies.choice import PolicyOptions
from storage.keys import PageHash, cache_namespace
from storage.metadata import CollectionId, DocumentId, Page
from worker.context import WorkerContext
from worker.conversation_turns import PastTurn, conversation_hits, fit_turns, page_key, turn_pages
from worker.errors import InvalidOptionsError, NoPagesToAnswerError
from worker.limits import check_question_length
from worker.page_cache import CacheReport, load_pages
from worker.policy_options import settle_policy
from worker.prompt import ANSWER_PREFIX, page_label
from worker.recovery import release_unreferenced
from worker.retrieval.embedder import embedding_from_bytes
from worker.retrieval.hybrid import Candidate, search
from worker.retrieval.index.pipeline import index_hits
from worker.retrieval.query_clean import retrieval_query
from worker.retrieval.snippet import Snippet, best_snippet

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Citation:
    """A page the answer was conditioned on."""

    document_id: str
    filename: str
    page: int  # 1-based
    score: float
    snippet: Snippet | None = None  # the passage of the page that best matches the question
    attention: float | None = None  # how much the question looked at the page (its peak
    # attention in the scoring pass, normalised over the answer's pages); None without one


@dataclass
class Answer:
    """An answer, its sources, and where the time and compute went."""

    answer: str
    citations: list[Citation]
    policy: str
    budget: float
    flops_ratio_lm: float  # language-model prefill FLOPs over a full prefill's (the headline)
    flops_ratio_total: float  # the same with the vision tower counted on both sides
    refreshed_visual_tokens: int
    visual_tokens: int
    timings: dict[str, float] = field(default_factory=dict)
    cache: CacheReport = field(default_factory=CacheReport)
    prompt_tokens: int = 0  # the whole prompt the model saw (head, pages, question)
    completion_tokens: int = 0  # tokens generated (a stop token that ended it not counted)
    stop_reason: str = "stop"  # "stop": the model ended it; "length": max_new_tokens reached
    fallback: bool = False  # `policy` was predicted to cost more than a full prefill from the
    # cached page embeddings, which ran instead (every visual token recomputed)
    dropped_turns: int = 0  # a follow-up's oldest turns left out to fit the bounds
    added_pages: list[str] = field(default_factory=list)  # "document_id:number" of the pages
    # this turn added to its conversation, in reading order


@dataclass(frozen=True)
class Question:
    """What the caller asks, with per-request overrides of the service defaults."""

    collection_id: CollectionId
    question: str
    top_k: int
    max_new_tokens: int
    document_ids: Sequence[DocumentId] | None = None
    policy: str | None = None
    budget: float | None = None
    temperature: float = 0.0
    bm25_weight: float | None = None  # None = the deployment's setting
    dense_weight: float | None = None
    options: PolicyOptions = field(default_factory=PolicyOptions)
    tenant: str = ""  # who asks: the engine admits questions in turn across tenants
    # the policy resolved with its effective options where the question entered this process
    # (`check_scope`); None until then. Not part of the question's JSON (`worker.wire`): a
    # worker that receives one checks it again, with its model.
    choice: PolicyChoice | None = field(default=None, compare=False)
    history: tuple[PastTurn, ...] = ()  # a follow-up's earlier turns, oldest first
    keep: bool = False  # keep the turn's KV as its conversation's prefix for a follow-up


def check_scope(ctx: WorkerContext, q: Question, *, with_model: bool = True,
                pages: bool = False) -> Question:
    """The question with its policy resolved (`Question.choice`), or a `WorkerError` unless
    it can be answered as asked.

    `with_model=False` skips the checks that need the model loaded (an API process in the
    distributed form has none); the worker that answers runs them. `pages=True` also checks
    that the scope holds ready pages (a streaming reply needs to know before it starts;
    otherwise `retrieve` finds out while listing them).
    """
    try:
        choice = settle_policy(ctx.settings, q.policy, q.options)
        if with_model and isinstance(choice.options.score_layers, tuple):
            ScoreConfig(layers=choice.options.score_layers).layer_slice(
                len(ctx.runtime.adapter.layers))
    except (InvalidRequestError, UnknownPolicyError, ValueError) as exc:
        raise InvalidOptionsError(str(exc)) from None
    check_question_length(ctx, q.question, with_model=with_model)
    if pages and not _scope_has_ready_documents(ctx, q):
        raise NoPagesToAnswerError("no ready pages in this scope: upload a document first")
    return replace(q, choice=choice) if with_model else q


def _scope_has_ready_documents(ctx: WorkerContext, q: Question) -> bool:
    """Whether the scope holds a ready document (a ready document has at least one page);
    reads document records only, never the pages."""
    wanted = None if q.document_ids is None else set(q.document_ids)
    return any(d.status == "ready" and (wanted is None or d.id in wanted)
               for d in ctx.meta.list_documents(q.collection_id))


def retrieve(ctx: WorkerContext, q: Question) -> list[tuple[Page, float]]:
    """The top-k pages of the question's scope with their fused retrieval scores: from the
    collection's persistent index when it has one (only the top-k pages are read from the
    store), else by scanning every page of the scope."""
    s = ctx.settings
    dense_weight = s.worker.dense_weight if q.dense_weight is None else q.dense_weight
    bm25_weight = s.worker.bm25_weight if q.bm25_weight is None else q.bm25_weight
    # the index ranks as `search` with page references off (not in the index yet): with them
    # on, scan. Both read the question less its answer-format instructions (`query_clean`)
    # when `clean_queries` is on.
    query = retrieval_query(q.question) if s.worker.clean_queries else q.question
    found = None if s.worker.ref_weight else index_hits(
        ctx, q.collection_id, query, top_k=q.top_k, document_ids=q.document_ids,
        bm25_weight=bm25_weight, dense_weight=dense_weight if ctx.embedder is not None else 0.0)
    if found:
        keys = [(DocumentId(d), int(n)) for d, _, n in (h.key.rpartition(":") for h in found)]
        stored = {f"{p.document_id}:{p.number}": p for p in ctx.meta.get_pages(keys)}
        indexed = [(stored[h.key], h.score) for h in found if h.key in stored]
        if indexed:  # else every hit was deleted a moment ago: scan what is left
            return indexed
    pages = ctx.meta.list_pages(q.collection_id, q.document_ids)
    if not pages:
        raise NoPagesToAnswerError("no ready pages in this scope: upload a document first")
    dense = bool(dense_weight) and ctx.embedder is not None  # else embeddings go unread
    by_key = {f"{p.document_id}:{p.number}": p for p in pages}
    candidates = [
        Candidate(key=k, text=p.text, context=p.context, document=p.document_id, page=p.number,
                  embedding=embedding_from_bytes(p.embedding) if dense and p.embedding else None)
        for k, p in by_key.items()
    ]
    hits = search(query, candidates, top_k=q.top_k, bm25_weight=bm25_weight,
                  dense_weight=dense_weight, embedder=ctx.embedder, rrf_k=s.worker.rrf_k,
                  ref_weight=s.worker.ref_weight, clean_query=False)
    return [(by_key[h.key], h.score) for h in hits]


def reading_order(hits: list[tuple[Page, float]]) -> list[Page]:
    """The retrieved pages as the model reads them: documents in the order of their best hit,
    each document's pages in page order (a later page may refer to an earlier one, and a
    causal model reads only backwards). Citations keep the retrieval ranking."""
    rank: dict[str, int] = {}
    for page, _ in hits:
        rank.setdefault(page.document_id, len(rank))
    return sorted((p for p, _ in hits), key=lambda p: (rank[p.document_id], p.number))


def answer_question(
    ctx: WorkerContext, q: Question, on_token: Callable[[int, str], None] | None = None,
    cancel: threading.Event | None = None,
) -> Answer:
    """Answer one question over the retrieved pages' cached KV: retrieval and the KV read
    run on the caller's thread, the model work in the process's answer engine (batched with
    the other questions in flight; `cancel` set, or `on_token` raising, takes it out of the
    batch at the next step). A question `check_scope` passed in this process is not checked
    again."""
    if q.choice is None:
        q = check_scope(ctx, q)
    assert q.choice is not None
    t0 = time.perf_counter()
    def rank(question: str, top_k: int) -> list[tuple[Page, float]]:
        return retrieve(ctx, replace(q, question=question, top_k=top_k, history=()))

    earlier = turn_pages(ctx, q.history, q.top_k, rank, reading_order)
    questions = [t.question for t in q.history] + [q.question]
    hits = (conversation_hits(ctx, questions, q.top_k, rank) if q.history
            else retrieve(ctx, q))
    t_retrieved = time.perf_counter()
    every = list({page_key(p): p for p in [*(p for t in earlier for p in t),
                                           *reading_order(hits)]}.values())
    try:
        loaded = load_pages(ctx, every)
        kvs = loaded.kvs
        t_loaded = time.perf_counter()
        drop = fit_turns(ctx, q.history, earlier,
                         lambda p: kvs[PageHash(p.page_hash)].num_tokens)
        earlier = earlier[drop:]
        seen = {page_key(p) for t in earlier for p in t}
        pages = [p for p in reading_order(hits) if page_key(p) not in seen]
        filenames = {d: ctx.meta.get_document(d).filename for d in {p.document_id for p in every}}
        collection = ctx.meta.get_collection(q.collection_id)

        def inputs(chosen: list[Page]) -> list[PageInput]:
            return [PageInput(label=page_label(filenames[p.document_id], p.number),
                              kv=kvs[PageHash(p.page_hash)], page_id=p.page_hash)
                    for p in chosen]

        request = AnswerRequest(
            prefix=ANSWER_PREFIX,
            pages=inputs(pages),
            question=q.question,
            policy=q.choice,
            budget=ctx.settings.core.budget if q.budget is None else q.budget,
            max_new_tokens=q.max_new_tokens,
            temperature=q.temperature,
            namespace=cache_namespace(collection.page_namespace),
            history=tuple(Turn(tuple(inputs(added)), t.question, t.answer)
                          for t, added in zip(q.history[drop:], earlier, strict=True)),
            keep=q.keep,
            tenant=q.tenant,
        )
        result, queue_s = ctx.engine.answer(request, on_token=on_token, cancel=cancel,
                                            tenant=q.tenant)
    finally:
        # a document deleted during the question (even one that made it fail): drop the KV
        # its pages got again, so that no orphan entries stay behind
        release_unreferenced(ctx, [p.page_hash for p in every])
    t_done = time.perf_counter()
    shares = {(p.document_id, p.number): round(a, 6)
              for p, a in zip(pages, result.page_attention, strict=False)}
    if loaded.report.pages_prefilled_now:
        log.info("prefilled %d page(s) at question time", loaded.report.pages_prefilled_now)
    return Answer(
        answer=result.text,
        citations=[Citation(document_id=p.document_id, filename=filenames[p.document_id],
                            page=p.number, score=round(score, 6),
                            snippet=best_snippet(q.question, p.text),
                            attention=shares.get((p.document_id, p.number)))
                   for p, score in hits],
        policy=request.policy.name,
        budget=request.budget,
        flops_ratio_lm=result.flops_ratio_lm,
        flops_ratio_total=result.flops_ratio_total,
        refreshed_visual_tokens=result.refreshed_visual_tokens,
        visual_tokens=result.visual_tokens,
        timings={
            "retrieve_s": t_retrieved - t0,
            "prefill_missing_s": loaded.prefill_s,
            "kv_load_s": loaded.load_s,
            "queue_s": queue_s,
            "ttft_s": result.ttft_s,
            "generate_s": t_done - t_loaded,
            "total_s": t_done - t0,
        },
        cache=replace(loaded.report, head_tokens=result.head_tokens,
                      conversation=result.conversation),
        fallback=result.fallback,
        dropped_turns=drop,
        added_pages=[page_key(p) for p in pages],
        prompt_tokens=result.prompt_tokens,
        completion_tokens=len(result.token_ids),
        stop_reason=result.stop_reason,
    )
