"""`POST /v1/query` (one JSON answer) and `POST /v1/query/stream` (server-sent events: one
`token` event per generated piece, then `done` with the whole answer, or `error`)."""

from __future__ import annotations

import anyio
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from service.answers import answer_events, answer_slot, build_question, to_query_out
from service.deps import TenantDep, WorkerDep
from service.metrics import QUERIES
from service.schemas import QueryIn, QueryOut

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
    return answer_events(
        worker, question, lambda answer: to_query_out(answer).model_dump_json(), slot.close,
        on_error=lambda: QUERIES.labels(question.policy or worker.settings.core.policy,
                                        "error").inc())
