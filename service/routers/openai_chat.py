"""`POST /v1/chat/completions`: an OpenAI-compatible chat endpoint over a collection.

`model` names the collection as `conduit:<collection_id>` (or pass `collection_id`; `GET
/v1/models` lists the caller's); the last user message is the question. Non-streaming replies
carry `usage` (`prompt_tokens`: the whole prompt the model saw, `completion_tokens`,
`total_tokens`) and conduit's citations and compute in extra fields (`citations`, `conduit`:
policy, budget, `flops_ratio_lm`, `flops_ratio_total`, refreshed and visual token counts);
`stream: true` sends `chat.completion.chunk` events (never an empty content delta), the last
one with `finish_reason` and the same extra fields, then, when the client sent
`stream_options: {"include_usage": true}`, a chunk with empty `choices` and the `usage`, then
`data: [DONE]`. Every string and list of the request is bounded, and every invalid request
is a 422: a question (the last user message) over 4,000 characters, any message over 32,768
(earlier turns go unread), more than 256 messages.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import anyio
from fastapi import APIRouter, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.background import BackgroundTask

from service.answers import SSE_HEADERS, answer_slot, build_question, to_query_out
from service.deps import TenantDep, WorkerDep
from service.schemas import QueryIn, QueryOut
from worker.facade import Answer, AnswerCancelledError

router = APIRouter(tags=["openai"])


# The question (the last user message) has `QueryIn.question`'s bound of 4,000 characters;
# earlier turns, which front-ends send back (conduit's own answers among them), go unread and
# may be longer, up to this.
MAX_MESSAGE_CHARS = 32_768
MAX_MESSAGES = 256  # a long conversation's whole history
MAX_ID_CHARS = 64  # conduit's ids (`col_` and 20 hex digits) with room to spare
ID_PATTERN = re.compile(r"[A-Za-z0-9_\-]+")


class ChatMessage(BaseModel):
    """One chat turn (text content only)."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str = Field(..., max_length=MAX_MESSAGE_CHARS)


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`: `include_usage` adds a final chunk with the token usage."""

    include_usage: bool = False


class ChatIn(BaseModel):
    """The subset of the OpenAI chat request conduit understands (other fields are ignored)."""

    model_config = ConfigDict(allow_inf_nan=False)

    model: str = Field(..., max_length=len("conduit:") + MAX_ID_CHARS,
                       description="`conduit:<collection_id>`")
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(64, ge=1, le=2048)
    max_completion_tokens: int | None = Field(None, ge=1, le=2048,
                                              description="OpenAI's newer name of max_tokens; "
                                              "wins when both are given.")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    collection_id: str | None = Field(None, max_length=MAX_ID_CHARS)
    top_k: int = Field(3, ge=1, le=32)

    @property
    def include_usage(self) -> bool:
        """Whether a streamed reply ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


@dataclass(frozen=True)
class StreamFailure:
    """An answer that failed after the stream started: sent as an OpenAI-style error event
    (`data: {"error": {...}}`) before `data: [DONE]`."""

    message: str
    status: int

    def event(self) -> str:
        """The server-sent event carrying the error."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return "data: " + json.dumps({"error": {"message": self.message, "type": kind,
                                                "code": self.status}}) + "\n\n"


def _query(body: ChatIn) -> QueryIn:
    """The query the chat asks: a 422 (never a 500) for anything `QueryIn` refuses, located in
    the chat request's own terms (the question is `body.messages.<i>.content`)."""
    collection = body.collection_id
    if collection is None and body.model.startswith("conduit:"):
        collection = body.model.removeprefix("conduit:")
    if not collection or not ID_PATTERN.fullmatch(collection):
        raise HTTPException(422, "set model to 'conduit:<collection_id>' or pass collection_id")
    users = [i for i, m in enumerate(body.messages) if m.role == "user"]
    if not users or not body.messages[users[-1]].content.strip():
        raise HTTPException(422, "the conversation has no user message to answer")
    where = {"question": ("body", "messages", users[-1], "content"),
             "collection_id": ("body", "model" if body.collection_id is None else
                               "collection_id"),
             "max_new_tokens": ("body", "max_tokens")}
    try:
        return QueryIn(collection_id=collection, question=body.messages[users[-1]].content,
                       top_k=body.top_k,
                       max_new_tokens=body.max_completion_tokens or body.max_tokens,
                       temperature=body.temperature)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise RequestValidationError(
            [{**e, "loc": where.get(str(e["loc"][0]), ("body", *e["loc"]))} for e in errors]
        ) from None


def usage(answer: Answer) -> dict[str, int]:
    """OpenAI's `usage` of an answer: the prompt the model saw and the tokens it generated."""
    return {"prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens}


@dataclass(frozen=True)
class Finished:
    """A streamed answer's end: the response fields and the token usage."""

    out: QueryOut
    usage: dict[str, int]
    finish: str  # OpenAI's finish_reason: "stop" or "length"


def finish_reason(answer: Answer) -> str:
    """OpenAI's `finish_reason`: "length" when the answer reached its token limit."""
    return "length" if answer.stop_reason == "length" else "stop"


def _extras(out: QueryOut) -> dict[str, object]:
    """conduit's fields beside the OpenAI ones: citations and the refresh's compute."""
    return {"citations": [c.model_dump() for c in out.citations],
            "conduit": {"policy": out.policy, "budget": out.budget,
                        "flops_ratio_lm": out.flops_ratio_lm,
                        "flops_ratio_total": out.flops_ratio_total,
                        "refreshed_visual_tokens": out.refreshed_visual_tokens,
                        "visual_tokens": out.visual_tokens}}


def _event(cid: str, model: str, choices: list[dict[str, object]],
           extras: dict[str, object]) -> str:
    payload = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
               "model": model, "choices": choices, **extras}
    return f"data: {json.dumps(payload)}\n\n"


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatIn, worker: WorkerDep,
                           tenant: TenantDep) -> dict[str, object] | StreamingResponse:
    """Answer the last user message over the collection named by `model` (429 while the
    caller has its cap of answers in flight; a stream holds its slot until it ends)."""
    slot = answer_slot(worker, tenant)
    try:
        question = await anyio.to_thread.run_sync(build_question, _query(body), worker, tenant,
                                                  body.stream)
    except BaseException:
        slot.close()
        raise
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    if not body.stream:
        with slot:
            answer = await anyio.to_thread.run_sync(worker.answer, question)
        out = to_query_out(answer)
        return {
            "id": cid, "object": "chat.completion", "created": int(time.time()),
            "model": body.model,
            "choices": [{"index": 0, "finish_reason": finish_reason(answer),
                         "message": {"role": "assistant", "content": out.answer}}],
            "usage": usage(answer),
            **_extras(out),
        }
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str | None | Finished | StreamFailure] = asyncio.Queue()

    gone = threading.Event()  # the client disconnected: the answer leaves the batch

    def on_token(_token_id: int, text: str) -> None:
        if gone.is_set():
            raise AnswerCancelledError("the client went away")
        if text:
            loop.call_soon_threadsafe(pieces.put_nowait, text)

    def run() -> None:
        try:
            answer = worker.answer(question, on_token=on_token, cancel=gone)
            done = Finished(to_query_out(answer), usage(answer), finish_reason(answer))
            loop.call_soon_threadsafe(pieces.put_nowait, done)
        except Exception as exc:  # an error event, never a silently cut stream
            failure = StreamFailure(getattr(exc, "message", None) or
                                    f"internal error while answering: {type(exc).__name__}",
                                    getattr(exc, "http_status", 500))
            loop.call_soon_threadsafe(pieces.put_nowait, failure)
        finally:
            loop.call_soon_threadsafe(pieces.put_nowait, None)

    # with include_usage every chunk has a `usage` field, null but in the last (OpenAI's form)
    no_usage: dict[str, object] = {"usage": None} if body.include_usage else {}

    def chunk(delta: dict[str, str], finish: str | None = None,
              extras: dict[str, object] | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _event(cid, body.model, [choice], {**(extras or {}), **no_usage})

    async def stream() -> AsyncIterator[str]:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, run)
                try:
                    yield chunk({"role": "assistant"})
                    while (piece := await pieces.get()) is not None:
                        if isinstance(piece, Finished):
                            yield chunk({}, piece.finish, _extras(piece.out))
                            if body.include_usage:
                                yield _event(cid, body.model, [], {"usage": piece.usage})
                        elif isinstance(piece, StreamFailure):
                            yield piece.event()
                        else:
                            yield chunk({"content": piece})
                    yield "data: [DONE]\n\n"
                finally:  # a disconnect: the answer leaves the batch at its next step
                    gone.set()
        finally:  # the answer has left the engine
            slot.close()

    # the background task frees the slot of a stream that never started (the client gone)
    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(slot.close))
