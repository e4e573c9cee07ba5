"""Hostile requests, second pass (issue 30, points 3 and 6): no endpoint answers 500, whatever
its path, query, headers or body hold, and every reply is valid UTF-8; a real PDF whose MuPDF
message carries undecodable bytes leaves its document and its collection's listing readable.

The endpoints come from the service's own OpenAPI document, so a new one is swept too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pymupdf
import pytest

from tests.faults.conftest import settled, start_serve

KEY = {"Authorization": "Bearer acme-key"}
MADE_UP_COL = "col_00000000000000000000"
MIB = 1 << 20


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("hostile-api")
    base, proc = start_serve(home, {"CONDUIT_API_KEYS": json.dumps(["acme-key", "globex-key"]),
                                    "CONDUIT_OCR": "false"})
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def _check(r: httpx.Response, what: object) -> None:
    """Never a 5xx; the body, if any, is valid UTF-8 (JSON where it says so)."""
    assert r.status_code < 500, (what, r.status_code, r.text[:500])
    text = r.content.decode("utf-8")  # strict: raises on invalid UTF-8
    if r.headers.get("content-type", "").startswith("application/json") and text:
        json.loads(text)


# a base body per JSON endpoint; every leaf is then replaced by each hostile value
BODIES: dict[str, dict[str, Any]] = {
    "/v1/collections": {"name": "n", "shared": False},
    "/v1/query": {"collection_id": MADE_UP_COL, "question": "q", "top_k": 1,
                  "document_ids": ["doc_x"], "policy": "conduit", "budget": 0.1,
                  "score_layers": [0, 2], "gamma": 1.0, "query_window": 4, "head_agg": "mean"},
    "/v1/chat/completions": {"model": f"conduit:{MADE_UP_COL}", "max_tokens": 4,
                             "messages": [{"role": "user", "content": "q"}]},
}
BODIES["/v1/query/stream"] = BODIES["/v1/query"]
HOSTILE_VALUES: list[Any] = [
    None, True, -1, 0, 10**30, 1.5e308, "", "x" * 4001, "x" * 200_000, "a\udcc6b\ud800",
    "\x00", "../../etc/passwd", [], ["doc_x"] * 5000, {"a": {"b": []}}, [[[]]],
]
RAW_BODIES: list[bytes] = [
    b"", b"null", b"[]", b"0", b'"x"', b'{"a":', b"\xff\xfe\x00", b'{"name": "\xc6\xff"}',
    b"[" * 50_000, b'{"a": 1e999999}', b'{"top_k": ' + b"9" * 5000 + b"}",
    b'{"question": "\\udcc6", "collection_id": "\\ud800"}',
]


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        yield from _leaves(value[0], (*path, 0))
    else:
        yield path


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


def _operations(client: httpx.Client) -> list[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    return [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]


PATH_VALUES = ["x" * 5000, "%00", "..", "%ED%A0%80", "a%2Fb", "%FF%FE", "-1", "0",
               "9" * 40, "doc_00000000000000000000", "%F0%9F%98%80"]


def test_no_endpoint_answers_500(url: str) -> None:
    client = httpx.Client(base_url=url, timeout=120, headers=KEY)
    operations = _operations(client)
    assert len(operations) >= 14, operations
    sent = 0
    for method, template in operations:
        names = re.findall(r"{(\w+)}", template)
        for value in PATH_VALUES:  # each path parameter hostile, the others made up
            path = template
            for name in names:
                path = path.replace("{" + name + "}", value if name == names[-1] else "1")
            if names:
                _check(client.request(method, path), (method, path))
                sent += 1
        if method != "POST":
            continue
        concrete = re.sub(r"{\w+}", "col_00000000000000000000", template)
        for raw in RAW_BODIES:
            _check(client.post(concrete, content=raw,
                               headers={"Content-Type": "application/json"}), (concrete, raw[:40]))
            sent += 1
        base = BODIES.get(template)
        for leaf in [] if base is None else list(_leaves(base)):
            for hostile in HOSTILE_VALUES:
                body = json.dumps(_replaced(base, leaf, hostile)).encode()  # ASCII: \\udcc6
                r = client.post(concrete, content=body,
                                headers={"Content-Type": "application/json"})
                _check(r, (concrete, leaf, repr(hostile)[:40]))
                sent += 1
    assert sent > 500
    # a 4,001-character and a 1 MB chat message, and a question past the bound: 422
    for content in ("q" * 4001, "q" * 1_000_000):
        r = client.post("/v1/chat/completions", json={
            "model": f"conduit:{MADE_UP_COL}", "messages": [{"role": "user", "content": content}]})
        assert r.status_code == 422, r.text[:300]
    r = client.post("/v1/query", json={"collection_id": MADE_UP_COL, "question": "q" * 4001})
    assert r.status_code == 422 and "question" in r.text
    assert client.get("/healthz").status_code == 200


def test_hostile_queries_headers_and_forms(url: str) -> None:
    client = httpx.Client(base_url=url, timeout=120, headers=KEY)
    image = "/v1/documents/doc_00000000000000000000/pages/1/image"
    for width in ("-1", "abc", "9" * 40, "1e3", "", "64&width=128"):
        _check(client.get(f"{image}?width={width}"), width)
    _check(client.get(image, headers={"If-None-Match": "x" * 8000}), "etag")
    for auth in (b"Bearer \xff\xfe", b"Bearer " + b"k" * 8000, b"Bearer", b"Basic \xc6"):
        r = client.get("/v1/collections", headers={b"Authorization": auth})
        assert r.status_code == 401, auth
    col = client.post("/v1/collections", json={"name": "forms"}).json()["collection_id"]
    upload = f"/v1/collections/{col}/documents"
    _check(client.post(upload, data={"password": "p" * 2000},
                       files={"file": ("a.pdf", b"%PDF-1.7\n", "application/pdf")}), "password")
    _check(client.post(upload, content=b"--b\r\n\xff\xfe\r\n--b--\r\n",
                       headers={"Content-Type": "multipart/form-data; boundary=b"}), "form")
    _check(client.post(upload, files={"nofile": ("a", b"x")}), "no file")


def _damaged_page_pdf(pages: int = 2) -> bytes:
    """`pages` pages; the last one's content stream holds an unknown keyword with the bytes
    0x19 0xC6, so it draws blank, has no text, and MuPDF's message for it ("syntax error:
    unknown keyword: '0\\x19\\xc6T'") reaches Python with a lone surrogate (U+DCC6), as the
    fuzzed pdf.js file poppler-90-0-fuzzed.pdf does."""
    doc = pymupdf.open()
    for _ in range(pages):
        doc.new_page(width=595, height=842).insert_text((72, 72), "Harbour board minutes.")
    data = doc.tobytes()
    doc.close()
    doc = pymupdf.open("pdf", data)
    doc.update_stream(doc[-1].get_contents()[0], b"0\x19\xc6T BT /F1 12 Tf ET")
    out: bytes = doc.tobytes()
    doc.close()
    return out


def test_a_mupdf_message_with_undecodable_bytes_leaves_everything_readable(url: str) -> None:
    client = httpx.Client(base_url=url, timeout=300, headers=KEY)
    col = client.post("/v1/collections", json={"name": "fuzzed"}).json()["collection_id"]
    pdf = _damaged_page_pdf()
    multipart = (b'--b\r\nContent-Disposition: form-data; name="file"; '
                 b'filename="fuzz\xc6\xff\xed\xa0\x80.pdf"\r\nContent-Type: application/pdf\r\n\r\n'
                 + pdf + b"\r\n--b--\r\n")
    up = client.post(f"/v1/collections/{col}/documents", content=multipart,
                     headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert up.status_code == 202, up.text
    doc = settled(client, up.json()["document_id"], timeout=600)
    assert doc["status"] == "ready", doc
    (skipped,) = doc["skipped_pages"]
    assert skipped["page"] == 2 and "unknown keyword" in skipped["reason"], skipped
    assert "\\xc6" in skipped["reason"]  # the undecodable byte, readable
    r = client.get(f"/v1/documents/{doc['document_id']}")
    assert r.status_code == 200 and r.json() == doc
    _check(r, "document")
    listing = client.get(f"/v1/collections/{col}/documents")
    assert listing.status_code == 200 and listing.json() == [doc]
    _check(listing, "listing")
    _check(client.get(f"/v1/jobs/{up.json()['job_id']}"), "job")
    # its only page damaged: the document fails, and its message is readable too
    up = client.post(f"/v1/collections/{col}/documents",
                     files={"file": ("one.pdf", _damaged_page_pdf(1), "application/pdf")})
    assert up.status_code == 202, up.text
    failed = settled(client, up.json()["document_id"], timeout=600)
    assert failed["status"] == "failed" and "\\xc6" in failed["error"], failed
    assert client.get(f"/v1/collections/{col}/documents").status_code == 200
    _check(client.get(f"/v1/jobs/{up.json()['job_id']}"), "failed job")


def _surrogate_title_pdf() -> bytes:
    """A PDF whose Info /Title is UTF-16 with lone surrogates (PyMuPDF hands them back as
    U+DCxx). A surrogate that reached the embedder would fail the ingest (its tokenizer
    raises TypeError); `document_context` keeps only the title's word characters."""
    doc = pymupdf.open()
    doc.new_page(width=595, height=842).insert_text((72, 72), "Turbine 7 gearbox log.")
    xref = doc.get_new_xref()
    doc.update_object(xref, "<< /Title <FEFFD8000041DC00> >>")
    doc.xref_set_key(-1, "Info", f"{xref} 0 R")
    out: bytes = doc.tobytes()
    doc.close()
    assert "\udc80" in (pymupdf.open("pdf", out).metadata or {})["title"]
    return out


def test_a_title_with_lone_surrogates_is_indexed_and_readable(url: str) -> None:
    client = httpx.Client(base_url=url, timeout=300, headers=KEY)
    col = client.post("/v1/collections", json={"name": "titles"}).json()["collection_id"]
    up = client.post(f"/v1/collections/{col}/documents",
                     files={"file": ("t.pdf", _surrogate_title_pdf(), "application/pdf")})
    assert up.status_code == 202, up.text
    doc = settled(client, up.json()["document_id"], timeout=600)
    assert doc["status"] == "ready", doc
    listing = client.get(f"/v1/collections/{col}/documents")
    assert listing.status_code == 200 and listing.json() == [doc]
    pages = client.get(f"/v1/documents/{doc['document_id']}/pages")
    assert pages.status_code == 200 and len(pages.json()) == 1


def test_afterwards_every_document_and_listing_answers_200(url: str) -> None:
    client = httpx.Client(base_url=url, timeout=120, headers=KEY)
    collections = client.get("/v1/collections")
    assert collections.status_code == 200
    for col in collections.json():
        listing = client.get(f"/v1/collections/{col['collection_id']}/documents")
        assert listing.status_code == 200, listing.text
        for doc in listing.json():
            assert client.get(f"/v1/documents/{doc['document_id']}").status_code == 200
