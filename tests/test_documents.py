"""Document conversion (``extract.documents``): real files in, text and metadata out.

The well-formed documents are written in the test by maintained writer libraries (the
``dev`` extra): PDFs by fpdf2 (also the encrypted one), DOCX by python-docx, PPTX by
python-pptx, XLSX by both XlsxWriter (shared strings, as Excel writes them) and
openpyxl (inline strings). Three kinds of file are still built by hand here, with
``zipfile`` from the parts their specifications require: ODT (odfpy, the one Python ODF
writer, has had no release since 1.4.1 in January 2020), EPUB (EbookLib is AGPL-3.0,
a licence this project avoids even for tests), and the malformed inputs no
writer produces (zip bombs, lying zip headers, XML with a DTD, truncations, random
bytes). Each bad input must raise ``DocumentError`` within the module's caps.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import docx
import grpc
import openpyxl
import pptx
import pypdfium2 as pdfium
import pytest
import xlsxwriter
from aiohttp import web
from fpdf import FPDF
from fpdf.enums import XPos, YPos
from openpyxl.cell.rich_text import CellRichText, TextBlock
from openpyxl.cell.text import InlineFont

from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.extract import zipguard
from pagesift.primary.extract.converted import DocumentError
from pagesift.primary.extract.documents import convert, convert_compact, kind_of
from pagesift.v1 import jobs_pb2
from tests.helpers import (
    EngineMaker,
    all_documents,
    in_process_node,
    node_config,
    serve_handler,
    wait_terminal,
)
from tests.pdfmaker import text_pdf as hand_made_pdf

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
ODT = "application/vnd.oasis.opendocument.text"
EPUB = "application/epub+zip"

CT = "http://schemas.openxmlformats.org/package/2006/content-types"
PKG_REL = "http://schemas.openxmlformats.org/package/2006/relationships"
DOC_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
XML = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'


# -- documents made by writer libraries -------------------------------------------------


def text_pdf(
    pages: Sequence[Sequence[str]],
    *,
    title: str = "",
    author: str = "",
    created: datetime | None = None,
    user_password: str = "",
) -> bytes:
    """An fpdf2 PDF whose page ``i`` shows the lines ``pages[i]`` (Helvetica), with the
    Info entries given, encrypted (RC4-128, the standard security handler; fpdf2's AES
    needs ``cryptography``) when ``user_password`` is set."""
    pdf = FPDF()
    pdf.set_producer("pagesift tests")
    pdf.set_creation_date(created or datetime(2024, 1, 1, tzinfo=UTC))
    if title:
        pdf.set_title(title)
    if author:
        pdf.set_author(author)
    pdf.set_font("helvetica", size=12)
    for lines in pages:
        pdf.add_page()
        for line in lines:
            pdf.cell(text=line, new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    if user_password:
        pdf.set_encryption(owner_password="owner", user_password=user_password)
    return bytes(pdf.output())


def pages_pdf(n: int, *, title: str = "", author: str = "") -> bytes:
    lines = [[f"Page {i} heading", f"body text of page {i}"] for i in range(1, n + 1)]
    return text_pdf(lines, title=title, author=author)


def saved(document: docx.document.Document | pptx.presentation.Presentation) -> bytes:
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


def make_docx() -> bytes:
    """python-docx's default template: its styles (``Title``, ``Heading1``) and its
    ``docProps/app.xml`` (Pages 1, Application "Microsoft Macintosh Word")."""
    document = docx.Document()
    document.add_paragraph("Quarterly report", style="Title")
    document.add_heading("Introduction", level=1)
    paragraph = document.add_paragraph()
    paragraph.add_run("First ")  # two runs, one paragraph
    paragraph.add_run("paragraph.")
    table = document.add_table(rows=2, cols=2)
    for r, row in enumerate([("Name", "Score"), ("Ada", "10")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.add_paragraph("Closing words.")
    props = document.core_properties
    props.title, props.author, props.keywords = "The report", "Ada Lovelace", "alpha, beta"
    props.created = datetime(2024, 5, 6, 7, 8, 9)
    props.modified = datetime(2024, 6, 7, 8, 9, 10)
    return saved(document)


def make_pptx(slides: int) -> bytes:
    """``slides`` "Title and Content" slides, added last first and then moved into
    order (as dragging them in PowerPoint does): the part names and relationship ids
    run against the presentation order, which must come from ``sldIdLst``."""
    deck = pptx.Presentation()
    for i in range(slides, 0, -1):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        assert slide.shapes.title is not None
        slide.shapes.title.text = f"Slide {i} title"
        paragraph = slide.placeholders[1].text_frame.paragraphs[0]
        paragraph.add_run().text = "point "  # two runs, one paragraph
        paragraph.add_run().text = str(i)
    ids = deck.slides._sldIdLst  # python-pptx has no public reorder
    for sld_id in list(ids)[::-1]:
        ids.remove(sld_id)
        ids.append(sld_id)
    deck.core_properties.author = "Grace Hopper"
    return saved(deck)


def make_xlsx_xlsxwriter() -> bytes:
    """Shared strings (one a rich string of two runs), as Excel writes them."""
    buf = io.BytesIO()
    book = xlsxwriter.Workbook(buf, {"in_memory": True})
    sales = book.add_worksheet("Sales")
    bold = book.add_format({"bold": True})
    sales.write("A1", "Region")
    sales.write("B1", "Total")
    sales.write_rich_string("A2", "No", bold, "rth")
    sales.write("C2", 42.5)
    sales.write("A3", "South")
    sales.write("B3", True)
    book.add_worksheet("Empty")
    book.set_properties({"title": "Figures", "author": "Edsger"})
    book.close()
    return buf.getvalue()


def make_xlsx_openpyxl() -> bytes:
    """Inline strings (``t="inlineStr"``, one of two runs): openpyxl writes no shared
    strings."""
    book = openpyxl.Workbook()
    sales = book.active
    assert sales is not None
    sales.title = "Sales"
    sales["A1"], sales["B1"] = "Region", "Total"
    sales["A2"] = CellRichText(["No", TextBlock(InlineFont(b=True), "rth")])
    sales["C2"] = 42.5
    sales["A3"], sales["B3"] = "South", True
    book.create_sheet("Empty")
    book.properties.title, book.properties.creator = "Figures", "Edsger"
    buf = io.BytesIO()
    book.save(buf)
    return buf.getvalue()


def make_epub() -> bytes:
    """Two chapters whose spine order is the reverse of their manifest order (made by hand:
    the maintained EPUB writer, EbookLib, is AGPL-3.0, a licence this project avoids)."""
    container = (
        XML + '<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
        '<rootfiles><rootfile full-path="OEBPS/content.opf" '
        'media-type="application/oebps-package+xml"/></rootfiles></container>'
    )
    opf = (
        XML + '<package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
        '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>A Small Book</dc:title>'
        "<dc:creator>Mary Shelley</dc:creator><dc:date>1818-01-01</dc:date>"
        "<dc:language>en</dc:language>"
        '<meta property="dcterms:modified">2020-01-01T00:00:00Z</meta></metadata>'
        '<manifest><item id="c1" href="one.xhtml" media-type="application/xhtml+xml"/>'
        '<item id="c2" href="two.xhtml" media-type="application/xhtml+xml"/></manifest>'
        '<spine><itemref idref="c2"/><itemref idref="c1"/></spine></package>'
    )

    def chapter(title: str, text: str) -> str:
        return (
            XML + '<html xmlns="http://www.w3.org/1999/xhtml"><head><title>x</title></head>'
            f"<body><h1>{title}</h1><p>{text}</p></body></html>"
        )

    return zipped(
        {
            "META-INF/container.xml": container,
            "OEBPS/content.opf": opf,
            "OEBPS/one.xhtml": chapter("Letter One", "Second in the spine."),
            "OEBPS/two.xhtml": chapter("Preface", "First in the spine."),
        },
        first=("mimetype", EPUB.encode()),
    )


# -- documents made by hand ---------------------------------------------------------------


def zipped(parts: dict[str, str | bytes], first: tuple[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        if first is not None:  # ODF/EPUB: "mimetype" first, stored
            z.writestr(first[0], first[1], compress_type=zipfile.ZIP_STORED)
        for name, data in parts.items():
            z.writestr(name, data)
    return buf.getvalue()


def ooxml(main: str, content_type: str, parts: dict[str, str | bytes]) -> bytes:
    """A bare OOXML package around ``parts``, for the malformed documents."""
    types = (
        XML + f'<Types xmlns="{CT}"><Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/{main}" ContentType="{content_type}"/></Types>'
    )
    rels = (
        XML + f'<Relationships xmlns="{PKG_REL}">'
        f'<Relationship Id="rId1" Type="{DOC_REL}/officeDocument" Target="{main}"/>'
        "</Relationships>"
    )
    return zipped({"[Content_Types].xml": types, "_rels/.rels": rels, **parts})


ODF_NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:meta="urn:oasis:names:tc:opendocument:xmlns:meta:1.0" '
    'xmlns:dc="http://purl.org/dc/elements/1.1/"'
)


def make_odt() -> bytes:
    """Hand-made: see the module docstring (no maintained ODF writer)."""
    content = (
        XML + f"<office:document-content {ODF_NS}><office:body><office:text>"
        '<text:h text:outline-level="2">Methods</text:h>'
        '<text:p>We <text:span>measured</text:span> it.<text:s text:c="2"/>Twice.</text:p>'
        "<text:list><text:list-item><text:p>an item</text:p></text:list-item></text:list>"
        "</office:text></office:body></office:document-content>"
    )
    meta = (
        XML + f"<office:document-meta {ODF_NS}><office:meta><dc:title>Lab notes</dc:title>"
        "<meta:initial-creator>Rosalind</meta:initial-creator>"
        "<meta:creation-date>2023-01-02T03:04:05</meta:creation-date>"
        "<dc:date>2023-02-03T04:05:06</dc:date>"
        '<meta:document-statistic meta:page-count="2"/></office:meta></office:document-meta>'
    )
    return zipped({"content.xml": content, "meta.xml": meta}, first=("mimetype", ODT.encode()))


# -- PDF --------------------------------------------------------------------------


def test_a_multi_page_pdf_yields_its_text_in_page_order_with_page_separators() -> None:
    got = convert(pages_pdf(5), PDF, "https://example.com/r.pdf", max_pages=None)
    assert got.kind == "pdf" and got.num_pages == 5
    positions = [got.markdown.index(f"<!-- page {i} -->") for i in range(1, 6)]
    assert positions == sorted(positions)
    texts = [got.markdown.index(f"body text of page {i}") for i in range(1, 6)]
    assert texts == sorted(texts)
    assert all(p < t for p, t in zip(positions, texts, strict=True))
    assert "truncated" not in got.metadata


def test_max_pages_stops_early_and_says_so_while_num_pages_counts_all() -> None:
    got = convert(pages_pdf(20), PDF, "u", max_pages=3)
    assert got.num_pages == 20
    assert "body text of page 3" in got.markdown
    assert "page 4" not in got.markdown
    assert got.metadata["truncated"] == "max_pages"


def test_the_character_cap_cuts_the_markdown_and_says_so() -> None:
    got = convert(pages_pdf(50), PDF, "u", max_pages=None, max_chars=300)
    assert len(got.markdown) <= 300
    assert got.metadata["truncated"] == "max_chars"


def test_pdf_metadata_title_author_and_dates_come_out_as_iso_8601() -> None:
    body = text_pdf(
        [["one page"]],
        title="Annual (final) report",
        author="Ada Lovelace",
        created=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),  # D:20240102030405Z
    )
    got = convert(body, PDF, "u", max_pages=None)
    assert got.title == "Annual (final) report"
    assert got.author == "Ada Lovelace"
    assert got.created == "2024-01-02T03:04:05Z"
    assert got.modified == ""  # fpdf2 writes no ModDate
    assert got.metadata["producer"] == "pagesift tests"
    assert got.metadata["pdf_version"] == "1.3"  # fpdf2's default header
    plus_one = timezone(timedelta(hours=1))  # D:20240203040506+01'00'
    body = text_pdf([["one page"]], created=datetime(2024, 2, 3, 4, 5, 6, tzinfo=plus_one))
    assert convert(body, PDF, "u", max_pages=None).created == "2024-02-03T04:05:06+01:00"


def test_pdf_mod_date_comes_out_as_modified() -> None:
    # fpdf2 cannot write /ModDate, so this one Info dictionary is hand-made (tests.pdfmaker)
    body = hand_made_pdf([["one page"]], modified="D:20240203040506+01'00'")
    assert convert(body, PDF, "u", max_pages=None).modified == "2024-02-03T04:05:06+01:00"


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_a_truncated_pdf_is_refused(cut: float) -> None:
    body = pages_pdf(10)
    with pytest.raises(DocumentError, match="truncated"):
        convert(body[: int(len(body) * cut)], PDF, "u", max_pages=None)


def test_an_encrypted_pdf_is_refused_as_needing_a_password() -> None:
    body = text_pdf([["Secret page one"], ["Secret page two"]], user_password="secret")
    assert len(pdfium.PdfDocument(body, password="secret")) == 2  # a sound file, only locked
    with pytest.raises(DocumentError, match="password"):
        convert(body, PDF, "u", max_pages=None)


def test_random_bytes_served_as_pdf_are_refused() -> None:
    body = random.Random(7).randbytes(50_000)
    with pytest.raises(DocumentError):
        convert(body, PDF, "u", max_pages=None)
    with pytest.raises(DocumentError):
        convert(b"%PDF-1.7\n" + body + b"\n%%EOF\n", PDF, "u", max_pages=None)


def test_an_unsupported_type_is_refused() -> None:
    with pytest.raises(DocumentError, match="not a supported document"):
        convert(b"GIF89a....", "image/gif", "u", max_pages=None)


def test_a_result_and_an_error_cross_a_process_boundary() -> None:
    got = convert_compact(pages_pdf(2), PDF, "u", None, 1000)
    assert pickle.loads(pickle.dumps(got)) == got
    err = pickle.loads(pickle.dumps(DocumentError("encrypted PDF")))
    assert isinstance(err, DocumentError) and err.reason == "encrypted PDF"


# -- office formats ------------------------------------------------------------------


def test_docx_yields_headings_paragraphs_tables_and_core_properties() -> None:
    got = convert(make_docx(), DOCX, "u", max_pages=None)
    assert got.kind == "docx"
    lines = got.markdown.strip().split("\n\n")
    assert lines[:4] == ["# Quarterly report", "# Introduction", "First paragraph.", lines[3]]
    assert lines[3].splitlines() == ["| Name | Score |", "| --- | --- |", "| Ada | 10 |"]
    assert lines[4] == "Closing words."
    assert (got.title, got.author) == ("The report", "Ada Lovelace")
    assert (got.created, got.modified) == ("2024-05-06T07:08:09Z", "2024-06-07T08:09:10Z")
    assert got.num_pages == 1  # docProps/app.xml <Pages> of python-docx's template
    assert got.metadata["keywords"] == "alpha, beta"
    assert got.metadata["application"] == "Microsoft Macintosh Word"


def test_pptx_yields_slides_in_presentation_order_and_max_pages_counts_slides() -> None:
    got = convert(make_pptx(4), PPTX, "u", max_pages=None)
    assert got.kind == "pptx" and got.num_pages == 4
    order = [got.markdown.index(f"<!-- slide {i} -->\n\nSlide {i} title") for i in range(1, 5)]
    assert order == sorted(order)
    assert "point 2" in got.markdown
    assert got.author == "Grace Hopper"
    cut = convert(make_pptx(4), PPTX, "u", max_pages=2)
    assert "Slide 2 title" in cut.markdown and "Slide 3" not in cut.markdown
    assert cut.metadata["truncated"] == "max_pages"


@pytest.mark.parametrize("make", [make_xlsx_xlsxwriter, make_xlsx_openpyxl])
def test_xlsx_yields_each_sheet_as_a_markdown_table(make: Callable[[], bytes]) -> None:
    got = convert(make(), XLSX, "u", max_pages=None)
    assert got.kind == "xlsx" and got.num_pages == 2
    assert got.markdown.splitlines()[:6] == [
        "## Sales",
        "",
        "| Region | Total |  |",
        "| --- | --- | --- |",
        "| North |  | 42.5 |",
        "| South | TRUE |  |",
    ]
    assert "## Empty" in got.markdown
    assert got.metadata["sheets"] == "Sales, Empty"
    assert (got.title, got.author) == ("Figures", "Edsger")
    cut = convert(make(), XLSX, "u", max_pages=1)
    assert "## Sales" in cut.markdown and "## Empty" not in cut.markdown
    assert cut.metadata["truncated"] == "max_pages"


def test_odt_yields_headings_and_paragraphs_and_its_meta() -> None:
    got = convert(make_odt(), ODT, "u", max_pages=None)
    assert got.kind == "odt"
    assert got.markdown.split("\n\n") == ["## Methods", "We measured it.  Twice.", "an item\n"]
    assert (got.title, got.author, got.num_pages) == ("Lab notes", "Rosalind", 2)
    assert got.created == "2023-01-02T03:04:05"


def test_epub_yields_chapters_in_spine_order_and_its_metadata() -> None:
    got = convert(make_epub(), EPUB, "https://example.com/book.epub", max_pages=None)
    assert got.kind == "epub" and got.num_pages == 2
    assert got.markdown.index("Preface") < got.markdown.index("Letter One")
    assert "<!-- chapter 1 -->" in got.markdown
    assert (got.title, got.author, got.created) == ("A Small Book", "Mary Shelley", "1818-01-01")
    assert got.modified == "2020-01-01T00:00:00Z"
    assert got.metadata["language"] == "en"


def test_a_password_protected_office_file_is_refused() -> None:
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(4096)  # what Office writes encrypted
    with pytest.raises(DocumentError, match="encrypted"):
        convert(ole, DOCX, "u", max_pages=None)


def test_a_truncated_docx_is_refused() -> None:
    body = make_docx()
    with pytest.raises(DocumentError):
        convert(body[: len(body) // 2], DOCX, "u", max_pages=None)


def test_a_zip_bomb_is_refused_within_bounds() -> None:
    # 256 MiB of zeros deflate to ~256 KiB; the reader must stop at the member cap
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", XML + f'<Types xmlns="{CT}"/>')
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            chunk = bytes(1 << 20)
            for _ in range(256):
                f.write(chunk)
    body = buf.getvalue()
    assert len(body) < 4 << 20
    t0 = time.monotonic()
    with pytest.raises(DocumentError, match="size cap"):
        convert(body, DOCX, "u", max_pages=None)
    assert time.monotonic() - t0 < 10


def test_a_zip_whose_headers_understate_a_member_size_is_refused() -> None:
    body = bytearray(make_docx())
    with zipfile.ZipFile(io.BytesIO(bytes(body))) as z:
        info = z.getinfo("word/document.xml")
    assert info.file_size > 10
    # claim 10 bytes in both the local header and the central directory record
    body[info.header_offset + 22 : info.header_offset + 26] = (10).to_bytes(4, "little")
    central = bytes(body).rindex(b"word/document.xml") - 46  # the name ends the record
    body[central + 24 : central + 28] = (10).to_bytes(4, "little")
    with pytest.raises(DocumentError, match=r"word/document\.xml"):
        convert(bytes(body), DOCX, "u", max_pages=None)


def test_too_many_zip_members_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zipguard, "MAX_ZIP_MEMBERS", 5)
    with pytest.raises(DocumentError, match="members"):
        convert(make_pptx(6), PPTX, "u", max_pages=None)


def test_xml_with_a_dtd_is_refused_before_any_entity_expands() -> None:
    laughs = (
        '<?xml version="1.0"?><!DOCTYPE w [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
        f'<w:document xmlns:w="{W}"><w:body><w:p><w:r><w:t>&b;</w:t></w:r></w:p>'
        "</w:body></w:document>"
    )
    body = ooxml("word/document.xml", DOCX, {"word/document.xml": laughs})
    with pytest.raises(DocumentError, match="DTD"):
        convert(body, DOCX, "u", max_pages=None)


# -- recognising documents -----------------------------------------------------------

SAMPLES: dict[str, tuple[str, str, Callable[[], bytes]]] = {
    "pdf": (PDF, ".pdf", lambda: pages_pdf(1)),
    "docx": (DOCX, ".docx", make_docx),
    "pptx": (PPTX, ".pptx", lambda: make_pptx(1)),
    "xlsx": (XLSX, ".xlsx", make_xlsx_xlsxwriter),
    "odt": (ODT, ".odt", make_odt),
    "epub": (EPUB, ".epub", make_epub),
}


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_kind_of_recognises_a_document_by_its_content_type(kind: str) -> None:
    mime, _, _ = SAMPLES[kind]
    assert kind_of(mime, "https://example.com/x", b"") == kind
    assert kind_of(mime.upper() + "; charset=binary", "https://example.com/x", b"") == kind


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_kind_of_recognises_a_document_by_its_magic_bytes(kind: str) -> None:
    _, _, make = SAMPLES[kind]
    head = make()[:4096]
    assert kind_of("application/octet-stream", "https://example.com/download", head) == kind
    assert kind_of("", "https://example.com/download", head) == kind


def test_kind_of_recognises_an_openpyxl_workbook_by_its_first_bytes() -> None:
    # openpyxl writes docProps/, xl/theme/, xl/worksheets/ and xl/styles.xml first and
    # [Content_Types].xml, _rels/.rels and xl/workbook.xml last, so the 4 KiB head the
    # engine sniffs (fetch.py: body[:4096]) holds none of the names _zip_kind looks for
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    for r in range(1, 3000):
        sheet.append([f"row {r}", r * 1.5, f"text {r * 7}"])
    buf = io.BytesIO()
    book.save(buf)
    body = buf.getvalue()
    assert kind_of("application/octet-stream", "https://example.com/download", body) == "xlsx"
    assert kind_of("", "https://example.com/download", body[:4096]) == "xlsx"


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_kind_of_falls_back_to_the_url_extension_for_a_generic_type(kind: str) -> None:
    _, ext, _ = SAMPLES[kind]
    url = f"https://example.com/files/report{ext.upper()}?download=1"
    assert kind_of("application/octet-stream", url, b"") == kind


def test_kind_of_leaves_html_text_and_images_alone() -> None:
    assert kind_of("text/html", "https://example.com/a.pdf", b"<!doctype html>") is None
    assert kind_of("image/png", "https://example.com/a.png", b"\x89PNG\r\n") is None
    assert (
        kind_of("application/zip", "https://example.com/a.zip", b"PK\x03\x04" + bytes(60)) is None
    )
    assert kind_of("application/octet-stream", "https://example.com/blob", os.urandom(64)) is None


# --- through the engine and a real crawl --------------------------------------------------------


async def test_a_crawl_converts_the_documents_it_links_and_fails_broken_ones_as_parse_failed(
    tmp_path: Path,
) -> None:
    manual_a = pages_pdf(3, title="Manual A", author="Ada")
    manual_b = pages_pdf(7, title="Manual B")
    bodies: dict[str, tuple[bytes, str]] = {
        "/manual-a.pdf": (manual_a, PDF),
        "/files/manual-b": (manual_b, "application/pdf; charset=binary"),
        "/report.docx": (make_docx(), DOCX),
        "/download/c.pdf": (pages_pdf(2), "application/octet-stream"),  # by extension
        "/broken.pdf": (manual_a[: len(manual_a) // 2], PDF),
        "/photo.png": (b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png"),
    }

    async def site(request: web.Request) -> web.StreamResponse:
        if request.path == "/":
            anchors = "".join(f'<a href="{p}">{p}</a>' for p in bodies)
            return web.Response(
                text=f"<html><body>{anchors}</body></html>", content_type="text/html"
            )
        if request.path in bodies:
            body, ctype = bodies[request.path]
            return web.Response(body=body, headers={"Content-Type": ctype})
        raise web.HTTPNotFound()

    async with (
        serve_handler(site) as port,
        in_process_node(tmp_path, respect_robots=False, extract_processes=1) as node,
    ):
        start = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(
                url=f"http://127.0.0.1:{port}/",
                sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
                options=jobs_pb2.ScrapeOptions(max_pages=5),
            )
        )
        job = await wait_terminal(node.stub, start.id, timeout=60)
        docs = {d.url.rsplit(str(port), 1)[1]: d for d in await all_documents(node.stub, start.id)}
        errors = (await node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=start.id))).errors
    assert job.state == jobs_pb2.JOB_STATE_COMPLETED, job.note
    assert sorted(docs) == [
        "/",
        "/download/c.pdf",
        "/files/manual-b",
        "/manual-a.pdf",
        "/report.docx",
    ]
    a = docs["/manual-a.pdf"]
    assert (a.title, a.num_pages, a.content_type) == ("Manual A", 3, PDF)
    assert a.metadata["source"] == "pdf" and a.metadata["author"] == "Ada"
    assert a.markdown.index("Page 1 heading") < a.markdown.index("Page 3 heading")
    b = docs["/files/manual-b"]
    assert b.num_pages == 7 and b.metadata["truncated"] == "max_pages"  # the job's max_pages
    assert "Page 5 heading" in b.markdown and "Page 6 heading" not in b.markdown
    assert docs["/report.docx"].metadata["source"] == "docx"
    assert docs["/download/c.pdf"].num_pages == 2
    by_path = {e.url.rsplit(str(port), 1)[1]: e.code for e in errors}
    assert by_path == {"/broken.pdf": "parse_failed", "/photo.png": "unsupported_content"}


async def test_a_conversion_past_document_timeout_is_parse_failed_and_the_pool_recovers(
    tmp_path: Path, make_engine: EngineMaker
) -> None:
    config = node_config(tmp_path, extract_processes=1, document_timeout=0.000_001)
    engine = await make_engine(config)

    async def site(request: web.Request) -> web.StreamResponse:
        return web.Response(body=pages_pdf(2), headers={"Content-Type": PDF})

    async with serve_handler(site) as port:
        url = f"http://127.0.0.1:{port}/slow.pdf"
        with pytest.raises(PageError) as info:
            await engine.scrape(url, jobs_pb2.ScrapeOptions())
        assert info.value.code == ErrorCode.PARSE_FAILED
        assert "took over" in info.value.message
        engine.pages.config = replace(config, document_timeout=30.0)
        page = await engine.scrape(url, jobs_pb2.ScrapeOptions())
        assert page.document.num_pages == 2


async def test_max_pages_above_the_server_cap_is_invalid_argument_naming_the_field(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path, max_document_pages=10) as node:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await node.stub.Scrape(
                jobs_pb2.ScrapeRequest(
                    url="http://127.0.0.1:1/x.pdf", options=jobs_pb2.ScrapeOptions(max_pages=11)
                )
            )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("options.max_pages: 11 is outside 0..10")
