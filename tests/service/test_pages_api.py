"""The API the web page needs, over real HTTP: page list, page images (thumbnails, cache
headers, tenant checks), citation snippets and each answer's cache report."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image

from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

PAGES = [
    "Quarterly report. Revenue grew in the northern region thanks to new retail stores.",
    "Safety manual. The pressure valve must be inspected every fourteen days by a technician.",
    "Research notes. Photosynthesis converts sunlight, water and carbon dioxide into glucose.",
]
QUESTION = "How often must the pressure valve be inspected?"


@pytest.fixture(scope="module")
def document(client: httpx.Client) -> tuple[str, str]:
    col = client.post("/v1/collections", json={"name": "pages"}).json()["collection_id"]
    up = client.post(f"/v1/collections/{col}/documents",
                     files={"file": ("handbook.pdf", text_pdf(PAGES), "application/pdf")})
    assert up.status_code == 202, up.text
    assert wait_ready(client, up.json()["document_id"])["status"] == "ready"
    return col, up.json()["document_id"]


def _pages(cache: dict) -> dict:
    """Where the pages came from (the head cache's count checked apart; a question outside a
    conversation has no earlier turns)."""
    assert isinstance(cache["head_tokens"], int) and cache["head_tokens"] >= 0
    assert cache["conversation"] == ""
    return {k: v for k, v in cache.items() if k not in ("head_tokens", "conversation")}


def test_page_list_reports_text_ocr_and_kv_tiers(client: httpx.Client,
                                                 document: tuple[str, str]) -> None:
    _, doc = document
    r = client.get(f"/v1/documents/{doc}/pages")
    assert r.status_code == 200, r.text
    pages = r.json()
    assert [p["number"] for p in pages] == [1, 2, 3]
    for page, text in zip(pages, PAGES, strict=True):
        assert page["kv_cached"] is True and page["kv_tiers"] == ["memory", "disk"]
        assert page["ocr"] is False
        assert abs(page["text_chars"] - len(text)) <= 2  # the text layer, line breaks aside
        assert page["width"] > 0 and page["height"] > page["width"]  # A4 portrait
    assert client.get("/v1/documents/doc_nope/pages").status_code == 404


def test_page_image_full_thumbnail_etag_and_errors(client: httpx.Client,
                                                   document: tuple[str, str]) -> None:
    _, doc = document
    page = client.get(f"/v1/documents/{doc}/pages").json()[1]
    full = client.get(f"/v1/documents/{doc}/pages/2/image")
    assert full.status_code == 200 and full.headers["content-type"] == "image/webp"
    assert Image.open(io.BytesIO(full.content)).size == (page["width"], page["height"])
    assert "max-age" in full.headers["cache-control"]
    assert "private" in full.headers["cache-control"]

    thumb = client.get(f"/v1/documents/{doc}/pages/2/image", params={"width": 120})
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/png"
    img = Image.open(io.BytesIO(thumb.content))
    assert img.width == 120 and abs(img.height - 120 * page["height"] / page["width"]) <= 1
    assert thumb.headers["etag"] != full.headers["etag"]
    again = client.get(f"/v1/documents/{doc}/pages/2/image", params={"width": 120},
                       headers={"If-None-Match": thumb.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    # wider than the page: the page itself, never upscaled
    wide = client.get(f"/v1/documents/{doc}/pages/2/image", params={"width": 4000})
    assert wide.content == full.content

    missing = client.get(f"/v1/documents/{doc}/pages/9/image")
    assert missing.status_code == 404 and "no page 9" in missing.json()["detail"]
    assert client.get(f"/v1/documents/{doc}/pages/2/image",
                      params={"width": 3}).status_code == 422
    assert client.get("/v1/documents/doc_nope/pages/1/image").status_code == 404


def test_citations_carry_snippets_and_answers_their_cache_story(
        client: httpx.Client, document: tuple[str, str]) -> None:
    col, _ = document
    r = client.post("/v1/query", json={"collection_id": col, "question": QUESTION,
                                       "top_k": 2, "max_new_tokens": 4})
    assert r.status_code == 200, r.text
    out = r.json()
    top = out["citations"][0]
    assert top["page"] == 2
    snip = top["snippet"]
    assert "valve must be inspected every fourteen days" in snip["text"]
    marked = [snip["text"][s:e].lower() for s, e in snip["spans"]]
    assert {"pressure", "valve", "inspected"} <= set(marked)
    assert "the" not in marked and "be" not in marked  # stop words, as BM25 drops them
    # prefilled at ingestion, so every page is read from the memory tier
    assert _pages(out["cache"]) == {"pages_from": {"memory": 2, "disk": 0},
                                    "pages_prefilled_now": 0}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with API keys, no memory tier and no prefill at ingestion."""
    home = tmp_path_factory.mktemp("pages-keyed")
    url, proc = start_server(home, {"CONDUIT_API_KEYS": json.dumps(["alpha-key", "beta-key"]),
                                    "CONDUIT_MEMORY_KV_BYTES": "0",
                                    "CONDUIT_PREFILL_ON_INGEST": "false"})
    yield url
    stop_server(proc)


def test_tenant_checks_and_cache_story_from_disk(keyed: str) -> None:
    alpha = httpx.Client(base_url=keyed, timeout=300,
                         headers={"Authorization": "Bearer alpha-key"})
    beta = httpx.Client(base_url=keyed, timeout=300, headers={"Authorization": "Bearer beta-key"})
    col = alpha.post("/v1/collections", json={"name": "mine"}).json()["collection_id"]
    up = alpha.post(f"/v1/collections/{col}/documents",
                    files={"file": ("h.pdf", text_pdf(PAGES), "application/pdf")}).json()
    assert wait_ready(alpha, up["document_id"])["status"] == "ready"
    doc = up["document_id"]
    assert [p["kv_tiers"] for p in alpha.get(f"/v1/documents/{doc}/pages").json()] == [[]] * 3
    for path in (f"/v1/documents/{doc}/pages", f"/v1/documents/{doc}/pages/1/image"):
        assert alpha.get(path).status_code == 200
        other = beta.get(path)
        assert other.status_code == 404 and "not found" in other.json()["detail"]
        assert httpx.get(keyed + path).status_code == 401

    body = {"collection_id": col, "question": QUESTION, "top_k": 2, "max_new_tokens": 2}
    first = alpha.post("/v1/query", json=body).json()
    assert _pages(first["cache"]) == {"pages_from": {"disk": 0}, "pages_prefilled_now": 2}
    second = alpha.post("/v1/query", json=body).json()
    assert _pages(second["cache"]) == {"pages_from": {"disk": 2}, "pages_prefilled_now": 0}
    tiers = [p["kv_tiers"] for p in alpha.get(f"/v1/documents/{doc}/pages").json()]
    assert sorted(tiers) == [[], ["disk"], ["disk"]]
