"""OCR of whole pages through MuPDF's built-in Tesseract engine.

PyMuPDF links Tesseract itself; what it needs from the system is the language data
(`tessdata`, installed with Debian's `tesseract-ocr` / `tesseract-ocr-eng`). When that is
missing, `ocr_available()` is False and ingestion goes on with text layers only.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import pymupdf

from worker.ingest.render import capped_dpi

log = logging.getLogger(__name__)

DEFAULT_LANGUAGE = "eng"


@functools.cache
def find_tessdata(language: str = DEFAULT_LANGUAGE) -> Path | None:
    """The Tesseract language-data folder holding `language`, or None when there is none."""
    try:
        folder = pymupdf.get_tessdata()
    except Exception as exc:  # raises when Tesseract is not installed
        log.warning("OCR is off (no Tesseract language data: %s); only text layers are read", exc)
        return None
    path = Path(os.fspath(folder))
    if not (path / f"{language}.traineddata").is_file():
        log.warning("OCR is off: tessdata at %s lacks %s.traineddata; only text layers are read",
                    path, language)
        return None
    return path


def ocr_available(language: str = DEFAULT_LANGUAGE) -> bool:
    """True when pages can be OCRed in `language` on this machine."""
    return find_tessdata(language) is not None


def ocr_page(
    page: pymupdf.Page, *, dpi: int = 300, max_pixels: int = 5000 * 5000,
    language: str = DEFAULT_LANGUAGE, full: bool = True,
) -> str:
    """OCR the page and return its text ("" when OCR is unavailable).

    `full=True` recognises the whole rendered page; `full=False` recognises only the areas
    of its images and merges them with the text layer (for pages whose text layer is good
    but whose images hold more words). The OCR resolution is lowered so the page image
    stays within `max_pixels`.
    Raises whatever MuPDF raises on a page it cannot draw; the caller maps it.
    """
    tessdata = find_tessdata(language)
    if tessdata is None:
        return ""
    effective = capped_dpi(page.rect, dpi=dpi, max_pixels=max_pixels)
    textpage = page.get_textpage_ocr(
        dpi=effective, full=full, language=language, tessdata=str(tessdata)
    )
    return str(page.get_text("text", textpage=textpage))
