"""`/v1/conversations`: a tenant's conversations over a collection, asked turn by turn.

`POST /v1/conversations` starts one (201), `POST /v1/conversations/{id}/messages` asks its
next question and answers it as `/v1/query` does (its `.../messages/stream` as server-sent
events, like `/v1/query/stream`), reading the earlier turns; `GET /v1/conversations/{id}`
gives its turns with their citations and figures, `GET /v1/conversations` the tenant's list,
`DELETE` removes one. Another tenant's id, an unknown one and an expired one are the same
404; past the stored conversations' limit 413, past a conversation's turns 409, and a
message while another of the same conversation is being answered 409
(`worker.conversations`): the turn holds its conversation from before its history is read
until its answer is kept (for a stream, until the stream ends).
"""

from __future__ import annotations

from contextlib import ExitStack

import anyio
from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse

from service.access import owned_collection
from service.answers import (
    answer_events,
    answer_slot,
    build_question,
    check_documents,
    to_query_out,
)
from service.deps import TenantDep, WorkerDep
from service.schemas import (
    ConversationIn,
    ConversationOut,
    MessageIn,
    QueryIn,
    QueryOut,
    TurnOut,
)
from storage.conversations import Conversation
from worker.facade import Answer, Question, Worker

router = APIRouter(tags=["conversations"])


def _out(conversation: Conversation, turns: bool) -> ConversationOut:
    return ConversationOut(
        conversation_id=conversation.id, collection_id=conversation.collection_id,
        document_ids=conversation.document_ids, title=conversation.title,
        created_at=conversation.created_at, updated_at=conversation.updated_at,
        turns=[TurnOut(question=t.question, answer=t.answer, citations=t.citations,
                       details=t.details, created_at=t.created_at)
               for t in conversation.turns] if turns else None)


@router.post("/v1/conversations", response_model=ConversationOut, status_code=201)
def create_conversation(body: ConversationIn, worker: WorkerDep,
                        tenant: TenantDep) -> ConversationOut:
    """A new conversation over the caller's collection (404 for one it cannot see)."""
    col = owned_collection(worker, tenant, body.collection_id)
    if body.document_ids is not None:  # the same 404s as a query's scope
        check_documents(worker, col.id, body.document_ids)
    conversation = worker.conversations.create(tenant, col.id, body.document_ids, body.title)
    return _out(conversation, turns=True)


@router.get("/v1/conversations", response_model=list[ConversationOut])
def list_conversations(worker: WorkerDep, tenant: TenantDep) -> list[ConversationOut]:
    """The caller's conversations, most recently updated first (without their turns)."""
    return [_out(c, turns=False) for c in worker.conversations.of_tenant(tenant)]


@router.get("/v1/conversations/{conversation_id}", response_model=ConversationOut)
def get_conversation(conversation_id: str, worker: WorkerDep,
                     tenant: TenantDep) -> ConversationOut:
    """The conversation with its turns, oldest first."""
    return _out(worker.conversations.get(tenant, conversation_id), turns=True)


@router.delete("/v1/conversations/{conversation_id}", status_code=204)
def delete_conversation(conversation_id: str, worker: WorkerDep, tenant: TenantDep) -> Response:
    """Remove the conversation and its turns."""
    worker.conversations.delete(tenant, conversation_id)
    return Response(status_code=204)


def _question(worker: Worker, tenant: str, conversation: Conversation, body: MessageIn,
              stream: bool) -> Question:
    """The message as the conversation's next question (its scope, history and kept KV)."""
    query = QueryIn(collection_id=conversation.collection_id,
                    document_ids=conversation.document_ids, **body.model_dump())
    return worker.conversations.follow_up(conversation,
                                          build_question(query, worker, tenant, stream))


def _record(worker: Worker, conversation: Conversation, question: str,
            answer: Answer) -> QueryOut:
    """The answer's body, its turn appended to the conversation."""
    out = to_query_out(answer)
    worker.conversations.record(conversation, question, answer,
                                [c.model_dump() for c in out.citations],
                                out.model_dump(exclude={"answer", "citations"}))
    return out


@router.post("/v1/conversations/{conversation_id}/messages", response_model=QueryOut)
def ask(conversation_id: str, body: MessageIn, worker: WorkerDep,
        tenant: TenantDep) -> QueryOut:
    """Answer the conversation's next question, reading its earlier turns."""
    with worker.conversations.turn(tenant, conversation_id) as conversation, \
            answer_slot(worker, tenant):
        question = _question(worker, tenant, conversation, body, False)
        return _record(worker, conversation, body.question, worker.answer(question))


@router.post("/v1/conversations/{conversation_id}/messages/stream",
             response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
async def ask_stream(conversation_id: str, body: MessageIn, worker: WorkerDep,
                     tenant: TenantDep) -> StreamingResponse:
    """The same answer as server-sent events (`token` events, then `done` or `error`); the
    turn is kept once the answer is done."""
    slot = ExitStack()  # the conversation's turn and the tenant's answer slot
    try:
        conversation = await anyio.to_thread.run_sync(
            slot.enter_context, worker.conversations.turn(tenant, conversation_id))
        slot.enter_context(answer_slot(worker, tenant))
        question = await anyio.to_thread.run_sync(_question, worker, tenant, conversation,
                                                  body, True)
    except BaseException:
        slot.close()
        raise
    return answer_events(
        worker, question,
        lambda answer: _record(worker, conversation, body.question, answer).model_dump_json(),
        slot.close)
