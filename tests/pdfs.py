"""Generated PDFs for tests: real files written by PyMuPDF."""

from __future__ import annotations

import pymupdf


def text_pdf(pages: list[str]) -> bytes:
    """A PDF with one page per string, the text set in a readable size."""
    doc = pymupdf.open()
    for text in pages:
        page = doc.new_page(width=595, height=842)
        page.insert_textbox(pymupdf.Rect(50, 60, 545, 800), text, fontsize=14)
    data: bytes = doc.tobytes()
    doc.close()
    return data


def encrypted_pdf(pages: list[str], password: str) -> bytes:
    """The same, encrypted with AES-256 under a user password."""
    doc = pymupdf.open("pdf", text_pdf(pages))
    data: bytes = doc.tobytes(encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw=password,
                              owner_pw=password + "-owner")
    doc.close()
    return data
