"""`/v1/conversations` over real HTTP (issue 66 point 4 and 5): a tenant's conversation asked
turn by turn (JSON and SSE) reads its earlier turns and reuses their KV; it is listed, read
back with its citations and counted in `/v1/usage`; another tenant can neither read, extend
nor delete it (the same 404 as an unknown id); limits are 4xx with a message; a document
deleted mid-conversation is never cited again; two messages posted at once to one
conversation never both read the same history.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

HARBOUR = ["Harbour board minutes. The dredging contract went to Kessel and Sons."]
LOGS = ["Wind farm log. The gearbox of turbine seven was replaced in March.",
        "Bakery accounts. Flour costs rose by nine percent over the year."]


@dataclass(frozen=True)
class Api:
    alpha: httpx.Client
    beta: httpx.Client
    collection: str
    harbour: str  # the harbour document's id


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    home = tmp_path_factory.mktemp("conversations")
    url, proc = start_server(home, {"CONDUIT_API_KEYS": json.dumps(["alpha-key", "beta-key"]),
                                    "CONDUIT_OCR": "false",
                                    "CONDUIT_CONVERSATION_MAX_STORED": "3",
                                    "CONDUIT_CONVERSATION_TURN_LIMIT": "3"})
    try:
        alpha = httpx.Client(base_url=url, timeout=300,
                             headers={"Authorization": "Bearer alpha-key"})
        beta = httpx.Client(base_url=url, timeout=300,
                            headers={"Authorization": "Bearer beta-key"})
        col = alpha.post("/v1/collections", json={"name": "port"}).json()["collection_id"]
        ids = []
        for name, pages in (("harbour.pdf", HARBOUR), ("logs.pdf", LOGS)):
            up = alpha.post(f"/v1/collections/{col}/documents",
                            files={"file": (name, text_pdf(pages), "application/pdf")})
            assert up.status_code == 202, up.text
            ids.append(up.json()["document_id"])
        for doc in ids:
            assert wait_ready(alpha, doc)["status"] == "ready"
        yield Api(alpha, beta, col, ids[0])
    finally:
        stop_server(proc)


def _ask(client: httpx.Client, conv: str, question: str) -> httpx.Response:
    return client.post(f"/v1/conversations/{conv}/messages",
                       json={"question": question, "top_k": 1, "max_new_tokens": 6})


def _cited(reply: dict[str, object]) -> list[str]:
    return [c["filename"] for c in reply["citations"]]  # type: ignore[attr-defined]


def test_a_conversation_in_turns(api: Api) -> None:
    made = api.alpha.post("/v1/conversations",
                          json={"collection_id": api.collection, "title": "turbines"})
    assert made.status_code == 201, made.text
    conv = made.json()["conversation_id"]
    first = _ask(api.alpha, conv, "What happened to the gearbox of turbine seven?")
    assert first.status_code == 200, first.text
    assert first.json()["cache"]["conversation"] == ""
    second = _ask(api.alpha, conv, "Say more about it.")
    assert second.json()["cache"]["conversation"] == "hit"
    assert _cited(second.json()) == ["logs.pdf"]  # the page turn 1 named
    # the third turn as server-sent events: tokens, then the answer with the turn kept
    with api.alpha.stream("POST", f"/v1/conversations/{conv}/messages/stream",
                          json={"question": "When?", "max_new_tokens": 4}) as events:
        body = "".join(events.iter_text())
    assert "event: token" in body
    done = json.loads(body.split("event: done\ndata: ")[1].split("\n")[0])
    assert done["cache"]["conversation"] == "hit"
    read = api.alpha.get(f"/v1/conversations/{conv}").json()
    assert [t["question"] for t in read["turns"]] == [
        "What happened to the gearbox of turbine seven?", "Say more about it.", "When?"]
    assert read["turns"][1]["citations"][0]["filename"] == "logs.pdf"
    assert read["turns"][2]["details"]["cache"]["conversation"] == "hit"
    listed = api.alpha.get("/v1/conversations").json()
    assert listed[0]["conversation_id"] == conv and listed[0]["turns"] is None
    # the turn limit (3): a 409 that says what to do
    full = _ask(api.alpha, conv, "And then?")
    assert full.status_code == 409 and "new conversation" in full.json()["detail"]


def test_another_tenant_cannot_read_extend_or_delete(api: Api) -> None:
    conv = api.alpha.post("/v1/conversations",
                          json={"collection_id": api.collection}).json()["conversation_id"]
    unknown = "conv_00000000000000000000"
    for path in (conv, unknown):
        got = api.beta.get(f"/v1/conversations/{path}")
        asked = _ask(api.beta, path, "What is on the page?")
        gone = api.beta.delete(f"/v1/conversations/{path}")
        assert (got.status_code, asked.status_code, gone.status_code) == (404, 404, 404)
        assert got.json()["detail"] == f"conversation {path} not found"
    assert api.beta.get("/v1/conversations").json() == []
    assert api.alpha.get(f"/v1/conversations/{conv}").status_code == 200
    # nor start one over a collection it cannot see
    other = api.beta.post("/v1/conversations", json={"collection_id": api.collection})
    assert other.status_code == 404
    assert api.alpha.delete(f"/v1/conversations/{conv}").status_code == 204
    assert api.alpha.get(f"/v1/conversations/{conv}").status_code == 404


def test_stored_conversations_are_bounded_and_counted(api: Api) -> None:
    used = api.alpha.get("/v1/usage").json()["conversations"]
    assert used["limit"] == 3
    made = [api.alpha.post("/v1/conversations", json={"collection_id": api.collection})
            for _ in range(3 - used["used"])]
    assert all(m.status_code == 201 for m in made)
    assert api.alpha.get("/v1/usage").json()["conversations"] == {"used": 3, "limit": 3}
    over = api.alpha.post("/v1/conversations", json={"collection_id": api.collection})
    assert over.status_code == 413 and "3 conversations" in over.json()["detail"]
    for m in made:
        api.alpha.delete(f"/v1/conversations/{m.json()['conversation_id']}")


def test_a_deleted_document_leaves_later_turns(api: Api) -> None:
    conv = api.alpha.post("/v1/conversations",
                          json={"collection_id": api.collection}).json()["conversation_id"]
    first = _ask(api.alpha, conv, "Who won the dredging contract?").json()
    assert _cited(first) == ["harbour.pdf"]
    assert api.alpha.delete(f"/v1/documents/{api.harbour}").status_code in (200, 202, 204)
    later = _ask(api.alpha, conv, "Who won the dredging contract?").json()
    assert "harbour.pdf" not in _cited(later)
    # its pages left the conversation: the earlier turn was reassembled without them
    assert later["cache"]["conversation"] == "rebuilt"
    api.alpha.delete(f"/v1/conversations/{conv}")


def test_two_messages_at_once_are_one_turn_at_a_time(api: Api) -> None:
    conv = api.alpha.post("/v1/conversations",
                          json={"collection_id": api.collection}).json()["conversation_id"]
    start = threading.Barrier(2)
    replies: list[httpx.Response] = []

    def post(question: str) -> None:
        start.wait()
        replies.append(api.alpha.post(f"/v1/conversations/{conv}/messages", json={
            "question": question, "top_k": 1, "max_new_tokens": 48}))

    posts = [threading.Thread(target=post, args=(q,)) for q in (
        "What happened to the gearbox of turbine seven?", "Who replaced the gearbox?")]
    for p in posts:
        p.start()
    for p in posts:
        p.join()
    answered = [r.json() for r in replies if r.status_code == 200]
    busy = [r for r in replies if r.status_code != 200]
    assert all(r.status_code == 409 and "answering another message" in r.json()["detail"]
               for r in busy)
    # the second to answer read the first's turn (a first turn has no conversation cache)
    assert sorted(a["cache"]["conversation"] for a in answered) == ["", "hit"][:len(answered)]
    turns = api.alpha.get(f"/v1/conversations/{conv}").json()["turns"]
    assert len(turns) == len(answered)
    again = _ask(api.alpha, conv, "Say more about it.")  # the claim was released
    assert again.status_code == 200 and again.json()["cache"]["conversation"] == "hit"
    api.alpha.delete(f"/v1/conversations/{conv}")
