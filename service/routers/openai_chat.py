"""`POST /v1/chat/completions`: an OpenAI-compatible chat endpoint over a collection.

`model` names the collection as `conduit:<collection_id>` (or pass `collection_id`; `GET
/v1/models` lists the caller's). The whole `messages` list is the conversation, sent back by
the client every time (stateless): each run of user messages answered by the assistant is an
earlier turn (its question, and its answer as the client sends it back), the last run of user
messages the question; system messages are left to conduit's own instructions. A message's
`content` is a string or an array of parts, as OpenAI's API allows: text parts are joined with
newlines, any other part (an image) is a 422 saying so. A conversation whose turns conduit
answered before reuses their KV without any id (`conduit.conversation`: "hit" or "rebuilt").
Non-streaming replies
carry `usage` (`prompt_tokens`: the whole prompt the model saw, `completion_tokens`,
`total_tokens`) and conduit's citations and compute in extra fields (`citations`, `conduit`:
policy, budget, `flops_ratio_lm`, `flops_ratio_total`, refreshed and visual token counts);
`stream: true` sends `chat.completion.chunk` events (never an empty content delta), the last
one with `finish_reason` and the same extra fields, then, when the client sent
`stream_options: {"include_usage": true}`, a chunk with empty `choices` and the `usage`, then
`data: [DONE]`. Every string and list of the request is bounded, and every invalid request
is a 422: a question (the last user message) over 4,000 characters, any message over 32,768,
more than 256 messages.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Literal

import anyio
from fastapi import APIRouter, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.background import BackgroundTask

from service.answers import SSE_HEADERS, answer_slot, build_question, to_query_out
from service.deps import TenantDep, WorkerDep
from service.schemas import QueryIn, QueryOut
from worker.facade import Answer, AnswerCancelledError, PastTurn

router = APIRouter(tags=["openai"])


# The question (the last user message) has `QueryIn.question`'s bound of 4,000 characters;
# earlier turns, which front-ends send back (conduit's own answers among them), may be longer,
# up to this.
MAX_MESSAGE_CHARS = 32_768
MAX_MESSAGES = 256  # a long conversation's whole history
MAX_ID_CHARS = 64  # conduit's ids (`col_` and 20 hex digits) with room to spare
ID_PATTERN = re.compile(r"[A-Za-z0-9_\-]+")


class ContentPart(BaseModel):
    """One part of a message's content: a text part, or another kind (refused by `_turns`)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(..., max_length=64)
    text: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)


class ChatMessage(BaseModel):
    """One chat turn: its content a string or an array of parts."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]

    @field_validator("content")
    @classmethod
    def _bounded(cls, content: str | list[ContentPart]) -> str | list[ContentPart]:
        """At most `MAX_MESSAGE_CHARS` characters, or `MAX_MESSAGES` parts."""
        if isinstance(content, str) and len(content) > MAX_MESSAGE_CHARS:
            raise ValueError(f"String should have at most {MAX_MESSAGE_CHARS} characters")
        if isinstance(content, list) and len(content) > MAX_MESSAGES:
            raise ValueError(f"List should have at most {MAX_MESSAGES} parts")
        return content

    def text(self, index: int) -> str:
        """The message's text: text parts joined with newlines; a 422 naming the message for
        any other part."""
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise HTTPException(422, f"messages[{index}] has a {part.type!r} part: conduit "
                                    "reads text parts only (upload images to the collection "
                                    "as documents)")
        text = "\n".join(part.text or "" for part in self.content)
        if len(text) > MAX_MESSAGE_CHARS:
            raise HTTPException(422, f"messages[{index}] is over {MAX_MESSAGE_CHARS} characters")
        return text


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


def _turns(body: ChatIn) -> tuple[tuple[PastTurn, ...], str, int]:
    """The conversation in `body.messages`: its answered turns, the question (the user
    messages after the last answer, joined) and the index of its last message; a 422 when
    no user message waits for an answer."""
    turns: list[PastTurn] = []
    asked: list[str] = []
    answer: list[str] = []
    last = -1
    for i, message in enumerate(body.messages):
        if message.role == "user":
            if answer:  # the turn before is answered: a new one starts
                turns.append(PastTurn("\n".join(asked), "\n".join(answer)))
                asked, answer = [], []
            asked.append(message.text(i))
            last = i
        elif message.role == "assistant" and asked:
            answer.append(message.text(i))
        else:
            message.text(i)  # system, developer, or an answer before any question: checked
    question = "\n".join(asked)
    if answer or not question.strip():
        raise HTTPException(422, "the conversation has no user message to answer")
    return tuple(turns), question, last


def _query(body: ChatIn, question: str, last: int) -> QueryIn:
    """The query the chat asks: a 422 (never a 500) for anything `QueryIn` refuses, located in
    the chat request's own terms (the question is `body.messages.<i>.content`)."""
    collection = body.collection_id
    if collection is None and body.model.startswith("conduit:"):
        collection = body.model.removeprefix("conduit:")
    if not collection or not ID_PATTERN.fullmatch(collection):
        raise HTTPException(422, "set model to 'conduit:<collection_id>' or pass collection_id")
    where = {"question": ("body", "messages", last, "content"),
             "collection_id": ("body", "model" if body.collection_id is None else
                               "collection_id"),
             "max_new_tokens": ("body", "max_tokens")}
    try:
        return QueryIn(collection_id=collection, question=question,
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
                        "visual_tokens": out.visual_tokens,
                        "conversation": out.cache.conversation,
                        "dropped_turns": out.dropped_turns}}


def _event(cid: str, model: str, choices: list[dict[str, object]],
           extras: dict[str, object]) -> str:
    payload = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
               "model": model, "choices": choices, **extras}
    return f"data: {json.dumps(payload)}\n\n"


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatIn, worker: WorkerDep,
                           tenant: TenantDep) -> dict[str, object] | StreamingResponse:
    """Answer the conversation's last user messages over the collection named by `model`,
    reading its earlier turns (429 while the caller has its cap of answers in flight; a
    stream holds its slot until it ends)."""
    history, asked, last = _turns(body)
    slot = answer_slot(worker, tenant)
    try:
        question = await anyio.to_thread.run_sync(build_question, _query(body, asked, last),
                                                  worker, tenant, body.stream)
        question = replace(question, history=history, keep=True)
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
