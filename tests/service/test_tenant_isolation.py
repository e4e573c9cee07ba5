"""Another tenant's id gets exactly the reply a made-up id gets, on every endpoint (issue 30,
point 2), over real HTTP with two tenants' API keys.

Before, `GET /v1/documents/{A's doc}` with B's key answered `collection col_... not found`,
naming A's collection, where a made-up id answered `document ... not found`; the same on the
document's pages, page image, DELETE and its job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from storage.metadata import new_id
from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

PAGES = ["Harbour board minutes. The dredging contract went to Kessel.",
         "Wind farm log. Turbine 7 gearbox replaced in March."]
# headers that differ between any two replies
VOLATILE = {"date"}


@dataclass(frozen=True)
class World:
    """Tenant A's collection, document and job; clients for A and B; B's own collection."""

    alpha: httpx.Client
    beta: httpx.Client
    collection: str
    document: str
    job: str
    beta_collection: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("tenants")
    url, proc = start_server(home, {"CONDUIT_API_KEYS": json.dumps(["alpha-key", "beta-key"]),
                                    "CONDUIT_OCR": "false"})
    alpha = httpx.Client(base_url=url, timeout=300, headers={"Authorization": "Bearer alpha-key"})
    beta = httpx.Client(base_url=url, timeout=300, headers={"Authorization": "Bearer beta-key"})
    col = alpha.post("/v1/collections", json={"name": "minutes"}).json()["collection_id"]
    up = alpha.post(f"/v1/collections/{col}/documents",
                    files={"file": ("minutes.pdf", text_pdf(PAGES), "application/pdf")})
    assert up.status_code == 202, up.text
    assert wait_ready(alpha, up.json()["document_id"])["status"] == "ready"
    own = beta.post("/v1/collections", json={"name": "mine"}).json()["collection_id"]
    yield World(alpha, beta, col, up.json()["document_id"], up.json()["job_id"], own)
    stop_server(proc)


def _reply(r: httpx.Response, real_id: str) -> tuple[int, str, list[tuple[str, str]]]:
    """Status, body and headers, with the id the caller sent replaced by a placeholder."""
    headers = sorted((k, v) for k, v in r.headers.items() if k not in VOLATILE)
    return r.status_code, r.text.replace(real_id, "<ID>"), headers


def _same(call: object, real: str, prefix: str) -> str:
    """Call with another tenant's id and with a made-up one of the same form; both replies
    must be identical but for the id itself. Returns the reply body."""
    assert callable(call)
    fake = new_id(prefix)
    assert len(fake) == len(real)
    theirs, made_up = call(real), call(fake)
    assert theirs.status_code in (404, 422), theirs.text
    assert _reply(theirs, real) == _reply(made_up, fake), (theirs.text, made_up.text)
    body: str = theirs.text
    return body


def test_document_pages_image_delete_and_job_probes_match_a_made_up_id(world: World) -> None:
    b = world.beta
    for path in ("/v1/documents/{}", "/v1/documents/{}/pages",
                 "/v1/documents/{}/pages/1/image", "/v1/documents/{}/pages/1/image?width=120"):
        body = _same(lambda i, p=path: b.get(p.format(i)), world.document, "doc")
        assert world.collection not in body and "document" in body, body
    body = _same(lambda i: b.delete(f"/v1/documents/{i}"), world.document, "doc")
    assert world.collection not in body
    body = _same(lambda i: b.get(f"/v1/jobs/{i}"), world.job, "job")
    assert world.collection not in body and world.document not in body
    # nothing of A's was touched, and A still sees it all
    a = world.alpha
    assert a.get(f"/v1/documents/{world.document}").json()["status"] == "ready"
    assert a.get(f"/v1/documents/{world.document}/pages/1/image").status_code == 200
    assert a.get(f"/v1/jobs/{world.job}").json()["status"] == "succeeded"


def test_collection_probes_match_a_made_up_id(world: World) -> None:
    b = world.beta
    pdf = text_pdf(["x"])
    calls = [
        lambda i: b.get(f"/v1/collections/{i}"),
        lambda i: b.get(f"/v1/collections/{i}/documents"),
        lambda i: b.delete(f"/v1/collections/{i}"),
        lambda i: b.post(f"/v1/collections/{i}/documents",
                         files={"file": ("x.pdf", pdf, "application/pdf")}),
        lambda i: b.post("/v1/query", json={"collection_id": i, "question": "turbine?"}),
        lambda i: b.post("/v1/query/stream", json={"collection_id": i, "question": "turbine?"}),
    ]
    for call in calls:
        _same(call, world.collection, "col")
    assert world.alpha.get(f"/v1/collections/{world.collection}").status_code == 200


def test_query_scopes_and_chat_probes_match_a_made_up_id(world: World) -> None:
    b, own = world.beta, world.beta_collection
    for path in ("/v1/query", "/v1/query/stream"):
        body = _same(lambda i, p=path: b.post(p, json={
            "collection_id": own, "question": "turbine?", "document_ids": [i]}),
            world.document, "doc")
        assert "not found" in body and world.collection not in body
    _same(lambda i: b.get(f"/v1/models/conduit:{i}"), world.collection, "col")
    message = [{"role": "user", "content": "Which turbine?"}]
    for stream in (False, True):
        _same(lambda i, s=stream: b.post("/v1/chat/completions", json={
            "model": f"conduit:{i}", "messages": message, "stream": s}), world.collection, "col")
        _same(lambda i, s=stream: b.post("/v1/chat/completions", json={
            "model": "conduit", "collection_id": i, "messages": message, "stream": s}),
            world.collection, "col")
