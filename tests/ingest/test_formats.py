"""Uploads of every accepted format, checked as the service checks them (`check_upload`:
sniffed, made a PDF in a confined reader or by LibreOffice), and the hostile ones refused.
Every file is made here: Pillow writes the images, the OpenDocument files are written by
hand and LibreOffice writes the Office ones from those."""

from __future__ import annotations

import io
import shutil
import tempfile
import zipfile
from pathlib import Path

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
from tests.pdfs import text_pdf
from worker.ingest import office as office_module
from worker.ingest.budget import READER_BUDGET
from worker.ingest.errors import IngestError
from worker.ingest.formats import FORMATS, MAX_EXPANDED_BYTES, sniff
from worker.ingest.office import check_page_count, office_to_pdf, soffice_path
from worker.ingest.sandbox import ReaderLimits
from worker.uploads import CheckedUpload, Conversion, check_upload

PAGES = ["Alpha page: the harbour opens at dawn.", "Bravo page: the valve is checked weekly.",
         "Charlie page: the archive closes at noon."]
needs_office = pytest.mark.skipif(shutil.which("soffice") is None,
                                   reason="LibreOffice (soffice) is not installed")


def _check(data: bytes, name: str | None, *, max_pages: int = 50,
           convert: Conversion | None = None) -> CheckedUpload:
    return check_upload(data, password=None, max_bytes=64 * 2**20, max_pages=max_pages,
                        limits=ReaderLimits(memory_mb=1024, page_seconds=60),
                        filename=name, convert=convert)


def _texts(checked: CheckedUpload) -> list[str]:
    with pymupdf.open(stream=checked.data, filetype="pdf") as doc:
        return [page.get_text().strip() for page in doc]


def _image(fmt: str, **save: object) -> bytes:
    out = io.BytesIO()
    Image.open(io.BytesIO(text_image(PAGES[:1], size=(800, 400), font_px=30))).save(
        out, fmt, **save)
    return out.getvalue()


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary folder for the test (the machine's is shared): the test
    checks that nothing is left in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_sniffed_by_content_and_the_name_may_not_contradict_it() -> None:
    assert sniff(_image("PNG"), "scan.png").name == "png"
    assert sniff(_image("PNG"), None).name == "png"
    assert sniff(_image("PNG"), "scan.unknownext").name == "png"  # says nothing: ignored
    assert sniff(_image("JPEG"), "photo.JPG").name == "jpeg"
    assert sniff(b"# Notes\n\nplain words\n", "notes.md").name == "txt"
    assert sniff(opendocument("odt", PAGES), "a.odt").name == "odt"
    with pytest.raises(IngestError) as lying:
        sniff(_image("PNG"), "report.pdf")
    assert lying.value.http_status == 422
    assert "not a PDF document" in lying.value.message and "PNG image" in lying.value.message
    with pytest.raises(IngestError) as unknown:
        sniff(b"\x00\x01\x02binary\xff" * 10, "blob.bin")
    assert unknown.value.http_status == 415
    assert all(f.label in unknown.value.message for f in FORMATS)


def test_zip_bomb_and_macro_enabled_files_are_refused_from_the_directory() -> None:
    bomb = zip_bomb_docx(MAX_EXPANDED_BYTES + 1)
    assert len(bomb) < 4 * 2**20
    with pytest.raises(IngestError, match="expand to"):
        _check(bomb, "bomb.docx")
    macro = io.BytesIO()
    with zipfile.ZipFile(macro, "w") as archive:
        archive.writestr("[Content_Types].xml", '<Types><Override ContentType="application/'
                         'vnd.ms-word.document.macroEnabled.main+xml"/></Types>')
    with pytest.raises(IngestError, match="macro-enabled") as refused:
        _check(macro.getvalue(), "macros.docm")
    assert refused.value.http_status == 415


@pytest.mark.parametrize(("name", "members"), [
    ("basic.odt", {"mimetype": "application/vnd.oasis.opendocument.text",
                   "Basic/Standard/Module1.xml": "<module/>"}),
    ("scripts.odt", {"mimetype": "application/vnd.oasis.opendocument.text",
                     "Scripts/python/run.py": "import os"}),
    ("vba.docx", {"[Content_Types].xml": '<Types><Override ContentType="application/vnd.'
                  'openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>',
                  "word/vbaProject.bin": "vba"}),
])
def test_a_document_carrying_macros_is_refused_whatever_its_type_says(
        name: str, members: dict[str, str]) -> None:
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        for member, text in members.items():
            archive.writestr(member, text)
    with pytest.raises(IngestError, match="carries macros") as refused:
        _check(packed.getvalue(), name)
    assert refused.value.http_status == 415


def test_images_become_upright_pages_one_a_frame() -> None:
    wide = Image.new("RGB", (400, 200), "white")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    out = io.BytesIO()
    wide.save(out, "JPEG", exif=exif)
    checked = _check(out.getvalue(), "phone.jpg")
    assert (checked.format, checked.page_count) == ("jpeg", 1)
    with pymupdf.open(stream=checked.data, filetype="pdf") as doc:
        rect = doc[0].rect
    assert rect.height > rect.width  # turned upright: 200 x 400 pixels
    assert (round(rect.width), round(rect.height)) == (144, 288)  # 100 dpi: 72 pt an inch
    frames = [Image.new("L", (300, 200), shade) for shade in (0, 128, 255)]
    tiff = io.BytesIO()
    frames[0].save(tiff, "TIFF", save_all=True, append_images=frames[1:])
    assert _check(tiff.getvalue(), "fax.tiff").page_count == 3


def test_hostile_images_are_refused_within_the_readers_limits(private_tmp: Path) -> None:
    with pytest.raises(IngestError, match="10000 pages; at most 50"):
        _check(many_frame_tiff(10_000), "fax.tif")
    bomb = io.BytesIO()
    Image.new("1", (30_000, 30_000)).save(bomb, "PNG")  # 900 megapixels, a few kB
    with pytest.raises(IngestError, match="30000 x 30000 pixels") as refused:
        _check(bomb.getvalue(), "bomb.png")
    assert refused.value.http_status == 422
    assert not any(private_tmp.iterdir())


def test_text_markdown_and_epub_are_laid_out_on_pages() -> None:
    text = _check("\n\n".join(PAGES).encode(), "notes.txt")
    assert text.format == "txt" and "harbour" in _texts(text)[0]
    long = _check(("A line of notes.\n" * 400).encode(), "long.md")
    assert long.page_count > 3
    with pymupdf.open(stream=long.data, filetype="pdf") as doc:
        assert round(doc[0].rect.width) == 595  # A4
    book = _check(epub(PAGES), "book.epub")
    assert book.format == "epub" and "valve" in " ".join(_texts(book))


@needs_office
@pytest.mark.parametrize("kind", ["odt", "ods", "odp", "docx", "xlsx", "pptx"])
def test_office_files_keep_their_pages(kind: str, private_tmp: Path) -> None:
    data = opendocument(kind, PAGES) if kind.startswith("od") else office_open_xml(kind, PAGES)
    checked = _check(data, f"file.{kind}")
    assert (checked.format, checked.page_count) == (kind, 3)
    assert ["Bravo" in text for text in _texts(checked)] == [False, True, False]
    assert not any(private_tmp.iterdir())


@needs_office
@pytest.mark.parametrize("kind", ["odp", "pptx"])
def test_a_hidden_slide_keeps_the_slide_numbers(kind: str) -> None:
    data = (opendocument if kind == "odp" else office_open_xml)(kind, PAGES, frozenset({2}))
    checked = _check(data, f"deck.{kind}")
    assert checked.page_count == 3
    assert ["Bravo" in text for text in _texts(checked)] == [False, True, False]


def test_office_conversion_off_says_so_with_415() -> None:
    with pytest.raises(IngestError, match="CONDUIT_OFFICE_CONVERSION") as refused:
        _check(opendocument("odt", PAGES), "a.odt", convert=Conversion(office=False))
    assert refused.value.http_status == 415


def test_without_libreoffice_office_files_get_415_naming_the_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a server where soffice is not installed
    with pytest.raises(IngestError, match="apt-get install libreoffice-writer-nogui") as refused:
        _check(opendocument("odt", PAGES), "a.odt")
    assert refused.value.http_status == 415
    assert _check(text_pdf(PAGES), "a.pdf").page_count == 3  # PDFs need no LibreOffice


@needs_office
def test_libreoffice_takes_its_memory_from_the_reader_budget() -> None:
    """A conversion reserves its address-space limit from the process's reader budget: with
    the budget held, it is refused at once (503) before LibreOffice starts; freed, it runs."""
    data = opendocument("odt", PAGES)
    fmt, soffice = sniff(data, "a.odt"), soffice_path()
    assert soffice is not None
    READER_BUDGET.resize(1024)
    held = READER_BUDGET.reserve(1024, 0.0)
    try:
        with pytest.raises(IngestError, match="readers are busy") as busy:
            office_to_pdf(data, fmt, soffice=soffice, memory_mb=1024, seconds=60,
                          max_bytes=2**24, budget_mb=1024)
        assert busy.value.http_status == 503
    finally:
        held.release()
    pdf = office_to_pdf(data, fmt, soffice=soffice, memory_mb=1024, seconds=60,
                        max_bytes=2**24, budget_mb=1024)
    assert pdf.startswith(b"%PDF-")


def test_xps_pages_are_read() -> None:
    checked = _check(xps(PAGES), "print.xps")
    assert checked.format == "xps" and ["Bravo" in t for t in _texts(checked)] == [
        False, True, False]


@needs_office
def test_hostile_office_files_are_cut_or_refused(private_tmp: Path) -> None:
    slides = io.BytesIO()
    with zipfile.ZipFile(slides, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", '<Types><Override ContentType="application/'
                         'vnd.openxmlformats-officedocument.presentationml.presentation.main'
                         '+xml"/></Types>')
        for n in range(1, 2001):
            archive.writestr(f"ppt/slides/slide{n}.xml", "<p:sld/>")
    with pytest.raises(IngestError, match="2000 pages; at most 50"):
        _check(slides.getvalue(), "deck.pptx")
    with pytest.raises(IngestError, match="took longer than the 1 s limit"):
        _check(_big_sheet(1000, 1000), "cells.ods",
               convert=Conversion(office_timeout_s=1.0))
    assert not any(private_tmp.iterdir())


def test_slides_and_sheets_are_counted_before_conversion() -> None:
    """OpenDocument slides and sheets are counted in content.xml (here across its 1 MiB
    chunks), Office Open XML sheets in the zip's directory; inflating stops at the bound."""
    many = [f"Slide {n}: " + "calm water " * 100 for n in range(2000)]
    for kind in ("odp", "ods"):
        with pytest.raises(IngestError, match="has 2000 pages; at most 50"):
            _check(opendocument(kind, many), f"many.{kind}")
    with pytest.raises(IngestError, match="Excel workbook has 60 pages; at most 50"):
        _check(_sheets_xlsx(60), "many.xlsx")
    odp = sniff(opendocument("odp", PAGES))
    with pytest.raises(IngestError, match="has 100000 pages"):  # tags cut by chunks counted
        check_page_count(_content_zip(b"<draw:page/>" * 100_000), odp, 50)
    padded = b" " * (office_module._CONTENT_BOUND + 1) + b"<draw:page/>" * 100
    check_page_count(_content_zip(padded), odp, 50)  # past the bound: left to LibreOffice


def _content_zip(content: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("content.xml", content)
    return out.getvalue()


def _sheets_xlsx(sheets: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", '<Types><Override ContentType="application/'
                         'vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
                         '</Types>')
        for n in range(1, sheets + 1):
            archive.writestr(f"xl/worksheets/sheet{n}.xml", "<worksheet/>")
    return out.getvalue()


def test_a_pdf_is_still_stored_as_sent() -> None:
    pdf = text_pdf(PAGES)
    checked = _check(pdf, "plain.pdf")
    assert (checked.format, checked.data) == ("pdf", pdf)


def _big_sheet(rows: int, cols: int) -> bytes:
    row = "<table:table-row>" + "<table:table-cell office:value-type=\"float\" " \
          "office:value=\"7\"/>" * cols + "</table:table-row>"
    body = ('<office:body><office:spreadsheet><table:table table:name="S">' + row * rows +
            "</table:table></office:spreadsheet></office:body>")
    content = opendocument("ods", ["x"])
    with zipfile.ZipFile(io.BytesIO(content)) as source:
        members = {name: source.read(name) for name in source.namelist()}
    xml = members["content.xml"].decode()
    members["content.xml"] = (xml[:xml.index("<office:body>")] + body +
                              "</office:document-content>").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", members.pop("mimetype"), compress_type=zipfile.ZIP_STORED)
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()
