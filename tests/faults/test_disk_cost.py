"""Issue 70, item 3: the byte quota charges what a document costs on disk. Before, a 4.98 MB
PDF of 40 noise-image pages grew the home by 204 MB (page PNGs 190 MB) while `/v1/usage`
counted its 4,986,955 upload bytes. Now a ready document's usage is its upload, page images,
page KV on disk and text share, within 10% of the home's growth; and a document whose pages
would take its tenant past the byte quota fails with a message, keeping no page images or KV."""

from __future__ import annotations

import io
import os
from pathlib import Path

import httpx
import numpy as np
import pymupdf
from PIL import Image

from tests.faults.conftest import FAST, settled, start_serve

PAGES = 40
ENV = {**FAST, "CONDUIT_MODEL": "builtin:tiny-qwen2-vl", "CONDUIT_DISK_RESERVE_BYTES": "0"}


def noise_pdf(pages: int, seed: int) -> bytes:
    """`pages` pages, each one JPEG of noise drawn over the whole page (small as a PDF, large
    once rendered)."""
    rng = np.random.default_rng(seed)
    doc = pymupdf.open()
    for _ in range(pages):
        noise = Image.fromarray(rng.integers(0, 256, (280, 200, 3), dtype=np.uint8))
        jpeg = io.BytesIO()
        noise.save(jpeg, format="JPEG", quality=75)
        page = doc.new_page()
        page.insert_image(page.rect, stream=jpeg.getvalue())
    out: bytes = doc.tobytes()
    return out


def _home_bytes(home: Path) -> int:
    return sum(f.stat().st_size for f in home.rglob("*") if f.is_file())


def _upload(client: httpx.Client, col: str, pdf: bytes) -> str:
    r = client.post(f"/v1/collections/{col}/documents",
                    files={"file": ("noise.pdf", pdf, "application/pdf")})
    assert r.status_code == 202, r.text
    return str(r.json()["document_id"])


def test_usage_counts_what_a_document_takes_on_disk(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    url, proc = start_serve(home, ENV)
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
            warm = _upload(client, col, noise_pdf(1, seed=1))  # the model's files come first
            assert settled(client, warm)["status"] == "ready"
            used_before = client.get("/v1/usage").json()["bytes"]["used"]
            disk_before = _home_bytes(home)
            doc = settled(client, _upload(client, col, noise_pdf(PAGES, seed=2)))
            assert doc["status"] == "ready", doc
            charged = client.get("/v1/usage").json()["bytes"]["used"] - used_before
            grown = _home_bytes(home) - disk_before
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert grown > 5 * len(noise_pdf(PAGES, seed=2))  # the pages, not the upload, dominate
    assert abs(charged - grown) <= 0.1 * grown, (charged, grown)


def test_a_document_past_the_byte_quota_once_rendered_keeps_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    pdf = noise_pdf(PAGES, seed=3)
    url, proc = start_serve(home, {**ENV, "CONDUIT_QUOTA_BYTES": str(3 * len(pdf))})
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
            doc = settled(client, _upload(client, col, pdf))
            usage = client.get("/v1/usage").json()["bytes"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert doc["status"] == "failed" and "quota" in (doc["error"] or ""), doc
    assert usage["used"] == len(pdf)  # its upload, until it is deleted
    assert not (home / "pages" / doc["document_id"]).exists()
    kv = home / "kv"
    assert not [f for f in kv.rglob("*") if f.is_file()] if kv.exists() else True
    assert os.path.exists(home / "uploads")
