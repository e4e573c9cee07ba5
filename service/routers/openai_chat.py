"""`POST /v1/chat/completions`: an OpenAI-compatible chat endpoint over a collection.

`model` names the collection as `conduit:<collection_id>` (or pass `collection_id`); the last
user message is the question. Non-streaming replies carry conduit's citations and compute in
extra fields (`citations`, `conduit`: policy, budget, `flops_ratio_lm`, `flops_ratio_total`,
refreshed and visual token counts); `stream: true` sends `chat.completion.chunk` events (never
an empty content delta), the last one with `finish_reason` and the same extra fields, then
`data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import anyio
from fastapi import APIRouter, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from service.deps import CtxDep, RunnerDep, TenantDep
from service.routers.query import build_question, to_query_out
from service.schemas import QueryIn, QueryOut

router = APIRouter(tags=["openai"])


class ChatMessage(BaseModel):
    """One chat turn (text content only)."""

    role: Literal["system", "user", "assistant"]
    content: str


class ChatIn(BaseModel):
    """The subset of the OpenAI chat request conduit understands."""

    model: str = Field(..., description="`conduit:<collection_id>`")
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int = Field(64, ge=1, le=2048)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    stream: bool = False
    collection_id: str | None = None
    top_k: int = Field(3, ge=1, le=32)


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
    collection = body.collection_id
    if collection is None and body.model.startswith("conduit:"):
        collection = body.model.removeprefix("conduit:")
    if not collection:
        raise HTTPException(422, "set model to 'conduit:<collection_id>' or pass collection_id")
    users = [m.content for m in body.messages if m.role == "user"]
    if not users or not users[-1].strip():
        raise HTTPException(422, "the conversation has no user message to answer")
    return QueryIn(collection_id=collection, question=users[-1], top_k=body.top_k,
                   max_new_tokens=body.max_tokens, temperature=body.temperature)


def _extras(out: QueryOut) -> dict[str, object]:
    """conduit's fields beside the OpenAI ones: citations and the refresh's compute."""
    return {"citations": [c.model_dump() for c in out.citations],
            "conduit": {"policy": out.policy, "budget": out.budget,
                        "flops_ratio_lm": out.flops_ratio_lm,
                        "flops_ratio_total": out.flops_ratio_total,
                        "refreshed_visual_tokens": out.refreshed_visual_tokens,
                        "visual_tokens": out.visual_tokens}}


def _chunk(cid: str, model: str, delta: dict[str, str], finish: str | None,
           extras: dict[str, object] | None = None) -> str:
    payload = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
               "model": model, "choices": [{"index": 0, "delta": delta,
                                            "finish_reason": finish}], **(extras or {})}
    return f"data: {json.dumps(payload)}\n\n"


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatIn, ctx: CtxDep, runner: RunnerDep,
                           tenant: TenantDep) -> dict[str, object] | StreamingResponse:
    """Answer the last user message over the collection named by `model`."""
    question = await anyio.to_thread.run_sync(build_question, _query(body), ctx, tenant,
                                              body.stream)
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    if not body.stream:
        out = to_query_out(await anyio.to_thread.run_sync(runner.answer, question))
        return {
            "id": cid, "object": "chat.completion", "created": int(time.time()),
            "model": body.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": out.answer}}],
            "usage": {"completion_tokens": None, "prompt_tokens": None, "total_tokens": None},
            **_extras(out),
        }
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str | None | QueryOut | StreamFailure] = asyncio.Queue()

    def on_token(_token_id: int, text: str) -> None:
        if text:
            loop.call_soon_threadsafe(pieces.put_nowait, text)

    def run() -> None:
        try:
            out = to_query_out(runner.answer(question, on_token=on_token))
            loop.call_soon_threadsafe(pieces.put_nowait, out)
        except Exception as exc:  # an error event, never a silently cut stream
            failure = StreamFailure(getattr(exc, "message", None) or
                                    f"internal error while answering: {type(exc).__name__}",
                                    getattr(exc, "http_status", 500))
            loop.call_soon_threadsafe(pieces.put_nowait, failure)
        finally:
            loop.call_soon_threadsafe(pieces.put_nowait, None)

    async def stream() -> AsyncIterator[str]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, run)
            yield _chunk(cid, body.model, {"role": "assistant"}, None)
            while (piece := await pieces.get()) is not None:
                if isinstance(piece, QueryOut):
                    yield _chunk(cid, body.model, {}, "stop", _extras(piece))
                elif isinstance(piece, StreamFailure):
                    yield piece.event()
                else:
                    yield _chunk(cid, body.model, {"content": piece}, None)
            yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")
