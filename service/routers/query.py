"""`POST /v1/query` (one JSON answer) and `POST /v1/query/stream` (server-sent events: one
`token` event per generated piece, then `done` with the whole answer, or `error`)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator

import anyio
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from conduit_core.answer_types import PolicyOptions
from service.deps import CtxDep, RunnerDep, TenantDep
from service.metrics import ANSWER_SECONDS, FALLBACKS, FLOPS_RATIO, QUERIES, TTFT
from service.routers.collections import owned_collection
from service.routers.documents import document_not_found
from service.schemas import CacheOut, QueryIn, QueryOut
from service.views import citation_out
from storage.metadata import CollectionId, DocumentId
from worker.answer_job import Answer, Question, check_scope
from worker.context import WorkerContext
from worker.errors import AnswerCancelledError

router = APIRouter(tags=["query"])


def build_question(body: QueryIn, ctx: WorkerContext, tenant: str,
                   check_pages: bool = False) -> Question:
    """Resolve and check a query body into the worker's `Question` (404/409/422 on problems)."""
    col = owned_collection(ctx, tenant, body.collection_id)
    if body.document_ids is not None:
        _check_documents(ctx, col.id, body.document_ids)
    question = Question(
        collection_id=col.id, question=body.question, top_k=body.top_k,
        max_new_tokens=body.max_new_tokens,
        document_ids=None if body.document_ids is None else [DocumentId(d) for d in
                                                              body.document_ids],
        policy=body.policy, budget=body.budget, temperature=body.temperature,
        bm25_weight=body.bm25_weight, dense_weight=body.dense_weight,
        options=PolicyOptions(gamma=body.gamma, score_layers=body.score_layers,
                              query_window=body.query_window, head_agg=body.head_agg),
    )
    check_scope(ctx, question, with_model=ctx.settings.embedded, pages=check_pages)
    return question


def _check_documents(ctx: WorkerContext, collection_id: CollectionId,
                     document_ids: list[str]) -> None:
    """404 naming the first id that is not a document of the collection: the same reply for
    a made-up id, a deleted document and another tenant's (which is in another collection)."""
    present = {d.id for d in ctx.meta.list_documents(collection_id)}
    for document_id in document_ids:
        if document_id not in present:
            raise document_not_found(document_id)


def to_query_out(result: Answer) -> QueryOut:
    """Record the answer's metrics and shape it as the response body."""
    QUERIES.labels(result.policy, "ok").inc()
    TTFT.observe(result.timings["ttft_s"])
    ANSWER_SECONDS.observe(result.timings["total_s"])
    FLOPS_RATIO.observe(result.flops_ratio_lm)
    if result.fallback:
        FALLBACKS.labels(result.policy).inc()
    return QueryOut(
        answer=result.answer,
        citations=[citation_out(c) for c in result.citations],
        policy=result.policy, budget=result.budget, flops_ratio_lm=result.flops_ratio_lm,
        flops_ratio_total=result.flops_ratio_total,
        refreshed_visual_tokens=result.refreshed_visual_tokens,
        visual_tokens=result.visual_tokens, timings=result.timings,
        cache=CacheOut(pages_from=result.cache.pages_from,
                       pages_prefilled_now=result.cache.pages_prefilled_now,
                       head_tokens=result.cache.head_tokens),
        fallback=result.fallback,
    )


@router.post("/v1/query", response_model=QueryOut)
def query(body: QueryIn, ctx: CtxDep, runner: RunnerDep, tenant: TenantDep) -> QueryOut:
    """Retrieve pages, reuse their cached KV with selective refresh, and answer."""
    return to_query_out(runner.answer(build_question(body, ctx, tenant)))


@router.post("/v1/query/stream", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
async def query_stream(body: QueryIn, ctx: CtxDep, runner: RunnerDep,
                       tenant: TenantDep) -> StreamingResponse:
    """The same answer as server-sent events, token by token."""
    question = await anyio.to_thread.run_sync(build_question, body, ctx, tenant, True)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    gone = threading.Event()  # the client disconnected: the answer leaves the batch

    def on_token(_token_id: int, text: str) -> None:
        if gone.is_set():
            raise AnswerCancelledError("the client went away")
        if text:  # a token that completes no character yet sends nothing
            loop.call_soon_threadsafe(events.put_nowait, ("token", json.dumps({"text": text})))

    def run() -> None:
        try:
            out = to_query_out(runner.answer(question, on_token=on_token, cancel=gone))
            event = ("done", out.model_dump_json())
        except Exception as exc:  # reported to the client as an event, never a dropped stream
            QUERIES.labels(question.policy or ctx.settings.policy, "error").inc()
            event = ("error", json.dumps({"detail": getattr(exc, "message", str(exc))}))
        loop.call_soon_threadsafe(events.put_nowait, event)

    async def stream() -> AsyncIterator[str]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, run)
            try:
                while True:
                    kind, data = await events.get()
                    yield f"event: {kind}\ndata: {data}\n\n"
                    if kind in ("done", "error"):
                        break
            finally:  # a disconnect cancels this generator: the answer leaves the batch at
                gone.set()  # its next step, and the task group stops waiting for it

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
