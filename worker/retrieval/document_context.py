"""Document context: the title words of a page's document, indexed with every page.

A page often answers a question without repeating the words that pick its document: the
company, product or paper is named on the cover, in the file name and in the question, not
on page 41's table. `document_context` builds a short line of title words (PDF title, the
opening words of the first page, the file name) that ingestion stores with every page;
BM25 indexes it with the page text and the dense model embeds it in front of every
passage. On the dev sets it is the largest single gain after OCR
(lab/retrieval/NOTES.md).
"""

from __future__ import annotations

import re

_NON_WORD = re.compile(r"[\W_]+")
_ID_LIKE = re.compile(r"^(?=.*\d)(?=.*[a-z])[a-z0-9]{6,}$|^\d{5,}$|^[0-9a-f]{8,}$")
_EXPORT_PREFIX = re.compile(r"^(microsoft (word|powerpoint|excel) - )", re.IGNORECASE)
_FILE_SUFFIX = re.compile(r"\.(pdf|docx?|pptx?|xlsx?|odt|tex)$", re.IGNORECASE)
CONTEXT_WORDS = 24
FIRST_PAGE_WORDS = 12


def _title_words(text: str) -> list[str]:
    words = _NON_WORD.sub(" ", _FILE_SUFFIX.sub("", _EXPORT_PREFIX.sub("", text.strip())))
    return [w for w in words.split() if not _ID_LIKE.match(w.lower())]


def document_context(filename: str, title: str | None, first_page: str,
                     max_words: int = CONTEXT_WORDS) -> str:
    """The title words of a document: its PDF title, the first `FIRST_PAGE_WORDS` words of
    its first page and its file name, each word once (case-insensitive), at most
    `max_words`. Id-like tokens (hashes, long digit runs, "2301v2x") and export prefixes
    ("Microsoft Word - ") are dropped: they name files, not content.
    """
    words: list[str] = []
    seen: set[str] = set()
    sources = [title or "", " ".join(first_page.split()[:FIRST_PAGE_WORDS]), filename]
    for word in (w for source in sources for w in _title_words(source)):
        if word.lower() not in seen:
            seen.add(word.lower())
            words.append(word)
    return " ".join(words[:max_words])


def with_context(context: str, text: str) -> str:
    """`text` as indexed: the document's context line first (when there is one)."""
    return f"{context}\n{text}" if context else text
