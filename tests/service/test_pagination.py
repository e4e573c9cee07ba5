"""Issue 70, item 4: collections count in a tenant's quota (413 past it, shown in /v1/usage),
and every list is paged by a cursor with a bounded page size: walking the pages returns every
item that lived through the walk exactly once while items are added and deleted between pages
(before: one tenant made 3,000 collections and each list came back whole, 0.9 MB)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server

QUOTA = 40
Page = tuple[list[str], str | None]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    env = {"CONDUIT_MODEL": "builtin:tiny-qwen2-vl", "CONDUIT_OCR": "false",
           "CONDUIT_QUOTA_COLLECTIONS": str(QUOTA)}
    url, proc = start_server(tmp_path_factory.mktemp("pages-home"), env)
    with httpx.Client(base_url=url, timeout=120) as c:
        yield c
    stop_server(proc)


def _walk(get: Callable[[str | None], Page], between: Callable[[int], None]) -> list[str]:
    """Every id over the pages, calling `between(i)` after page i."""
    seen: list[str] = []
    cursor: str | None = None
    for i in range(100):
        ids, cursor = get(cursor)
        seen.extend(ids)
        if cursor is None:
            return seen
        between(i)
    raise AssertionError("the pages never ended")


def _collections(client: httpx.Client, limit: int) -> Callable[[str | None], Page]:
    def get(after: str | None) -> Page:
        r = client.get("/v1/collections", params={"limit": limit, **({"after": after}
                                                                      if after else {})})
        assert r.status_code == 200, r.text
        return [c["collection_id"] for c in r.json()], r.headers.get("x-next-cursor")
    return get


def _models(client: httpx.Client, limit: int) -> Callable[[str | None], Page]:
    def get(after: str | None) -> Page:
        body = client.get("/v1/models", params={"limit": limit, **({"after": after}
                                                                    if after else {})}).json()
        assert body["object"] == "list" and body["has_more"] == (body["next_cursor"] is not None)
        return [m["id"].removeprefix("conduit:") for m in body["data"]], body["next_cursor"]
    return get


def _churn(client: httpx.Client, made: list[str], gone: set[str], added: list[str]
           ) -> Callable[[int], None]:
    """Between pages: delete the newest surviving original and one early one, add one."""
    def between(i: int) -> None:
        for victim in (made[-1 - i], made[i]):
            if victim not in gone:
                assert client.delete(f"/v1/collections/{victim}").status_code == 204
                gone.add(victim)
        r = client.post("/v1/collections", json={"name": f"added-{len(added)}-{id(gone)}"})
        assert r.status_code == 201, r.text
        added.append(r.json()["collection_id"])
    return between


@pytest.mark.parametrize("listing", [_collections, _models])
def test_pages_hold_every_item_once_while_items_come_and_go(
        client: httpx.Client, listing: Callable[[httpx.Client, int], Callable[..., Page]]
) -> None:
    for c in client.get("/v1/collections", params={"limit": 1000}).json():
        client.delete(f"/v1/collections/{c['collection_id']}")
    made = [client.post("/v1/collections", json={"name": f"c{i}"}).json()["collection_id"]
            for i in range(17)]
    gone: set[str] = set()
    added: list[str] = []
    seen = _walk(listing(client, 4), _churn(client, made, gone, added))
    assert len(seen) == len(set(seen)), "an item came twice"
    survivors = [m for m in made if m not in gone]
    assert [s for s in seen if s in survivors] == survivors  # each once, oldest first
    assert set(seen) <= set(made) | set(added)


def test_a_collections_documents_are_paged(client: httpx.Client) -> None:
    col = client.post("/v1/collections", json={"name": "docs"}).json()["collection_id"]
    pdf = text_pdf(["A page."])

    def upload() -> str:
        r = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("a.pdf", pdf, "application/pdf")})
        assert r.status_code == 202, r.text
        return str(r.json()["document_id"])

    docs = [upload() for _ in range(7)]

    def get(after: str | None) -> Page:
        r = client.get(f"/v1/collections/{col}/documents",
                       params={"limit": 3, **({"after": after} if after else {})})
        return [d["document_id"] for d in r.json()], r.headers.get("x-next-cursor")

    gone: set[str] = set()

    def between(i: int) -> None:
        docs.append(upload())
        if client.delete(f"/v1/documents/{docs[1 + i]}").status_code == 204:
            gone.add(docs[1 + i])

    seen = _walk(get, between)
    assert len(seen) == len(set(seen))
    assert [d for d in seen if d in docs[:7] and d not in gone] == \
        [d for d in docs[:7] if d not in gone]


def test_a_bad_cursor_or_page_size_is_422(client: httpx.Client) -> None:
    assert client.get("/v1/collections", params={"after": "not-a-cursor"}).status_code == 422
    assert client.get("/v1/models", params={"limit": 1001}).status_code == 422
    assert client.get("/v1/collections", params={"limit": 0}).status_code == 422


def test_collections_past_the_quota_get_413(client: httpx.Client) -> None:
    for c in client.get("/v1/collections", params={"limit": 1000}).json():
        client.delete(f"/v1/collections/{c['collection_id']}")
    held = client.get("/v1/usage").json()["collections"]["used"]  # one holds documents
    made = [client.post("/v1/collections", json={"name": f"q{i}"}) for i in range(QUOTA - held)]
    assert all(r.status_code == 201 for r in made)
    over = client.post("/v1/collections", json={"name": "one-more"})
    assert over.status_code == 413 and f"quota of {QUOTA} collections" in over.text, over.text
    usage = client.get("/v1/usage").json()
    assert usage["collections"] == {"used": QUOTA, "limit": QUOTA}
    assert client.delete(f"/v1/collections/{made[0].json()['collection_id']}").status_code == 204
    assert client.post("/v1/collections", json={"name": "one-more"}).status_code == 201
