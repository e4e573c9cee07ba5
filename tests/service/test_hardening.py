"""Issue 30, point 5, over real HTTP: security headers on the page and the API, a bounded
thumbnail cache with a fixed set of widths, and a home directory private to the service's user.
(`tests/service/test_web_ui.py` drives the page in Chromium under this policy.)"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from service.routers.ui import STATIC_DIR
from service.thumbnails import WIDTHS, ThumbnailCache, thumbnail_width
from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

PAGES = ["Harbour board minutes. The dredging contract went to Kessel.",
         "Wind farm log. Turbine 7 gearbox replaced in March."]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str]]:
    """(URL, home, ready document id) of a keyed server whose home existed as mode 0755."""
    home = tmp_path_factory.mktemp("hardened")
    home.chmod(0o755)
    url, proc = start_server(home, {"CONDUIT_API_KEYS": json.dumps(["alpha-key"]),
                                    "CONDUIT_OCR": "false"})
    client = httpx.Client(base_url=url, timeout=300, headers={"Authorization": "Bearer alpha-key"})
    col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    up = client.post(f"/v1/collections/{col}/documents",
                     files={"file": ("minutes.pdf", text_pdf(PAGES), "application/pdf")})
    assert up.status_code == 202, up.text
    assert wait_ready(client, up.json()["document_id"])["status"] == "ready"
    yield url, home, up.json()["document_id"]
    stop_server(proc)


def _assert_hardened(r: httpx.Response, docs: bool = False) -> None:
    h = r.headers
    csp = h["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert ("'unsafe-inline'" in csp) == docs, csp
    if not docs:
        assert "script-src 'self';" in csp and "http" not in csp
    assert h["x-frame-options"] == "DENY"
    assert h["x-content-type-options"] == "nosniff"
    assert h["referrer-policy"] == "no-referrer"


def test_security_headers_on_the_page_the_api_and_refusals(served: tuple[str, Path, str]
                                                           ) -> None:
    url, _, doc = served
    anon = httpx.Client(base_url=url, timeout=60)
    keyed = httpx.Client(base_url=url, timeout=60, headers={"Authorization": "Bearer alpha-key"})
    for r in (anon.get("/"), anon.get("/static/app.js"), anon.get("/healthz"),
              anon.get("/v1/collections"),  # the guard's 401
              keyed.get("/v1/collections"), keyed.get(f"/v1/documents/{doc}"),
              keyed.get("/v1/documents/doc_nope"), keyed.get(f"/v1/documents/{doc}/pages/1/image"),
              keyed.post("/v1/query", json={})):  # a 422
        _assert_hardened(r)
    _assert_hardened(keyed.get("/docs"), docs=True)  # Swagger UI starts with an inline script


def test_the_page_needs_no_inline_script_or_style() -> None:
    """What the policy relies on: every script and style of the page comes from /static."""
    html = (STATIC_DIR / "index.html").read_text()
    scripts = re.findall(r"<script\b[^>]*>", html)
    assert scripts and all('src="/static/' in s for s in scripts), scripts
    assert "<style" not in html and " style=" not in html and "javascript:" not in html
    for path in STATIC_DIR.glob("*.js"):
        code = path.read_text()
        assert "eval(" not in code and "new Function" not in code, path.name
        assert '"style"' not in code and "setAttribute(\"style" not in code, path.name


def test_thumbnails_round_up_to_a_fixed_set_of_widths(served: tuple[str, Path, str]) -> None:
    url, _, doc = served
    client = httpx.Client(base_url=url, timeout=60, headers={"Authorization": "Bearer alpha-key"})
    page_width = client.get(f"/v1/documents/{doc}/pages").json()[0]["width"]
    replies = [client.get(f"/v1/documents/{doc}/pages/1/image", params={"width": w})
               for w in (97, 110, 120)]
    assert {r.headers["etag"] for r in replies} == {replies[0].headers["etag"]}
    assert {r.content for r in replies} == {replies[0].content}
    assert Image.open(io.BytesIO(replies[0].content)).width == 120
    assert Image.open(io.BytesIO(client.get(f"/v1/documents/{doc}/pages/1/image",
                                            params={"width": 16}).content)).width == 64
    # a width that rounds up past the page is the page itself, never upscaled
    full = client.get(f"/v1/documents/{doc}/pages/1/image")
    past = thumbnail_width(page_width)
    wide = client.get(f"/v1/documents/{doc}/pages/1/image", params={"width": past})
    assert wide.content == full.content


def test_thumbnail_cache_is_an_lru_under_a_byte_bound(tmp_path: Path) -> None:
    assert [thumbnail_width(w) for w in (16, 64, 65, 239, 240, 241, 4000, 4096)] == \
        [64, 64, 96, 240, 240, 320, 4096, 4096]
    assert len(WIDTHS) <= 16
    path = tmp_path / "page.png"
    Image.effect_noise((800, 1100), 60).convert("RGB").save(path)  # noise: PNG stays large
    cache = ThumbnailCache(max_bytes=10**9)
    first = cache.get("doc_a", path, 240)
    assert cache.get("doc_a", path, 240) is first and cache.renders == 1  # a hit
    assert Image.open(io.BytesIO(first)).size == (240, 330)
    one = cache.bytes
    bounded = ThumbnailCache(max_bytes=int(2.5 * one))
    for width in (240, 240, 240, 240):
        bounded.get("doc_a", path, width)
    assert bounded.renders == 1
    for doc in ("doc_b", "doc_c", "doc_d"):  # the same size each: the oldest goes first
        bounded.get(doc, path, 240)
    assert bounded.bytes <= bounded.max_bytes and len(bounded) == 2
    bounded.get("doc_d", path, 240)
    assert bounded.renders == 4  # doc_d was kept
    bounded.get("doc_a", path, 240)
    assert bounded.renders == 5  # doc_a was evicted
    bounded.drop_document("doc_a")
    assert len(bounded) == 1 and bounded.bytes == one
    huge = ThumbnailCache(max_bytes=10)
    assert huge.get("doc_a", path, 64) and len(huge) == 0 and huge.bytes == 0  # never kept


def _wide(home: Path) -> list[str]:
    """Paths under `home` that its group or other users could read, write or enter."""
    return [f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p}" for p in [home, *home.rglob("*")]
            if stat.S_IMODE(p.lstat().st_mode) & 0o077 and p.name != "server.log"]


def test_the_home_and_everything_in_it_is_private(served: tuple[str, Path, str]) -> None:
    """The home existed as 0755; after an upload, an ingest and a thumbnail nothing under it
    (uploads, page images, KV, index, SQLite) is open to other users. (`server.log` is the
    test's own file.)"""
    _, home, doc = served
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert (home / "uploads" / f"{doc}.pdf").is_file()
    assert any((home / "pages" / doc).iterdir())
    assert _wide(home) == []


def test_private_home_in_a_fresh_process(tmp_path: Path) -> None:
    """`private_home` as the worker and CLI commands call it (in a child: umask is
    per process)."""
    home = tmp_path / "a" / "home"
    code = ("import sys, pathlib; from service.hardening import private_home; "
            "h = pathlib.Path(sys.argv[1]); private_home(h); (h / 'x').mkdir(); "
            "(h / 'x' / 'f').write_text('secret')")
    subprocess.run([sys.executable, "-c", code, str(home)], check=True,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert _wide(home) == []
