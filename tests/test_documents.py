"""Document conversion (``pagesift.primary.documents``): real files in, text and metadata out.

PDFs are written by ``tests.pdfmaker`` (a real PDF 1.4 writer) or shipped under
``tests/fixtures/documents/`` (the encrypted one; its README says how it was made).
OOXML, ODF and EPUB files are built here with ``zipfile`` from the parts their
specifications require, the same parts Word, PowerPoint, Excel, LibreOffice and EPUB
tools write. Each bad input (truncated, encrypted, random, zip bomb, DTD) must raise
``DocumentError`` within the module's caps.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import time
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from pagesift.primary import documents
from pagesift.primary.documents import DocumentError, convert, convert_compact, kind_of
from pagesift.primary.fetch import HttpEngine
from pagesift.shared.errors import ErrorCode, PageError
from pagesift.v1 import jobs_pb2
from tests.helpers import all_documents, in_process_node, node_config, serve_handler, wait_terminal
from tests.pdfmaker import text_pdf

FIXTURES = Path(__file__).parent / "fixtures" / "documents"
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
P = "http://schemas.openxmlformats.org/presentationml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
XML = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'


def pages_pdf(n: int, **info: str) -> bytes:
    return text_pdf(
        [[f"Page {i} heading", f"body text of page {i}"] for i in range(1, n + 1)], **info
    )


def zipped(parts: dict[str, str | bytes], first: tuple[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        if first is not None:  # ODF/EPUB: "mimetype" first, stored
            z.writestr(first[0], first[1], compress_type=zipfile.ZIP_STORED)
        for name, data in parts.items():
            z.writestr(name, data)
    return buf.getvalue()


def core_props(title: str, author: str) -> str:
    return (
        XML + '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/'
        'metadata/core-properties" xmlns:dc="http://purl.org/dc/elements/1.1/" '
        'xmlns:dcterms="http://purl.org/dc/terms/" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
        f"<dc:title>{title}</dc:title><dc:creator>{author}</dc:creator>"
        "<cp:keywords>alpha, beta</cp:keywords>"
        '<dcterms:created xsi:type="dcterms:W3CDTF">2024-05-06T07:08:09Z</dcterms:created>'
        '<dcterms:modified xsi:type="dcterms:W3CDTF">2024-06-07T08:09:10Z</dcterms:modified>'
        "</cp:coreProperties>"
    )


def ooxml(main: str, content_type: str, parts: dict[str, str | bytes]) -> bytes:
    types = (
        XML + f'<Types xmlns="{CT}"><Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/{main}" ContentType="{content_type}"/></Types>'
    )
    rels = (
        XML + f'<Relationships xmlns="{PKG_REL}">'
        f'<Relationship Id="rId1" Type="{DOC_REL}/officeDocument" Target="{main}"/>'
        f'<Relationship Id="rId2" Type="{PKG_REL}/metadata/core-properties" '
        'Target="docProps/core.xml"/></Relationships>'
    )
    return zipped({"[Content_Types].xml": types, "_rels/.rels": rels, **parts})


def make_docx() -> bytes:
    def para(text: str, style: str = "") -> str:
        ppr = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
        return f"<w:p>{ppr}<w:r><w:t>{text}</w:t></w:r></w:p>"

    def row(*cells: str) -> str:
        return "<w:tr>" + "".join(f"<w:tc>{para(c)}</w:tc>" for c in cells) + "</w:tr>"

    body = (
        para("Quarterly report", "Title")
        + para("Introduction", "Heading1")
        + '<w:p><w:r><w:t xml:space="preserve">First </w:t></w:r>'
        "<w:r><w:t>paragraph.</w:t></w:r></w:p>"
        + f"<w:tbl>{row('Name', 'Score')}{row('Ada', '10')}</w:tbl>"
        + para("Closing words.")
    )
    document = XML + f'<w:document xmlns:w="{W}"><w:body>{body}</w:body></w:document>'
    app = (
        XML
        + "<Properties><Application>Microsoft Office Word</Application>"
        + "<Pages>3</Pages></Properties>"
    )
    return ooxml(
        "word/document.xml",
        DOCX + ".main+xml",
        {
            "word/document.xml": document,
            "docProps/core.xml": core_props("The report", "Ada Lovelace"),
            "docProps/app.xml": app,
        },
    )


def make_pptx(slides: int) -> bytes:
    ids = "".join(f'<p:sldId id="{256 + i}" r:id="rId{i}"/>' for i in range(1, slides + 1))
    pres = (
        XML + f'<p:presentation xmlns:p="{P}" xmlns:r="{DOC_REL}">'
        f"<p:sldIdLst>{ids}</p:sldIdLst></p:presentation>"
    )
    rels = (
        XML
        + f'<Relationships xmlns="{PKG_REL}">'
        + "".join(
            # listed in reverse: the order must come from sldIdLst, not from the rels
            f'<Relationship Id="rId{i}" Type="{DOC_REL}/slide" Target="slides/slide{i}.xml"/>'
            for i in range(slides, 0, -1)
        )
        + "</Relationships>"
    )
    parts: dict[str, str | bytes] = {
        "ppt/presentation.xml": pres,
        "ppt/_rels/presentation.xml.rels": rels,
        "docProps/core.xml": core_props("Deck", "Grace Hopper"),
    }
    for i in range(1, slides + 1):
        parts[f"ppt/slides/slide{i}.xml"] = (
            XML + f'<p:sld xmlns:p="{P}" xmlns:a="{A}"><p:cSld><p:spTree><p:sp><p:txBody>'
            f"<a:p><a:r><a:t>Slide {i} title</a:t></a:r></a:p>"
            f"<a:p><a:r><a:t>point </a:t></a:r><a:r><a:t>{i}</a:t></a:r></a:p>"
            "</p:txBody></p:sp></p:spTree></p:cSld></p:sld>"
        )
    return ooxml("ppt/presentation.xml", PPTX + ".main+xml", parts)


def make_xlsx() -> bytes:
    book = (
        XML + f'<workbook xmlns="{S}" xmlns:r="{DOC_REL}"><sheets>'
        '<sheet name="Sales" sheetId="1" r:id="rId1"/><sheet name="Empty" sheetId="2" r:id="rId2"/>'
        "</sheets></workbook>"
    )
    rels = (
        XML + f'<Relationships xmlns="{PKG_REL}">'
        f'<Relationship Id="rId1" Type="{DOC_REL}/worksheet" Target="worksheets/sheet1.xml"/>'
        f'<Relationship Id="rId2" Type="{DOC_REL}/worksheet" Target="worksheets/sheet2.xml"/>'
        f'<Relationship Id="rId3" Type="{DOC_REL}/sharedStrings" Target="sharedStrings.xml"/>'
        "</Relationships>"
    )
    strings = (
        XML + f'<sst xmlns="{S}"><si><t>Region</t></si><si><t>Total</t></si>'
        "<si><r><t>No</t></r><r><t>rth</t></r></si></sst>"
    )
    sheet1 = (
        XML + f'<worksheet xmlns="{S}"><sheetData>'
        '<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c></row>'
        '<row r="2"><c r="A2" t="s"><v>2</v></c><c r="C2"><v>42.5</v></c></row>'
        '<row r="3"><c r="A3" t="inlineStr"><is><t>South</t></is></c><c r="B3" t="b"><v>1</v></c>'
        "</row></sheetData></worksheet>"
    )
    sheet2 = XML + f'<worksheet xmlns="{S}"><sheetData/></worksheet>'
    return ooxml(
        "xl/workbook.xml",
        XLSX + ".main+xml",
        {
            "xl/workbook.xml": book,
            "xl/_rels/workbook.xml.rels": rels,
            "xl/sharedStrings.xml": strings,
            "xl/worksheets/sheet1.xml": sheet1,
            "xl/worksheets/sheet2.xml": sheet2,
            "docProps/core.xml": core_props("Figures", "Edsger"),
        },
    )


ODF_NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:meta="urn:oasis:names:tc:opendocument:xmlns:meta:1.0" '
    'xmlns:dc="http://purl.org/dc/elements/1.1/"'
)


def make_odt() -> bytes:
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


def make_epub() -> bytes:
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
    body = pages_pdf(
        1,
        title="Annual (final) report",
        author="Ada Lovelace",
        created="D:20240102030405Z",
        modified="D:20240203040506+01'00'",
    )
    got = convert(body, PDF, "u", max_pages=None)
    assert got.title == "Annual (final) report"
    assert got.author == "Ada Lovelace"
    assert got.created == "2024-01-02T03:04:05Z"
    assert got.modified == "2024-02-03T04:05:06+01:00"
    assert got.metadata["producer"] == "pagesift tests"
    assert got.metadata["pdf_version"] == "1.4"


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_a_truncated_pdf_is_refused(cut: float) -> None:
    body = pages_pdf(10)
    with pytest.raises(DocumentError, match="truncated"):
        convert(body[: int(len(body) * cut)], PDF, "u", max_pages=None)


def test_an_encrypted_pdf_is_refused_as_needing_a_password() -> None:
    body = (FIXTURES / "encrypted.pdf").read_bytes()
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
    assert got.num_pages == 3
    assert got.metadata["keywords"] == "alpha, beta"
    assert got.metadata["application"] == "Microsoft Office Word"


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


def test_xlsx_yields_each_sheet_as_a_markdown_table() -> None:
    got = convert(make_xlsx(), XLSX, "u", max_pages=None)
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
    assert got.title == "Figures"


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
    monkeypatch.setattr(documents, "MAX_ZIP_MEMBERS", 5)
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
    "xlsx": (XLSX, ".xlsx", make_xlsx),
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
    tmp_path: Path,
) -> None:
    config = node_config(tmp_path, extract_processes=1, document_timeout=0.000_001)
    engine = HttpEngine(config)

    async def site(request: web.Request) -> web.StreamResponse:
        return web.Response(body=pages_pdf(2), headers={"Content-Type": PDF})

    try:
        async with serve_handler(site) as port:
            url = f"http://127.0.0.1:{port}/slow.pdf"
            with pytest.raises(PageError) as info:
                await engine.scrape(url, jobs_pb2.ScrapeOptions())
            assert info.value.code == ErrorCode.PARSE_FAILED
            assert "took over" in info.value.message
            engine.config = replace(config, document_timeout=30.0)
            page = await engine.scrape(url, jobs_pb2.ScrapeOptions())
            assert page.document.num_pages == 2
    finally:
        await engine.close()


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
