"""Page text: the PDF's text layer when it is usable, otherwise OCR of the rendered page."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal

import pymupdf

from worker.ingest.errors import CorruptPdfError
from worker.ingest.ocr import ocr_available, ocr_page

log = logging.getLogger(__name__)

TextSource = Literal["text_layer", "ocr", "none"]

_WORD_CHAR = re.compile(r"\w", re.UNICODE)
# Characters that mark a broken text layer (missing ToUnicode maps, private-use glyphs).
_BROKEN_CHAR = re.compile("[\ufffd\ue000-\uf8ff]")


@dataclass(frozen=True)
class PageText:
    """The text of one page and where it came from."""

    text: str
    source: TextSource


@dataclass(frozen=True)
class TextPolicy:
    """When a page's text layer is trusted and when it is OCRed.

    A text layer is usable when it has at least `min_word_chars` word characters and at most
    `max_broken_ratio` of its characters are replacement or private-use glyphs; a page
    without a usable layer is OCRed whole. A page with a usable layer whose images cover at
    least `image_cover_ratio` of its area (a chart in a report, a slide over a screenshot,
    a captioned figure) keeps its layer, and the words inside its images are recognised
    and merged in, at the cost of OCR on such pages (measured on the hard dev set:
    lab/retrieval/NOTES.md).
    """

    min_word_chars: int = 40
    max_broken_ratio: float = 0.1
    image_cover_ratio: float = 0.15
    ocr_dpi: int = 300
    ocr_max_pixels: int = 5000 * 5000
    language: str = "eng"


DEFAULT_TEXT_POLICY = TextPolicy()


def word_chars(text: str) -> int:
    """Number of word characters (letters, digits, underscore) in `text`."""
    return len(_WORD_CHAR.findall(text))


def usable_text_layer(text: str, policy: TextPolicy = DEFAULT_TEXT_POLICY) -> bool:
    """True when `text` (a page's text layer) is long and clean enough to index as is."""
    if word_chars(text) < policy.min_word_chars:
        return False
    broken = len(_BROKEN_CHAR.findall(text))
    return broken <= policy.max_broken_ratio * max(len(text.strip()), 1)


def image_cover(page: pymupdf.Page) -> float:
    """Fraction of the page area covered by placed images (overlaps counted once per image)."""
    area = abs(page.rect)
    if area <= 0:
        return 0.0
    covered = 0.0
    for info in page.get_image_info():
        box = pymupdf.Rect(info["bbox"]) & page.rect
        if not box.is_empty:
            covered += abs(box)
    return min(covered / area, 1.0)


def _wants_ocr(page: pymupdf.Page, usable: bool, policy: TextPolicy) -> bool:
    """Whether OCR could add text: the layer is not `usable`, or images cover at least
    `policy.image_cover_ratio` of the page."""
    return not usable or image_cover(page) >= policy.image_cover_ratio


def page_text(
    page: pymupdf.Page, *, ocr: bool, policy: TextPolicy = DEFAULT_TEXT_POLICY
) -> PageText:
    """The text of `page`: its text layer, or OCR when the layer is unusable (see `TextPolicy`).

    With `ocr=False` or no Tesseract data, the text layer is returned whatever its quality
    (source "none" when it is empty). Raises `CorruptPdfError` when MuPDF cannot read the page.
    """
    try:
        layer = str(page.get_text("text"))
    except Exception as exc:
        raise CorruptPdfError(f"page {page.number + 1} cannot be read") from exc
    usable = usable_text_layer(layer, policy)
    if not ocr or not _wants_ocr(page, usable, policy) or not ocr_available(policy.language):
        return _layer_result(layer)
    try:
        recognised = ocr_page(
            page, dpi=policy.ocr_dpi, max_pixels=policy.ocr_max_pixels,
            language=policy.language, full=not usable,
        )
    except Exception as exc:  # an OCR failure on one page must not fail the document
        log.warning("OCR failed on page %d: %s", page.number + 1, exc)
        return _layer_result(layer)
    if word_chars(recognised) > word_chars(layer):
        return PageText(text=recognised.strip(), source="ocr")
    return _layer_result(layer)


def _layer_result(layer: str) -> PageText:
    text = layer.strip()
    return PageText(text=text, source="text_layer" if word_chars(text) else "none")

