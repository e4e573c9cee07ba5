"""The official `openai` Python client against a real `conduit serve` (issue 26 point 8, issue
30 point 3): it lists the caller's collections as models, chats and streams with token usage,
and an oversized message is a 422.

Before: `GET /v1/models` was a 404 (chat front-ends list models first), `usage` held nulls and
no usage chunk was streamed, and a message over 4,000 characters was a 500 (the `QueryIn` built
inside the handler raised a validation error nobody caught).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

PAGES = ["Harbour board minutes. The dredging contract went to Kessel and Sons.",
         "Wind farm log. The gearbox of turbine seven was replaced in March."]
QUESTION = "Who won the dredging contract?"


@dataclass(frozen=True)
class World:
    """A server with two tenants: A owns two collections (one with a document), B one."""

    url: str
    alpha: openai.OpenAI
    beta: openai.OpenAI
    collection: str  # A's, with a ready document
    empty: str  # A's, empty
    beta_collection: str


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{url}/v1", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("openai-client")
    url, proc = start_server(home, {"CONDUIT_API_KEYS": json.dumps(["alpha-key", "beta-key"]),
                                    "CONDUIT_OCR": "false"})
    try:
        raw = httpx.Client(base_url=url, timeout=300,
                           headers={"Authorization": "Bearer alpha-key"})
        col = raw.post("/v1/collections", json={"name": "minutes"}).json()["collection_id"]
        empty = raw.post("/v1/collections", json={"name": "empty"}).json()["collection_id"]
        up = raw.post(f"/v1/collections/{col}/documents",
                      files={"file": ("minutes.pdf", text_pdf(PAGES), "application/pdf")})
        assert up.status_code == 202, up.text
        assert wait_ready(raw, up.json()["document_id"])["status"] == "ready"
        beta_col = httpx.post(f"{url}/v1/collections", json={"name": "mine"},
                              headers={"Authorization": "Bearer beta-key"}
                              ).json()["collection_id"]
        yield World(url, _client(url, "alpha-key"), _client(url, "beta-key"), col, empty,
                    beta_col)
    finally:
        stop_server(proc)


def test_models_are_the_callers_collections(world: World) -> None:
    alpha = world.alpha.models.list()
    assert [m.id for m in alpha.data] == [f"conduit:{world.collection}",
                                          f"conduit:{world.empty}"]
    assert all(m.object == "model" and m.owned_by == "conduit" and m.created > 0
               for m in alpha.data)
    assert [m.model_extra and m.model_extra["name"] for m in alpha.data] == ["minutes", "empty"]
    assert [m.id for m in world.beta.models.list().data] == [f"conduit:{world.beta_collection}"]
    one = world.alpha.models.retrieve(f"conduit:{world.collection}")
    assert one.id == f"conduit:{world.collection}"
    with pytest.raises(openai.NotFoundError):
        world.beta.models.retrieve(f"conduit:{world.collection}")


def test_another_tenants_model_gets_the_reply_a_made_up_one_gets(world: World) -> None:
    headers = {"Authorization": "Bearer beta-key"}
    theirs = httpx.get(f"{world.url}/v1/models/conduit:{world.collection}", headers=headers)
    made_up = httpx.get(f"{world.url}/v1/models/conduit:col_{'0' * 20}", headers=headers)
    assert theirs.status_code == made_up.status_code == 404
    assert (theirs.text.replace(world.collection, "<ID>")
            == made_up.text.replace(f"col_{'0' * 20}", "<ID>"))
    for name in ("gpt-4", "conduit:", "x" * 128):
        assert httpx.get(f"{world.url}/v1/models/{name}", headers=headers).status_code == 404
    assert httpx.get(f"{world.url}/v1/models/{'x' * 129}", headers=headers).status_code == 422
    assert httpx.get(f"{world.url}/v1/models").status_code == 401


def _ask(world: World, **kwargs: object) -> object:
    return world.alpha.chat.completions.create(
        model=f"conduit:{world.collection}", max_tokens=6, temperature=0,
        messages=[{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": QUESTION}], **kwargs)  # type: ignore[call-overload]


def test_chat_reports_usage_and_streams_it_last_when_asked(world: World) -> None:
    reply = _ask(world)
    assert isinstance(reply, openai.types.chat.ChatCompletion)
    usage = reply.usage
    assert usage is not None
    extra = reply.model_extra or {}
    # the prompt the model saw: the retrieved pages' visual tokens, the question and the rest
    assert usage.prompt_tokens > extra["conduit"]["visual_tokens"] > 0
    assert 1 <= usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert reply.choices[0].message.content

    chunks = list(_ask(world, stream=True, stream_options={"include_usage": True}))  # type: ignore[call-overload]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.model_dump() == usage.model_dump()  # the same answer, the same count
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == reply.choices[0].message.content
    # "length" exactly when the answer used all of max_tokens (6); the stream ends the same way
    finish = reply.choices[0].finish_reason
    assert finish == ("length" if usage.completion_tokens == 6 else "stop")
    assert chunks[-2].choices[0].finish_reason == finish

    plain = list(_ask(world, stream=True))  # type: ignore[call-overload]
    assert all(c.choices and c.usage is None for c in plain)  # no usage unless asked for


@pytest.mark.parametrize("chars", [4001, 1_000_000])
def test_an_oversized_question_is_a_422(world: World, chars: int) -> None:
    with pytest.raises(openai.UnprocessableEntityError):
        world.alpha.chat.completions.create(
            model=f"conduit:{world.collection}", max_tokens=4,
            messages=[{"role": "user", "content": "a" * chars}])
    r = httpx.post(f"{world.url}/v1/chat/completions",
                   headers={"Authorization": "Bearer alpha-key"},
                   json={"model": f"conduit:{world.collection}", "stream": True,
                         "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "a" * chars}]})
    assert r.status_code == 422 and r.headers["content-type"] == "application/json"
    assert r.json()["detail"][0]["loc"] == ["body", "messages", 1, "content"]


def test_every_invalid_chat_request_is_a_422(world: World) -> None:
    headers = {"Authorization": "Bearer alpha-key"}
    message = {"role": "user", "content": QUESTION}
    model = f"conduit:{world.collection}"
    for body in ({"model": model, "messages": [message] * 257},
                 {"model": model, "messages": [{"role": "system", "content": "a" * 32_769},
                                               message]},
                 {"model": model, "messages": []},
                 {"model": "conduit:" + "x" * 65, "messages": [message]},
                 {"model": "conduit:not/an id", "messages": [message]},
                 {"model": model, "messages": [message], "max_completion_tokens": 0},
                 {"model": model, "messages": [{"role": "tool", "content": "x"}]},
                 {"model": model, "messages": [message], "stream_options": {"include_usage": 3}},
                 {"model": "gpt-4", "messages": [message]}):
        r = httpx.post(f"{world.url}/v1/chat/completions", headers=headers, json=body)
        assert r.status_code == 422, (body, r.text)
