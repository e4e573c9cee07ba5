"""open_pdf on good and bad inputs: every failure is a typed IngestError with a message."""

from __future__ import annotations

import pymupdf
import pytest

from lab.ingest.builders import pdf_bytes, text_pages_pdf, zero_page_pdf
from worker.ingest import (
    CorruptPdfError,
    EmptyFileError,
    IngestError,
    NoPagesError,
    NotAPdfError,
    PasswordRequiredError,
    TooManyPagesError,
    WrongPasswordError,
    open_pdf,
    page_text,
)

PAGES = [f"Page {i}: the lighthouse keeper logged {i * 7} ships today." for i in range(1, 6)]


def encrypted(password: str) -> bytes:
    doc = pymupdf.open("pdf", text_pages_pdf(PAGES))
    return pdf_bytes(doc, encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw=password,
                     owner_pw=password + "-owner")


def test_opens_a_plain_pdf() -> None:
    doc = open_pdf(text_pages_pdf(PAGES), max_pages=10)
    assert doc.page_count == 5
    assert "lighthouse keeper logged 21" in page_text(doc.load_page(2), ocr=False).text


def test_a_password_for_an_unencrypted_file_is_ignored() -> None:
    doc = open_pdf(text_pages_pdf(PAGES), password="whatever", max_pages=10)
    assert "logged 7 ships" in page_text(doc.load_page(0), ocr=False).text


def test_encrypted_file_needs_its_password() -> None:
    data = encrypted("s3cret")
    with pytest.raises(PasswordRequiredError) as info:
        open_pdf(data, max_pages=10)
    assert "password" in info.value.message
    assert info.value.http_status == 400
    with pytest.raises(WrongPasswordError):
        open_pdf(data, password="wrong", max_pages=10)
    doc = open_pdf(data, password="s3cret", max_pages=10)
    # pages must carry their text after authentication, not render blank
    assert "logged 35 ships" in page_text(doc.load_page(4), ocr=False).text


def test_owner_password_only_file_opens_without_a_password() -> None:
    doc = pymupdf.open("pdf", text_pages_pdf(PAGES))
    data = pdf_bytes(doc, encryption=pymupdf.PDF_ENCRYPT_AES_256, owner_pw="owner-only")
    opened = open_pdf(data, max_pages=10)
    assert "logged 14 ships" in page_text(opened.load_page(1), ocr=False).text


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.6])
def test_truncated_file_is_corrupt(fraction: float) -> None:
    # (cut at 97% only the cross-reference table is lost: tests/ingest/test_damaged.py)
    data = text_pages_pdf(PAGES)
    with pytest.raises(CorruptPdfError) as info:
        open_pdf(data[: int(len(data) * fraction)], max_pages=10)
    assert "damaged or truncated" in info.value.message


def test_zero_page_file() -> None:
    with pytest.raises(NoPagesError):
        open_pdf(zero_page_pdf(), max_pages=10)


def test_too_many_pages() -> None:
    with pytest.raises(TooManyPagesError) as info:
        open_pdf(text_pages_pdf(PAGES), max_pages=3)
    assert "5 pages" in info.value.message and "3" in info.value.message


@pytest.mark.parametrize(
    "data",
    [
        b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
        b"Just some notes saved with a .pdf name.\n" * 20,
        b"PK\x03\x04" + bytes(100),
    ],
)
def test_non_pdf_bytes(data: bytes) -> None:
    with pytest.raises(NotAPdfError) as info:
        open_pdf(data, max_pages=10)
    assert info.value.message == "The uploaded file is not a PDF document."


def test_empty_bytes() -> None:
    with pytest.raises(EmptyFileError):
        open_pdf(b"", max_pages=10)


def test_header_only_is_corrupt() -> None:
    with pytest.raises(CorruptPdfError):
        open_pdf(b"%PDF-1.7\n%garbage that is not a document\n", max_pages=10)


def test_every_error_is_an_ingest_error_with_a_message() -> None:
    cases = [b"", b"hello", b"%PDF-1.4\n", zero_page_pdf(), encrypted("pw")]
    for data in cases:
        with pytest.raises(IngestError) as info:
            open_pdf(data, max_pages=10)
        assert info.value.message and info.value.message.endswith(".")
        assert 400 <= info.value.http_status < 500
