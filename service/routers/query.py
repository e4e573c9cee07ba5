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
from starlette.background import BackgroundTask

from service.answers import SSE_HEADERS, answer_slot, build_question, to_query_out
from service.deps import TenantDep, WorkerDep
from service.metrics import QUERIES
from service.schemas import QueryIn, QueryOut
from worker.facade import AnswerCancelledError

router = APIRouter(tags=["query"])


@router.post("/v1/query", response_model=QueryOut)
def query(body: QueryIn, worker: WorkerDep, tenant: TenantDep) -> QueryOut:
    """Retrieve pages, reuse their cached KV with selective refresh, and answer (429 while
    the caller has its cap of answers in flight: `service.answers.answer_slot`)."""
    with answer_slot(worker, tenant):
        return to_query_out(worker.answer(build_question(body, worker, tenant)))


@router.post("/v1/query/stream", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
async def query_stream(body: QueryIn, worker: WorkerDep,
                       tenant: TenantDep) -> StreamingResponse:
    """The same answer as server-sent events, token by token. The caller's answer slot is
    taken before the stream starts (429 instead of a stream) and held until it ends."""
    slot = answer_slot(worker, tenant)
    try:
        question = await anyio.to_thread.run_sync(build_question, body, worker, tenant, True)
    except BaseException:
        slot.close()
        raise
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
            out = to_query_out(worker.answer(question, on_token=on_token, cancel=gone))
            event = ("done", out.model_dump_json())
        except Exception as exc:  # reported to the client as an event, never a dropped stream
            QUERIES.labels(question.policy or worker.settings.core.policy, "error").inc()
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
            slot.close()

    # the background task frees the slot of a stream that never started (the client gone)
    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(slot.close))
