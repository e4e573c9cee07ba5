"""Revision 5/6 (AES-256) passwords go through SASLprep, as pdf.js and pypdf do (issue 18)."""

from __future__ import annotations

import io

import pypdf
import pytest

from lab.ingest.builders import text_pages_pdf
from worker.ingest import WrongPasswordError, open_pdf, page_text
from worker.ingest.pdf import encryption_revision
from worker.ingest.saslprep import password_forms, saslprep
from worker.uploads import check_upload

# a soft hyphen (SASLprep removes it) and a feminine ordinal (NFKC makes it "a")
TYPED = "tide\u00adtable\u00aa-7"
PREPARED = "tidetablea-7"


def _encrypted(password: str, algorithm: str) -> bytes:
    """A two-page PDF encrypted by pypdf (which applies SASLprep for AES-256, R6)."""
    data = text_pages_pdf(["The tide table lists high water at 06:42 in Harwich.",
                           "Low water follows at 12:55."])
    writer = pypdf.PdfWriter(clone_from=io.BytesIO(data))
    writer.encrypt(user_password=password, owner_password="owner-x", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_saslprep_maps_as_rfc_4013_says() -> None:
    assert saslprep("I\u00adX") == "IX"  # RFC 4013 section 3 examples
    assert saslprep("user") == "user"
    assert saslprep("USER") == "USER"
    assert saslprep("\u00aa") == "a"
    assert saslprep("\u2168") == "IX"
    assert saslprep("a\u00a0b") == "a b"  # a no-break space becomes a space
    for bad in ("\u0007", "\u0627\u0031"):
        with pytest.raises(ValueError):
            saslprep(bad)


def test_only_revision_5_and_later_try_the_prepared_form() -> None:
    assert password_forms(TYPED, 6) == [TYPED, PREPARED]
    assert password_forms(TYPED, 4) == [TYPED]
    assert password_forms("plain", 6) == ["plain"]
    assert password_forms("\u0007x", 6) == ["\u0007x"]  # prohibited: as typed only


def test_an_r6_file_opens_with_the_password_as_typed() -> None:
    data = _encrypted(TYPED, "AES-256")
    with open_pdf(data, password=TYPED, max_pages=5) as doc:
        assert encryption_revision(data) == 6
        assert "06:42 in Harwich" in page_text(doc.load_page(0), ocr=False).text
    with open_pdf(data, password=PREPARED, max_pages=5) as doc:  # and as prepared
        assert doc.page_count == 2
    with pytest.raises(WrongPasswordError):
        open_pdf(data, password="tidetable-7", max_pages=5)


def test_an_r6_upload_is_stored_decrypted() -> None:
    checked = check_upload(_encrypted(TYPED, "AES-256"), password=TYPED, max_bytes=2**20,
                           max_pages=5)
    with open_pdf(checked.data, max_pages=5) as doc:  # no password needed any more
        assert "Low water" in page_text(doc.load_page(1), ocr=False).text


def test_an_r4_file_is_read_with_its_revision() -> None:
    data = _encrypted("harbour-4", "AES-128")
    assert encryption_revision(data) == 4
    with open_pdf(data, password="harbour-4", max_pages=5) as doc:
        assert "Low water" in page_text(doc.load_page(1), ocr=False).text
    assert encryption_revision(text_pages_pdf(["not encrypted"])) is None
