"""What the answering routes share (`/v1/query`, conversations, the OpenAI-compatible chat):
a request body checked into the worker's `Question`, an answer recorded in the metrics and
shaped as the response body, and an answer streamed as server-sent events."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack

import anyio
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from conduit_core.policies.choice import PolicyOptions
from service.access import document_not_found, owned_collection
from service.metrics import ANSWER_SECONDS, FALLBACKS, FLOPS_RATIO, QUERIES, TTFT
from service.schemas import CacheOut, QueryIn, QueryOut
from service.views import citation_out
from storage.metadata import CollectionId, DocumentId
from worker.facade import Answer, AnswerCancelledError, Question, Worker

# The headers of a server-sent event answer: nothing between the service and the client may
# hold its events back (X-Accel-Buffering: ingress-nginx and nginx buffer a response unless
# told not to; Cache-Control: nor may a cache keep or merge it).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def answer_slot(worker: Worker, tenant: str) -> ExitStack:
    """One of `tenant`'s answers in flight (`Worker.answer_slot`), held until the returned
    stack is closed (closing twice is harmless); `TenantBusyError` (429 with Retry-After) when
    the tenant holds its cap already."""
    stack = ExitStack()
    stack.enter_context(worker.answer_slot(tenant))
    return stack


def build_question(body: QueryIn, worker: Worker, tenant: str,
                   check_pages: bool = False) -> Question:
    """Resolve and check a query body into the worker's `Question` (404/409/422 on problems),
    its policy resolved once where the model is loaded here (`Worker.check_question`)."""
    col = owned_collection(worker, tenant, body.collection_id)
    if body.document_ids is not None:
        check_documents(worker, col.id, body.document_ids)
    question = Question(
        collection_id=col.id, question=body.question, top_k=body.top_k,
        max_new_tokens=body.max_new_tokens,
        document_ids=None if body.document_ids is None else [DocumentId(d) for d in
                                                              body.document_ids],
        policy=body.policy, budget=body.budget, temperature=body.temperature,
        bm25_weight=body.bm25_weight, dense_weight=body.dense_weight,
        options=PolicyOptions(gamma=body.gamma, score_layers=body.score_layers,
                              query_window=body.query_window, head_agg=body.head_agg),
        tenant=tenant,
    )
    return worker.check_question(question, pages=check_pages)


def check_documents(worker: Worker, collection_id: CollectionId,
                     document_ids: list[str]) -> None:
    """404 naming the first id that is not a document of the collection: the same reply for
    a made-up id, a deleted document and another tenant's (which is in another collection)."""
    present = {d.id for d in worker.meta.list_documents(collection_id)}
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
                       head_tokens=result.cache.head_tokens,
                       conversation=result.cache.conversation),
        fallback=result.fallback, dropped_turns=result.dropped_turns,
    )


def answer_events(worker: Worker, question: Question, done: Callable[[Answer], str],
                  release: Callable[[], None],
                  on_error: Callable[[], None] | None = None) -> StreamingResponse:
    """`question`'s answer as server-sent events: a `token` event per decoded piece of text,
    then `done` (with `done(answer)`, the body as JSON) or `error` (with its detail). A client
    that goes away cancels the answer at its next step. `release` runs once the answer has
    left the engine, or when a stream that never started is dropped. Call it from the route's
    event loop."""
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
            event = ("done", done(worker.answer(question, on_token=on_token, cancel=gone)))
        except Exception as exc:  # reported to the client as an event, never a dropped stream
            if on_error is not None:
                on_error()
            event = ("error", json.dumps({"detail": getattr(exc, "message", str(exc))}))
        loop.call_soon_threadsafe(events.put_nowait, event)

    async def stream() -> AsyncIterator[str]:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, run)
                try:
                    while True:
                        kind, data = await events.get()
                        yield f"event: {kind}\ndata: {data}\n\n"
                        if kind in ("done", "error"):
                            break
                finally:  # a disconnect cancels this generator: the answer leaves the
                    gone.set()  # batch at its next step, and the task group waits for it
        finally:  # the answer has left the engine
            release()

    # the background task releases a stream that never started (the client gone)
    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(release))
