"""Hostile documents (issue 19, finding 4): each is refused by a cap that its error
names, or read within its budget, and the conversion's memory stays flat.

Memory is measured where it is spent: each hostile file is converted in a fresh Python
process (``_CHILD``) that reports how far its peak RSS (``ru_maxrss``) grew during the
conversion alone (the body is loaded, and the modules imported, before the first
reading). Sizes are scaled down from the finding's so that each conversion takes well
under a second here; on the code of the finding each one grew the process by several
times the bound asserted (the figure is in each case's comment, measured with
``tests.hostile.documents`` at these sizes).

The caps themselves (depth, elements, held subtree, cells, PDF streams) are checked in
process with the modules' constants lowered, and the hardened parser with DTDs in the
encodings a byte search misses.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from pagesift.primary.extract import ooxml, pdf, xmlparts
from pagesift.primary.extract.converted import DocumentError, DocumentTooLarge
from pagesift.primary.extract.documents import convert, kind_of
from pagesift.v1 import jobs_pb2
from tests import hostile
from tests.helpers import all_documents, in_process_node, wait_terminal
from tests.hostile import documents as hostile_docs
from tests.hostile import html as hostile_html
from tests.hostile.documents import DOCX, PDF, PPTX, XLSX

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
XML = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
MiB = 1024 * 1024

# Converts the file argv[1] (served as argv[2]) with the caps of argv[3] (JSON, keyed
# "module.NAME" within pagesift.primary.extract) set on their modules, and prints what
# happened and how far the peak RSS grew, in KiB.
_CHILD = r"""
import importlib, json, resource, sys
from pagesift.primary.extract import documents
body = open(sys.argv[1], "rb").read()
for key, value in json.loads(sys.argv[3]).items():
    module, name = key.split(".")
    setattr(importlib.import_module("pagesift.primary.extract." + module), name, value)
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # past the caps: MemoryError, not swap
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {}
try:
    conv = documents.convert(body, sys.argv[2], "https://example.com/x", max_pages=1000)
    out["truncated"] = conv.metadata.get("truncated", "")
except Exception as exc:
    out["error"] = type(exc).__name__
    out["reason"] = str(exc)
out["grew_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(out))
"""


def convert_in_child(
    tmp_path: Path, body: bytes, mimetype: str, caps: dict[str, int] | None = None
) -> dict[str, str | int]:
    path = tmp_path / "body"
    path.write_bytes(body)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), mimetype, json.dumps(caps or {})],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out: dict[str, str | int] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


# (name, body, type, caps set in the child, expected error class or "" for a result,
#  text the reason must hold (or the truncation), bound on the peak RSS growth in MiB)
HOSTILE: list[tuple[str, object, str, dict[str, int], str, str, int]] = [
    # 1 M characters x 99 references in UTF-16: the code of the finding grew by 192 MiB
    (
        "utf16-quadratic-entity-docx",
        lambda: hostile_docs.utf16_entity_docx(chars=1_000_000, refs=99),
        DOCX,
        {},
        "DocumentError",
        "declares a DTD",
        24,
    ),
    # 20,000 rows of one cell in column 512: the code of the finding grew by 165 MiB
    # (dense rows); read sparse, the table stops at the character budget (~3,200 rows)
    (
        "sparse-far-column-xlsx",
        lambda: hostile_docs.sparse_xlsx(rows=20_000),
        XLSX,
        {},
        "",
        "max_chars",
        48,
    ),
    # 500,000 empty elements: the code of the finding kept them all (+45 MiB) and read
    # on; here they are dropped as read, and the part cap (lowered to keep the test
    # short: the default is MAX_PART_ELEMENTS = 2 M) refuses the file
    (
        "empty-elements-docx",
        lambda: hostile_docs.empty_elements_docx(count=500_000),
        DOCX,
        {"xmlparts.MAX_PART_ELEMENTS": 400_000},
        "DocumentTooLarge",
        "MAX_PART_ELEMENTS",
        16,
    ),
    # 200,000 slide ids naming one slide: the code of the finding grew by 83 MiB and read
    # that slide 1,000 times
    (
        "slide-ids-pptx",
        lambda: hostile_docs.slide_ids_pptx(count=200_000),
        PPTX,
        {},
        "DocumentTooLarge",
        "MAX_SLIDES",
        16,
    ),
    # a 1 MiB PDF whose content stream inflates to 1 GiB: PDFium grew by 2,050 MiB
    (
        "inflating-pdf",
        lambda: hostile_docs.inflating_pdf(inflated=1 << 30),
        PDF,
        {},
        "DocumentTooLarge",
        "MAX_PDF_STREAM_BYTES",
        32,
    ),
]


@pytest.mark.parametrize(
    ("make", "mimetype", "caps", "error", "says", "bound_mib"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_a_hostile_document_is_refused_by_a_named_cap_or_cut_within_bounded_memory(
    tmp_path: Path,
    make: object,
    mimetype: str,
    caps: dict[str, int],
    error: str,
    says: str,
    bound_mib: int,
) -> None:
    assert callable(make)
    body = make()
    assert isinstance(body, bytes) and len(body) < 2 * MiB
    out = convert_in_child(tmp_path, body, mimetype, caps)
    if error:
        assert out.get("error") == error, out
        assert says in str(out["reason"]), out
    else:
        assert "error" not in out, out
        assert out["truncated"] == says, out
    assert int(out["grew_kib"]) < bound_mib * 1024, out


# -- the hardened parser ------------------------------------------------------------------


def package(main: str, content_type: str, parts: dict[str, bytes]) -> bytes:
    return hostile_docs._package(main, content_type, {k: [v] for k, v in parts.items()})


def docx_of(document_xml: bytes) -> bytes:
    return package("word/document.xml", DOCX, {"word/document.xml": document_xml})


def body_xml(inner: str) -> str:
    return f'<w:document xmlns:w="{W}"><w:body>{inner}</w:body></w:document>'


def para(text: str) -> str:
    return f"<w:p><w:r><w:t>{text}</w:t></w:r></w:p>"


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-8-sig"])
def test_a_dtd_is_refused_in_any_encoding_before_an_entity_expands(encoding: str) -> None:
    bom = {"utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff", "utf-8-sig": b""}[encoding]
    label = "UTF-8" if encoding == "utf-8-sig" else "UTF-16"
    xml = (
        f'<?xml version="1.0" encoding="{label}"?>'
        '<!DOCTYPE w [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>'
        + body_xml(para("&b;"))
    )
    body = docx_of(bom + xml.encode(encoding))
    assert b"<!DOCTYPE" not in zipfile.ZipFile(io.BytesIO(body)).read("word/document.xml") or (
        encoding == "utf-8-sig"
    )
    with pytest.raises(DocumentError, match="declares a DTD"):
        convert(body, DOCX, "u", max_pages=None)


def test_a_utf16_part_without_a_dtd_still_reads() -> None:
    xml = '<?xml version="1.0" encoding="UTF-16"?>' + body_xml(para("wide text"))
    conv = convert(docx_of(b"\xff\xfe" + xml.encode("utf-16-le")), DOCX, "u", max_pages=None)
    assert conv.markdown.strip() == "wide text"


def test_nesting_past_max_xml_depth_is_too_large() -> None:
    depth = xmlparts.MAX_XML_DEPTH
    deep = "<w:sdt>" * depth + para("deep") + "</w:sdt>" * depth
    with pytest.raises(DocumentTooLarge, match=r"deeper than \d+ \(MAX_XML_DEPTH\)"):
        convert(docx_of(body_xml(deep).encode()), DOCX, "u", max_pages=None)
    fine = "<w:sdt>" * (depth - 10) + para("deep") + "</w:sdt>" * (depth - 10)
    assert "deep" in convert(docx_of(body_xml(fine).encode()), DOCX, "u", max_pages=None).markdown


def test_one_paragraph_past_max_held_elements_is_too_large_but_many_small_ones_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(xmlparts, "MAX_HELD_ELEMENTS", 1_000)
    many = "".join(para(f"line {i}") for i in range(2_000))  # 8,000 elements, 4 a paragraph
    conv = convert(docx_of(body_xml(many).encode()), DOCX, "u", max_pages=None)
    assert "line 0" in conv.markdown and "line 1999" in conv.markdown
    runs = "<w:p>" + "<w:r><w:t>x</w:t></w:r>" * 600 + "</w:p>"  # 1,200 in one paragraph
    with pytest.raises(DocumentTooLarge, match="MAX_HELD_ELEMENTS"):
        convert(docx_of(body_xml(runs).encode()), DOCX, "u", max_pages=None)


def test_a_part_read_whole_past_max_held_elements_is_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(xmlparts, "MAX_HELD_ELEMENTS", 50)
    core = (
        XML + '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/'
        'metadata/core-properties">' + "<cp:keywords>k</cp:keywords>" * 60 + "</cp:coreProperties>"
    )
    body = package(
        "word/document.xml",
        DOCX,
        {"word/document.xml": body_xml(para("a")).encode(), "docProps/core.xml": core.encode()},
    )
    with pytest.raises(DocumentTooLarge, match=r"the part docProps/core\.xml .*MAX_HELD_ELEMENTS"):
        convert(body, DOCX, "u", max_pages=None)


def test_elements_across_parts_past_max_document_elements_are_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = docx_of(body_xml("".join(para(str(i)) for i in range(100))).encode())
    assert convert(body, DOCX, "u", max_pages=None).markdown
    monkeypatch.setattr(xmlparts, "MAX_DOCUMENT_ELEMENTS", 300)  # the body has ~400
    with pytest.raises(DocumentTooLarge, match="MAX_DOCUMENT_ELEMENTS"):
        convert(body, DOCX, "u", max_pages=None)


def xlsx_of(rows: list[str]) -> bytes:
    """A one-sheet XLSX whose sheetData holds ``rows`` (raw ``<row>`` XML)."""
    rel = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
    pkg = "http://schemas.openxmlformats.org/package/2006/relationships"
    return package(
        "xl/workbook.xml",
        XLSX,
        {
            "xl/workbook.xml": (
                XML + f'<workbook xmlns="{S}" xmlns:r="{rel}"><sheets>'
                '<sheet name="One" sheetId="1" r:id="rId1"/></sheets></workbook>'
            ).encode(),
            "xl/_rels/workbook.xml.rels": (
                XML + f'<Relationships xmlns="{pkg}"><Relationship Id="rId1" '
                f'Type="{rel}/worksheet" Target="worksheets/sheet1.xml"/></Relationships>'
            ).encode(),
            "xl/worksheets/sheet1.xml": (
                XML + f'<worksheet xmlns="{S}"><sheetData>' + "".join(rows) + "</sheetData>"
                "</worksheet>"
            ).encode(),
        },
    )


def test_a_cell_at_xfd1048576_is_dropped_and_far_cells_keep_their_column() -> None:
    body = xlsx_of(
        [
            '<row r="1"><c r="A1" t="inlineStr"><is><t>first</t></is></c>'
            '<c r="D1"><v>4</v></c></row>',
            '<row r="1048576"><c r="XFD1048576"><v>far</v></c><c r="B1048576"><v>2</v></c></row>',
        ]
    )
    conv = convert(body, XLSX, "u", max_pages=None)
    lines = conv.markdown.split("## One", 1)[1].strip().splitlines()
    assert lines == ["| first |  |  | 4 |", "| --- | --- | --- | --- |", "|  | 2 |  |  |"]
    assert "far" not in conv.markdown


def test_cells_past_max_sheet_cells_are_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        f'<row r="{i}"><c r="A{i}"><v>{i}</v></c><c r="B{i}"><v>1</v></c></row>'
        for i in range(1, 101)
    ]
    body = xlsx_of(rows)
    assert "| 100 | 1 |" in convert(body, XLSX, "u", max_pages=None).markdown
    monkeypatch.setattr(ooxml, "MAX_SHEET_CELLS", 150)
    with pytest.raises(DocumentTooLarge, match="MAX_SHEET_CELLS"):
        convert(body, XLSX, "u", max_pages=None)


def test_a_wide_sparse_sheet_is_cut_at_the_budget_counting_its_padding() -> None:
    rows = [f'<row r="{i}"><c r="SR{i}"><v>{i}</v></c></row>' for i in range(1, 2_001)]
    conv = convert(xlsx_of(rows), XLSX, "u", max_pages=None, max_chars=100_000)
    assert conv.metadata["truncated"] == "max_chars"
    assert len(conv.markdown) <= 100_001
    assert conv.markdown.count("\n| ") < 100  # ~1,540 characters a row of 512 cells


def test_pdf_streams_past_their_caps_are_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    body = hostile_docs.inflating_pdf(inflated=8 * MiB)
    conv = convert(body, PDF, "u", max_pages=None)  # under the default caps: PDFium reads it
    assert "an inflating page" in conv.markdown
    monkeypatch.setattr(pdf, "MAX_PDF_STREAM_BYTES", 4 * MiB)
    with pytest.raises(DocumentTooLarge, match="MAX_PDF_STREAM_BYTES"):
        convert(body, PDF, "u", max_pages=None)
    monkeypatch.setattr(pdf, "MAX_PDF_STREAM_BYTES", 64 * MiB)
    monkeypatch.setattr(pdf, "MAX_PDF_INFLATED_BYTES", 4 * MiB)
    with pytest.raises(DocumentTooLarge, match="MAX_PDF_INFLATED_BYTES"):
        convert(body, PDF, "u", max_pages=None)


def test_document_too_large_crosses_a_process_boundary_with_its_reason() -> None:
    exc = pickle.loads(pickle.dumps(DocumentTooLarge("docx: past (MAX_XML_DEPTH)")))
    assert isinstance(exc, DocumentTooLarge) and isinstance(exc, DocumentError)
    assert exc.reason == "docx: past (MAX_XML_DEPTH)"


# -- served by the hostile site --------------------------------------------------------------


async def test_the_hostile_site_serves_each_document_and_page_with_its_content_type() -> None:
    runner, root = await hostile.serve(hostile_docs.ROUTES + hostile_html.ROUTES)
    try:
        async with aiohttp.ClientSession() as session:
            for path, _ in hostile_docs.ROUTES + hostile_html.ROUTES:
                async with session.get(root + path.lstrip("/")) as resp:
                    body = await resp.read()
                    ctype = resp.headers["Content-Type"]
                if path.startswith("/html/"):
                    assert ctype.startswith("text/html"), path
                else:
                    assert kind_of(ctype, path, body) == path.rsplit(".", 1)[1], path
    finally:
        await runner.cleanup()


async def test_a_crawl_of_hostile_files_fails_each_naming_its_cap_and_reads_the_rest(
    tmp_path: Path,
) -> None:
    files: dict[str, tuple[bytes, str]] = {
        "/entity.docx": (hostile_docs.utf16_entity_docx(chars=100_000, refs=99), DOCX),
        "/slides.pptx": (hostile_docs.slide_ids_pptx(count=20_000), PPTX),
        "/inflating.pdf": (hostile_docs.inflating_pdf(inflated=128 * MiB), PDF),
        "/deep.html": (hostile_html.deep_divs(200_000).encode(), "text/html"),
        "/sparse.xlsx": (hostile_docs.sparse_xlsx(rows=500), XLSX),
        "/fine.html": (b"<html><body><p>an ordinary page</p></body></html>", "text/html"),
    }

    def route(body: bytes, ctype: str) -> hostile.Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.Response(body=body, headers={"Content-Type": ctype})

        return handler

    async def index(request: web.Request) -> web.StreamResponse:
        links = "".join(f'<a href="{p}">{p}</a>' for p in files)
        return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")

    routes = [("/", index)] + [(p, route(*v)) for p, v in files.items()]
    runner, root = await hostile.serve(routes)
    try:
        async with in_process_node(
            tmp_path, respect_robots=False, extract_processes=1, max_body_bytes=4 * MiB
        ) as node:
            start = await node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url=root, sitemap=jobs_pb2.SITEMAP_MODE_SKIP)
            )
            job = await wait_terminal(node.stub, start.id, timeout=60)
            docs = {d.url.removeprefix(root[:-1]) for d in await all_documents(node.stub, start.id)}
            errors = (
                await node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=start.id))
            ).errors
    finally:
        await runner.cleanup()
    assert job.state == jobs_pb2.JOB_STATE_COMPLETED, job.note
    assert docs == {"/", "/sparse.xlsx", "/fine.html"}
    got = {e.url.removeprefix(root[:-1]): (e.code, e.message) for e in errors}
    assert got["/entity.docx"][0] == "parse_failed" and "declares a DTD" in got["/entity.docx"][1]
    for path, cap in (
        ("/slides.pptx", "MAX_SLIDES"),
        ("/inflating.pdf", "MAX_PDF_STREAM_BYTES"),
        ("/deep.html", "MAX_HTML_DEPTH"),
    ):
        assert got[path][0] == "too_large" and cap in got[path][1], (path, got[path])
