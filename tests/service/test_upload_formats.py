"""Over real HTTP: photos, a multi-page TIFF scan, a text file, an EPUB and Office files each
become pages that a question's citation points into; misnamed and unsupported uploads are
refused, and so are hostile files (a decompression-bomb PNG, a TIFF of 10,000 frames, a
zip-bomb DOCX), leaving nothing behind. Every file is made here (Pillow, hand-written OpenDocument
and EPUB, LibreOffice writing Office files from those)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pymupdf
import pytest
from PIL import Image

from lab.ingest.builders import text_image
from tests.made_files import (
    epub,
    many_frame_tiff,
    office_open_xml,
    opendocument,
    xps,
    zip_bomb_docx,
)
from tests.service.conftest import wait_ready
from worker.ingest import ocr_available
from worker.ingest.convert import A4_POINTS
from worker.ingest.formats import MAX_EXPANDED_BYTES

PAGES = ["Harbour notes. The ferry leaves the northern pier at dawn.",
         "Valve manual. The pressure valve is inspected every fourteen days.",
         "Archive rules. The reading room closes at noon on Saturdays."]
QUESTION = "How often is the pressure valve inspected?"
needs_office = pytest.mark.skipif(shutil.which("soffice") is None,
                                  reason="LibreOffice (soffice) is not installed")
needs_ocr = pytest.mark.skipif(not ocr_available(), reason="tesseract language data missing")


@pytest.fixture(scope="module")
def collection(client: httpx.Client) -> str:
    r = client.post("/v1/collections", json={"name": "formats"})
    assert r.status_code == 201, r.text
    return str(r.json()["collection_id"])


def _upload(client: httpx.Client, collection: str, data: bytes, name: str) -> httpx.Response:
    return client.post(f"/v1/collections/{collection}/documents",
                       files={"file": (name, data, "application/octet-stream")})


def _asked_cites(client: httpx.Client, collection: str, data: bytes, name: str,
                 pages: int = 3, page: int = 2) -> None:
    r = _upload(client, collection, data, name)
    assert r.status_code == 202, r.text
    doc = wait_ready(client, r.json()["document_id"])
    assert doc["status"] == "ready" and doc["pages_total"] == pages, doc
    assert doc["filename"] == name  # the original is what the document names
    image = client.get(f"/v1/documents/{doc['document_id']}/pages/{page}/image")
    assert image.status_code == 200 and image.headers["content-type"].startswith("image/")
    r = client.post("/v1/query", json={"collection_id": collection, "question": QUESTION,
                                       "document_ids": [doc["document_id"]], "top_k": 1,
                                       "max_new_tokens": 2})
    assert r.status_code == 200, r.text
    cited = r.json()["citations"][0]
    assert (cited["filename"], cited["page"]) == (name, page)
    assert "inspected" in cited["snippet"]["text"].lower()


def _frames(fmt: str) -> bytes:
    frames = [Image.open(io.BytesIO(text_image([text], size=(1654, 400), font_px=36)))
              .convert("L") for text in PAGES]
    out = io.BytesIO()
    frames[0].save(out, fmt, save_all=True, append_images=frames[1:],
                   compression="tiff_deflate")
    return out.getvalue()


def test_info_lists_the_accepted_formats(client: httpx.Client) -> None:
    formats = {f["name"]: f for f in client.get("/v1/info").json()["formats"]}
    assert {"pdf", "png", "jpeg", "tiff", "epub", "xps", "txt"} <= set(formats)
    assert ".md" in formats["txt"]["extensions"]
    assert ("docx" in formats) == (shutil.which("soffice") is not None)


def test_a_text_file_is_laid_out_and_cited_by_page(client: httpx.Client,
                                                   collection: str) -> None:
    filler = "".join(f"Line {n} of the harbour log: calm water.\n" for n in range(70))
    text = f"{PAGES[0]}\n{filler}{PAGES[1]}\n{filler}{PAGES[2]}\n{filler}".encode()
    with pymupdf.open(stream=text, filetype="txt") as laid:  # as the reader lays it out
        laid.layout(width=A4_POINTS[0], height=A4_POINTS[1], fontsize=11)
        where = [n for n, page in enumerate(laid, 1) if "fourteen" in page.get_text()]
        pages = laid.page_count
    assert where == [2] and pages >= 3
    _asked_cites(client, collection, text, "notes.md", pages)


@needs_ocr
def test_a_multi_page_tiff_scan_is_ocred_and_cited_by_page(client: httpx.Client,
                                                           collection: str) -> None:
    _asked_cites(client, collection, _frames("TIFF"), "scan.tiff")


@needs_ocr
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_photographed_page_is_ocred_and_cited(client: httpx.Client, collection: str,
                                                fmt: str) -> None:
    photo = io.BytesIO()
    Image.open(io.BytesIO(text_image(PAGES[1:2], size=(1654, 400), font_px=36))).save(
        photo, fmt)
    _asked_cites(client, collection, photo.getvalue(), f"photo.{fmt.lower()}", 1, 1)


@pytest.mark.parametrize("kind", ["epub", "xps"])
def test_an_ebook_or_xps_is_cited_by_page(client: httpx.Client, collection: str,
                                          kind: str) -> None:
    _asked_cites(client, collection, (epub if kind == "epub" else xps)(PAGES), f"guide.{kind}")


@needs_office
@pytest.mark.parametrize("kind", ["docx", "xlsx", "pptx", "odt", "ods", "odp"])
def test_office_files_are_cited_by_page(client: httpx.Client, collection: str,
                                        kind: str) -> None:
    data = opendocument(kind, PAGES) if kind.startswith("od") else office_open_xml(kind, PAGES)
    _asked_cites(client, collection, data, f"handbook.{kind}")


def test_hostile_uploads_get_4xx_and_leave_nothing(client: httpx.Client, collection: str,
                                                   server: tuple[str, Path]) -> None:
    _, home = server
    listed = f"/v1/collections/{collection}/documents"
    before = client.get(listed).json()
    uploads = set((home / "uploads").glob("*")) if (home / "uploads").exists() else set()
    png = text_image(PAGES[:1], size=(600, 300), font_px=30)
    lying = _upload(client, collection, png, "contract.pdf")
    assert lying.status_code == 422
    assert "not a PDF document" in lying.json()["detail"]
    unknown = _upload(client, collection, b"\x00\x01binary\xfe" * 50, "data.bin")
    assert unknown.status_code == 415 and "PNG image" in unknown.json()["detail"]
    bomb = io.BytesIO()
    Image.new("1", (30_000, 30_000)).save(bomb, "PNG")  # 900 megapixels in ~100 kB
    hostile = {"bomb.png": (bomb.getvalue(), "30000 x 30000 pixels"),
               "fax.tiff": (many_frame_tiff(10_000), "10000 pages"),
               "bomb.docx": (zip_bomb_docx(MAX_EXPANDED_BYTES + 1), "expand to")}
    for name, (data, says) in hostile.items():
        r = _upload(client, collection, data, name)
        assert r.status_code == 422 and says in r.json()["detail"], (name, r.text)
    assert client.get(listed).json() == before
    assert set((home / "uploads").glob("*")) == uploads


def _conduit(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_cli_ingests_other_formats_and_refuses_a_lying_name(tmp_path: Path) -> None:
    notes, book, lying = tmp_path / "notes.md", tmp_path / "guide.epub", tmp_path / "scan.pdf"
    notes.write_text("# Notes\n\n" + PAGES[1] + "\n")
    book.write_bytes(epub(PAGES))
    lying.write_bytes(text_image(PAGES[:1], size=(600, 300), font_px=30))
    done = _conduit(tmp_path / "home", "ingest", str(notes), str(book), str(lying),
                    "--collection", "mixed")
    assert done.returncode == 1, done.stderr  # one file refused
    assert "notes.md: 1 page(s)" in done.stdout and "guide.epub: 3 page(s)" in done.stdout
    assert "scan.pdf: The uploaded file is not a PDF document" in done.stderr
