"""OpenAI chat reads the whole conversation (issue 66 point 4): the official `openai` client
sends three turns back as front-ends do; the third answer's prompt holds the first two (their
KV kept: a hit), its retrieval finds the page only an earlier turn named, and content sent as
an array of text parts answers as the same string. An image part is a 422 that says so.

Before: the last user message was answered alone (earlier turns went unread) and an array
`content` was a 422 from validation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

PAGES = ["Harbour board minutes. The dredging contract went to Kessel and Sons.",
         "Wind farm log. The gearbox of turbine seven was replaced in March.",
         "Bakery accounts. Flour costs rose by nine percent over the year."]
Q1 = "Who won the dredging contract?"
Q2 = "What happened to the gearbox of turbine seven?"
Q3 = "Say more about it."  # names nothing: only turn 2 tells which page it means


@dataclass(frozen=True)
class Chat:
    url: str
    client: openai.OpenAI
    model: str


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chat]:
    home = tmp_path_factory.mktemp("openai-conversation")
    url, proc = start_server(home, {"CONDUIT_OCR": "false",
                                    "CONDUIT_CONVERSATION_MAX_TURNS": "2"})
    try:
        raw = httpx.Client(base_url=url, timeout=300)
        col = raw.post("/v1/collections", json={"name": "logs"}).json()["collection_id"]
        up = raw.post(f"/v1/collections/{col}/documents",
                      files={"file": ("logs.pdf", text_pdf(PAGES), "application/pdf")})
        assert up.status_code == 202, up.text
        assert wait_ready(raw, up.json()["document_id"])["status"] == "ready"
        client = openai.OpenAI(api_key="none", base_url=f"{url}/v1", max_retries=0,
                               timeout=300)
        yield Chat(url, client, f"conduit:{col}")
    finally:
        stop_server(proc)


def _ask(chat: Chat, messages: list[dict[str, Any]]) -> Any:
    return chat.client.chat.completions.create(
        model=chat.model, messages=messages,  # type: ignore[arg-type]
        max_tokens=8, extra_body={"top_k": 1})


def _pages(reply: Any) -> list[int]:
    return [c["page"] for c in reply.model_extra["citations"]]


def test_three_turns_read_the_conversation(chat: Chat) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": Q1}]
    first = _ask(chat, messages)
    assert _pages(first) == [1]
    assert first.model_extra["conduit"]["conversation"] == ""
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": Q2}]
    second = _ask(chat, messages)
    assert _pages(second) == [2]
    messages += [{"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": Q3}]
    third = _ask(chat, messages)
    # the page only turn 2 named, found by reading the conversation
    assert _pages(third) == [2]
    # the first two turns are the third's prefix: their KV was kept, and its prompt holds them
    assert (second.model_extra["conduit"]["conversation"],
            third.model_extra["conduit"]["conversation"]) == ("hit", "hit")
    assert third.usage.prompt_tokens > (second.usage.prompt_tokens
                                        + second.usage.completion_tokens)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens


def test_the_last_question_alone_is_not_the_conversation(chat: Chat) -> None:
    alone = _ask(chat, [{"role": "user", "content": Q3}])
    assert alone.model_extra["conduit"]["conversation"] == ""
    assert alone.usage.prompt_tokens < 2 * len(PAGES) * 10 ** 3


def test_array_content_answers_like_the_string(chat: Chat) -> None:
    as_string = _ask(chat, [{"role": "user", "content": "Who won the dredging\ncontract?"}])
    as_parts = _ask(chat, [{"role": "user", "content": [
        {"type": "text", "text": "Who won the dredging"}, {"type": "text", "text": "contract?"}]}])
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    assert as_parts.model_extra["citations"] == as_string.model_extra["citations"]
    assert as_parts.usage.prompt_tokens == as_string.usage.prompt_tokens


def test_an_image_part_is_refused_with_a_message(chat: Chat) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        _ask(chat, [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    detail = refused.value.response.text
    assert "image_url" in detail and "text parts only" in detail, detail


def test_the_oldest_turns_go_past_the_bound_and_the_answer_says_so(chat: Chat) -> None:
    """Three earlier turns under CONDUIT_CONVERSATION_MAX_TURNS=2: the oldest is dropped."""
    messages: list[dict[str, Any]] = []
    for question, answer in ((Q1, "Kessel and Sons."), (Q2, "It was replaced."),
                             ("When was it replaced?", "In March.")):
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": Q3})
    reply = _ask(chat, messages)
    assert reply.model_extra["conduit"]["dropped_turns"] == 1
    kept = _ask(chat, messages[2:])  # the same conversation without its oldest turn
    assert kept.model_extra["conduit"]["dropped_turns"] == 0
    assert kept.usage.prompt_tokens == reply.usage.prompt_tokens
    assert kept.choices[0].message.content == reply.choices[0].message.content
