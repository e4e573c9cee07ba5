"""Files of the accepted formats made in the tests, and hostile ones: OpenDocument, EPUB and
XPS written by hand (zips of XML), Office Open XML converted from those by LibreOffice (run
here, outside the service), a zip bomb and a TIFF of many frames written byte by byte."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tempfile
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

import pymupdf

_NS = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
       'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
       'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
       'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0" '
       'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
       'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0" '
       'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
       'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" '
       'xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"')
_MIME = {"odt": "application/vnd.oasis.opendocument.text",
         "ods": "application/vnd.oasis.opendocument.spreadsheet",
         "odp": "application/vnd.oasis.opendocument.presentation"}


def opendocument(kind: str, pages: list[str], hidden: frozenset[int] = frozenset()) -> bytes:
    """An ODT (one page a text, page breaks between), ODS (one sheet a text, a word a
    cell) or ODP (one slide a text; the slides numbered in `hidden` hidden)."""
    if kind == "odt":
        styles = ('<office:automatic-styles><style:style style:name="B" '
                  'style:family="paragraph"><style:paragraph-properties '
                  'fo:break-before="page"/></style:style></office:automatic-styles>')
        brk = ' text:style-name="B"'
        body = "".join(f"<text:p{brk if i else ''}>{escape(t)}</text:p>"
                       for i, t in enumerate(pages))
        body = f"{styles}<office:body><office:text>{body}</office:text></office:body>"
    elif kind == "ods":
        body = "".join(f'<table:table table:name="Sheet{i + 1}"><table:table-row>' + "".join(
            f"<table:table-cell><text:p>{escape(word)}</text:p></table:table-cell>"
            for word in t.split()) + "</table:table-row></table:table>"
            for i, t in enumerate(pages))
        body = f"<office:body><office:spreadsheet>{body}</office:spreadsheet></office:body>"
    else:
        hide = ' draw:style-name="H"'
        body = "".join(f'<draw:page draw:name="s{i + 1}"{hide if i + 1 in hidden else ""}>'
                       '<draw:frame svg:x="1cm" svg:y="2cm" svg:width="24cm" svg:height="6cm">'
                       f"<draw:text-box><text:p>{escape(t)}</text:p></draw:text-box>"
                       "</draw:frame></draw:page>" for i, t in enumerate(pages))
        styles = ('<office:automatic-styles><style:style style:name="H" '
                  'style:family="drawing-page"><style:drawing-page-properties '
                  'presentation:visibility="hidden"/></style:style></office:automatic-styles>')
        body = (f"{styles}<office:body><office:presentation>{body}</office:presentation>"
                "</office:body>")
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {_NS} '
               f'office:version="1.2">{body}</office:document-content>')
    members = {"content.xml": content.encode()}
    entries = "".join(f'<manifest:file-entry manifest:full-path="{name}" '
                      'manifest:media-type="text/xml"/>' for name in members)
    manifest = (f'<?xml version="1.0" encoding="UTF-8"?><manifest:manifest {_NS} '
                'manifest:version="1.2"><manifest:file-entry manifest:full-path="/" '
                f'manifest:media-type="{_MIME[kind]}"/>{entries}</manifest:manifest>')
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("mimetype", _MIME[kind], compress_type=zipfile.ZIP_STORED)
        archive.writestr("META-INF/manifest.xml", manifest, compress_type=zipfile.ZIP_DEFLATED)
        for name, data in members.items():
            archive.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def office_open_xml(kind: str, pages: list[str], hidden: frozenset[int] = frozenset()) -> bytes:
    """A DOCX, XLSX or PPTX of `pages`, written by LibreOffice from the OpenDocument form
    (a PPTX's slides numbered in `hidden` hidden)."""
    source = {"docx": "odt", "xlsx": "ods", "pptx": "odp"}[kind]
    soffice = shutil.which("soffice")
    assert soffice, "LibreOffice (soffice) is needed to write Office files"
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / f"doc.{source}"
        path.write_bytes(opendocument(source, pages, hidden))
        subprocess.run([soffice, f"-env:UserInstallation=file://{work}/profile", "--headless",
                        "--norestore", "--convert-to", kind, "--outdir", work, str(path)],
                       check=True, capture_output=True, timeout=120)
        return (Path(work) / f"doc.{kind}").read_bytes()


def epub(chapters: list[str]) -> bytes:
    """An EPUB of one XHTML chapter a text (PyMuPDF starts each on a new page)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as book:
        book.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        book.writestr("META-INF/container.xml", (
            '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:'
            'opendocument:xmlns:container"><rootfiles><rootfile full-path="book.opf" '
            'media-type="application/oebps-package+xml"/></rootfiles></container>'))
        items = "".join(f'<item id="c{i}" href="c{i}.xhtml" media-type="application/'
                        'xhtml+xml"/>' for i in range(len(chapters)))
        spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(chapters)))
        book.writestr("book.opf", (
            '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" '
            'version="2.0"><metadata/><manifest>' + items + "</manifest><spine>" + spine +
            "</spine></package>"))
        for i, text in enumerate(chapters):
            book.writestr(f"c{i}.xhtml", (
                '<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body><p>'
                f"{text}</p></body></html>"))
    return out.getvalue()


_XPS_TYPES = (
    '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/'
    'package/2006/content-types"><Default Extension="rels" ContentType="application/'
    'vnd.openxmlformats-package.relationships+xml"/><Default Extension="fdseq" ContentType='
    '"application/vnd.ms-package.xps-fixeddocumentsequence+xml"/><Default Extension="fdoc" '
    'ContentType="application/vnd.ms-package.xps-fixeddocument+xml"/><Default Extension='
    '"fpage" ContentType="application/vnd.ms-package.xps-fixedpage+xml"/><Default '
    'Extension="otf" ContentType="application/vnd.ms-opentype"/></Types>')
_XPS = "http://schemas.microsoft.com/xps/2005/06"


def xps(pages: list[str]) -> bytes:
    """An XPS document of one fixed page a text, drawn with PyMuPDF's Helvetica."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as doc:
        doc.writestr("[Content_Types].xml", _XPS_TYPES)
        doc.writestr("_rels/.rels", (
            '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.'
            'openxmlformats.org/package/2006/relationships"><Relationship Type="http://schemas.'
            'microsoft.com/xps/2005/06/fixedrepresentation" Target="/Seq.fdseq" Id="R0"/>'
            "</Relationships>"))
        doc.writestr("Seq.fdseq", f'<FixedDocumentSequence xmlns="{_XPS}"><DocumentReference '
                     'Source="/Doc.fdoc"/></FixedDocumentSequence>')
        refs = "".join(f'<PageContent Source="/Pages/{i + 1}.fpage"/>' for i in range(len(pages)))
        doc.writestr("Doc.fdoc", f'<FixedDocument xmlns="{_XPS}">{refs}</FixedDocument>')
        doc.writestr("Resources/font.otf", pymupdf.Font("helv").buffer)
        for i, text in enumerate(pages):
            doc.writestr(f"Pages/{i + 1}.fpage", (
                f'<FixedPage xmlns="{_XPS}" Width="816" Height="1056" xml:lang="en-US"><Glyphs '
                'FontUri="/Resources/font.otf" FontRenderingEmSize="16" OriginX="60" '
                f'OriginY="120" UnicodeString="{escape(text)}" Fill="#FF000000"/></FixedPage>'))
    return out.getvalue()


def zip_bomb_docx(expanded: int) -> bytes:
    """A DOCX-shaped zip whose one large member inflates to at least `expanded` zero bytes
    (about a thousandth of that on disk)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", '<Types><Override ContentType="application/'
                         'vnd.openxmlformats-officedocument.wordprocessingml.document.main'
                         '+xml"/></Types>')
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            zeros = bytes(1 << 24)
            for _ in range(-(-expanded // len(zeros))):
                member.write(zeros)
    return out.getvalue()


def many_frame_tiff(frames: int) -> bytes:
    """A TIFF of `frames` 1-pixel frames sharing one strip (Pillow takes minutes to write
    10,000 frames): a header, the strip, then the frames' directories in a chain."""
    ifd_size = 2 + 8 * 12 + 4
    out = bytearray(b"II*\x00" + struct.pack("<I", 10) + b"\x00\x00")  # strip at 8
    for n in range(frames):
        at = 10 + n * ifd_size
        nxt = at + ifd_size if n + 1 < frames else 0
        entries = [(256, 3, 1), (257, 3, 1), (258, 3, 1), (259, 3, 1), (262, 3, 1),
                   (273, 4, 8), (278, 3, 1), (279, 4, 1)]  # (tag, type, value)
        out += struct.pack("<H", len(entries))
        for tag, kind, value in entries:
            out += struct.pack("<HHII", tag, kind, 1, value)
        out += struct.pack("<I", nxt)
    return bytes(out)


def huge_xlsx(rows: int, columns: int) -> bytes:
    """An XLSX of one sheet holding `rows` x `columns` numbers, written by hand (about a
    megabyte on disk for a million cells)."""
    main = "application/vnd.openxmlformats-officedocument.spreadsheetml"
    rels = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
    package = "http://schemas.openxmlformats.org/package/2006/relationships"
    row = "<row>" + "<c><v>7</v></c>" * columns + "</row>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", (
            '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
            'content-types"><Default Extension="rels" ContentType="application/vnd.'
            'openxmlformats-package.relationships+xml"/><Default Extension="xml" '
            'ContentType="application/xml"/><Override PartName="/xl/workbook.xml" '
            f'ContentType="{main}.sheet.main+xml"/><Override PartName="/xl/worksheets/'
            f'sheet1.xml" ContentType="{main}.worksheet+xml"/></Types>'))
        archive.writestr("_rels/.rels", (
            f'<?xml version="1.0"?><Relationships xmlns="{package}"><Relationship Id="r1" '
            f'Type="{rels}/officeDocument" Target="xl/workbook.xml"/></Relationships>'))
        archive.writestr("xl/workbook.xml", (
            '<?xml version="1.0"?><workbook xmlns="http://schemas.openxmlformats.org/'
            f'spreadsheetml/2006/main" xmlns:r="{rels}"><sheets><sheet name="Cells" '
            'sheetId="1" r:id="r1"/></sheets></workbook>'))
        archive.writestr("xl/_rels/workbook.xml.rels", (
            f'<?xml version="1.0"?><Relationships xmlns="{package}"><Relationship Id="r1" '
            f'Type="{rels}/worksheet" Target="worksheets/sheet1.xml"/></Relationships>'))
        with archive.open("xl/worksheets/sheet1.xml", "w") as member:
            member.write(b'<?xml version="1.0"?><worksheet xmlns="http://schemas.'
                         b'openxmlformats.org/spreadsheetml/2006/main"><sheetData>')
            for _ in range(rows):
                member.write(row.encode())
            member.write(b"</sheetData></worksheet>")
    return out.getvalue()
