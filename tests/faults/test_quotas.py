"""Per-tenant quotas over HTTP (issue 60 point 2): a real `conduit serve` with two keyed
tenants and small quotas. A tenant's upload past its byte, document or page quota gets 413
naming the limit and keeps nothing; the other tenant is unaffected; `GET /v1/usage` reports
the numbers (from the records, right after concurrent uploads and after a delete); a delete
gives the room back."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pymupdf
import pytest

from tests.faults.conftest import FAST, start_serve
from tests.pdfs import text_pdf

SMALL = text_pdf(["Valve 1 is inspected every 7 days.", "Valve 2 every 14 days."])  # 2 pages
LONG = text_pdf([f"Section {i}: pump {i} is serviced every {i} weeks." for i in range(5)])



def _bulky() -> bytes:
    """SMALL's two pages with 8 KB of random bytes attached: many bytes, few pages."""
    doc = pymupdf.open("pdf", SMALL)
    doc.embfile_add("blob.bin", random.Random(0).randbytes(8000))
    data: bytes = doc.tobytes()
    doc.close()
    return data


BULKY = _bulky()
QUOTA_DOCUMENTS = 3
QUOTA_PAGES = 6
QUOTA_BYTES = 4 * len(SMALL) + 100  # SMALLs fit bytes-wise; BULKY does not


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, httpx.Client]]:
    """Clients of tenants "a", "b" and "c" on one server with the quotas above."""
    assert len(SMALL) + len(BULKY) > QUOTA_BYTES
    home = tmp_path_factory.mktemp("quota-home")
    keys = home / "keys.json"
    keys.write_text(json.dumps({"key-a": "a", "key-b": "b", "key-c": "c"}))
    url, proc = start_serve(home, {
        **FAST, "CONDUIT_API_KEYS_FILE": str(keys), "CONDUIT_PREFILL_ON_INGEST": "false",
        "CONDUIT_QUOTA_DOCUMENTS": str(QUOTA_DOCUMENTS), "CONDUIT_QUOTA_PAGES": str(QUOTA_PAGES),
        "CONDUIT_QUOTA_BYTES": str(QUOTA_BYTES), "CONDUIT_DISK_RESERVE_BYTES": "0"})
    made = {t: httpx.Client(base_url=url, timeout=120,
                            headers={"Authorization": f"Bearer key-{t}"}) for t in "abc"}
    yield made
    for c in made.values():
        c.close()
    proc.terminate()
    proc.wait(timeout=60)


def _collection(client: httpx.Client, name: str) -> str:
    r = client.post("/v1/collections", json={"name": name})
    assert r.status_code == 201, r.text
    col: str = r.json()["collection_id"]
    return col


def _upload(client: httpx.Client, col: str, pdf: bytes, name: str = "a.pdf") -> httpx.Response:
    return client.post(f"/v1/collections/{col}/documents",
                       files={"file": (name, pdf, "application/pdf")})


def _usage(client: httpx.Client) -> dict[str, tuple[int, int | None]]:
    r = client.get("/v1/usage")
    assert r.status_code == 200, r.text
    return {k: (v["used"], v["limit"]) for k, v in r.json().items()}


def _refused(r: httpx.Response, quota: str, limit: int) -> None:
    assert r.status_code == 413, r.text
    assert f"quota of {limit} {quota}" in r.json()["detail"], r.text


def test_quotas_refuse_past_the_limit_and_spare_other_tenants(
        clients: dict[str, httpx.Client]) -> None:
    a, b = clients["a"], clients["b"]
    col = _collection(a, "mine")
    assert _usage(a) == {"bytes": (0, QUOTA_BYTES), "documents": (0, QUOTA_DOCUMENTS),
                         "pages": (0, QUOTA_PAGES), "collections": (1, 300),
                         "conversations": (0, 1000)}
    first = _upload(a, col, SMALL)
    assert first.status_code == 202, first.text
    _refused(_upload(a, col, BULKY), "bytes", QUOTA_BYTES)
    _refused(_upload(a, col, LONG), "pages", QUOTA_PAGES)  # 2 + 5 > 6
    assert _upload(a, col, SMALL).status_code == 202
    assert _upload(a, col, SMALL).status_code == 202
    _refused(_upload(a, col, SMALL), "documents", QUOTA_DOCUMENTS)
    docs = a.get(f"/v1/collections/{col}/documents").json()
    assert len(docs) == 3  # the refused uploads kept nothing
    assert _usage(a) == {"bytes": (3 * len(SMALL), QUOTA_BYTES),
                         "documents": (3, QUOTA_DOCUMENTS), "pages": (6, QUOTA_PAGES),
                         "collections": (1, 300), "conversations": (0, 1000)}

    # the other tenant has its own quota, untouched by a's
    other = _collection(b, "theirs")
    assert _upload(b, other, LONG).status_code == 202
    assert _usage(b)["pages"] == (5, QUOTA_PAGES)

    # a delete gives the room back (once the document has settled it can be deleted)
    victim = first.json()["document_id"]
    for _ in range(600):
        if a.delete(f"/v1/documents/{victim}").status_code == 204:
            break
    assert _usage(a)["documents"] == (2, QUOTA_DOCUMENTS)
    assert _upload(a, col, SMALL).status_code == 202


def test_concurrent_uploads_never_pass_the_document_quota(
        clients: dict[str, httpx.Client]) -> None:
    b = clients["c"]
    col = _collection(b, "burst")
    before = _usage(b)["documents"][0]

    def upload(i: int) -> int:
        for _ in range(200):  # a busy reader pool or queue answers 503/429: try again
            r = _upload(b, col, SMALL, f"burst-{i}.pdf")
            if r.status_code not in (429, 503):
                return r.status_code
        raise AssertionError("the server stayed busy")

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(upload, range(8)))
    room = QUOTA_DOCUMENTS - before
    assert sorted(codes) == [202] * room + [413] * (8 - room), codes
    assert _usage(b)["documents"] == (QUOTA_DOCUMENTS, QUOTA_DOCUMENTS)


def test_usage_without_keys_is_the_one_tenants(tmp_path: Path) -> None:
    """Open mode (no keys) is one tenant: its usage is everything stored; 0 = unlimited
    reads as a null limit."""
    home = tmp_path / "open"
    home.mkdir()
    url, proc = start_serve(home, {**FAST, "CONDUIT_PREFILL_ON_INGEST": "false",
                                   "CONDUIT_QUOTA_PAGES": "0", "CONDUIT_DISK_RESERVE_BYTES": "0"})
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            col = _collection(c, "c")
            assert _upload(c, col, LONG).status_code == 202
            got = _usage(c)
            assert got["pages"] == (5, None) and got["documents"] == (1, 5000)
            assert got["bytes"] == (len(LONG), 20 * 2**30)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
