"""Non-HTML documents -> markdown and metadata: PDF, DOCX, PPTX, XLSX, ODT, EPUB.

Owns recognising a fetched body as a document (``kind_of``) and turning it into text
in reading order plus its metadata (``convert``). Nothing here does I/O; the engine
calls ``convert_compact`` in an extraction worker process (``workers.WorkerPool``).

Formats taken, and how:

- **PDF** with pypdfium2 (PDFium, Apache-2.0/BSD-3): measured fastest by far with the
  lowest memory of the candidates (``bench/documents.py``: pypdfium2 vs pypdf vs
  pdfminer.six), keeps up with PDFium's fixes, no AGPL. Text is PDFium's text-page
  text, per page, in PDFium's reading order; each page starts with the separator
  ``<!-- page N -->`` (an HTML comment: invisible when the markdown is rendered, does
  not invent headings, trivial to split on). No OCR: a scanned page yields only its
  separator.
- **DOCX, PPTX, XLSX** (OOXML) and **ODT** (ODF text) are read with the stdlib
  (``zipfile`` + an ``xml.etree`` pull parser): the text lives in a few well-specified
  XML parts, so no dependency (python-docx/-pptx/openpyxl build a whole object model
  and parse styles we do not need). DOCX: paragraphs, ``#`` headings from
  ``Heading N``/``Title`` styles, tables as markdown tables. PPTX: slide text in slide
  order, each slide after ``<!-- slide N -->``. XLSX: each sheet under ``## name`` as a
  markdown table (shared and inline strings, raw cell values; no formula evaluation).
  ODT: headings and paragraphs. Metadata from ``docProps/core.xml``/``app.xml`` or
  ``meta.xml``.
- **EPUB**: the spine's XHTML chapters in spine order, each rendered by
  ``extract.to_markdown`` (the HTML path's renderer), after ``<!-- chapter N -->``.

Left out: legacy binary Office (.doc/.xls/.ppt: OLE files need a heavy parser; they,
and password-protected OOXML, which is also an OLE file, raise ``DocumentError``), ODP
and ODS (rare on the web), RTF, and OCR of scanned PDFs (needs Tesseract-sized
machinery).

Guarantees:

- ``convert`` returns a ``Converted`` or raises ``DocumentError(reason)`` (the caller
  maps it to the page error ``parse_failed``): broken, truncated (a PDF without
  ``%%EOF`` in its last KiB), encrypted (password) and unsupported files all raise;
  no other exception escapes for bad input.
- Bounded output and memory: at most ``max_pages`` pages/slides/sheets/chapters are
  read (the rest are never parsed; DOCX and ODT have no pages in the file, only the
  character cap bounds them), at most ``max_chars`` characters of markdown
  (``MAX_MARKDOWN_CHARS``, 5 M by default); when either cap cut the text,
  ``metadata["truncated"]`` says which. A PDF page is loaded, read and closed one at a
  time. Zip formats: at most ``MAX_ZIP_MEMBERS`` members, ``MAX_MEMBER_BYTES`` per
  member and ``MAX_UNZIPPED_BYTES`` in all are decompressed, counted on the bytes
  actually inflated (a lying header does not help a zip bomb); XML with a DOCTYPE or
  ENTITY declaration is refused before parsing (no entity expansion, no external
  entities: defusedxml's ``forbid_dtd``), and parts are streamed with a pull parser and
  cleared as they are read.
- Bounded time: the work per byte is bounded by the caps above, and the hard bound is
  the caller's: it runs ``convert_compact`` in a worker with
  ``WorkerPool.run(..., timeout=)``, which kills the worker (even one stuck in PDFium's
  C code) and raises ``WorkerTimeout``.

Why it is safe to run anywhere: pure functions of their arguments; PDFium is not
thread-safe, so its use is serialised by a module lock (a worker process has one
caller; an inline fallback in threads stays correct).
"""

from __future__ import annotations

import io
import posixpath
import re
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit
from xml.etree import ElementTree as ET

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

__all__ = [
    "KINDS",
    "MAX_MARKDOWN_CHARS",
    "Converted",
    "DocumentError",
    "convert",
    "convert_compact",
    "kind_of",
]

MAX_MARKDOWN_CHARS = 5_000_000
MAX_ZIP_MEMBERS = 10_000
MAX_MEMBER_BYTES = 32 * 1024 * 1024
MAX_UNZIPPED_BYTES = 128 * 1024 * 1024
MAX_SHEET_COLUMNS = 512  # XLSX/ODS cells right of this are dropped (a far "XFD1" cell)
_PDF_EOF_WINDOW = 1024  # %%EOF must be in the last KiB (what Acrobat accepts)

_MIMETYPES = {
    "application/pdf": "pdf",
    "application/x-pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "application/vnd.oasis.opendocument.text": "odt",
    "application/epub+zip": "epub",
}
KINDS = frozenset(_MIMETYPES.values())
_EXTENSIONS = {".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx"}
_EXTENSIONS |= {".odt": "odt", ".epub": "epub"}
# Types a server sends when it does not know: only then does the URL's extension count.
_GENERIC_TYPES = frozenset(
    {
        "",
        "application/octet-stream",
        "binary/octet-stream",
        "application/binary",
        "application/download",
        "application/x-download",
        "application/force-download",
        "application/unknown",
        "application/zip",
        "application/x-zip-compressed",
    }
)
_OOXML_MAIN: tuple[tuple[str, str], ...] = (
    ("word/document.xml", "docx"),
    ("ppt/presentation.xml", "pptx"),
    ("xl/workbook.xml", "xlsx"),
)
# A local header naming a part in one of these folders says the kind.
_OOXML_FOLDERS: tuple[tuple[bytes, str], ...] = (
    (b"word/", "docx"),
    (b"ppt/", "pptx"),
    (b"xl/", "xlsx"),
)
_ZIP_MAGIC = b"PK\x03\x04"
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

_PDFIUM_LOCK = threading.Lock()


class DocumentError(Exception):
    """The body is not a document this module can read; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class Converted:
    """One document's text and metadata ("" / 0 when the file does not say)."""

    kind: str
    markdown: str
    title: str = ""
    author: str = ""
    created: str = ""  # ISO 8601 (as precise as the file is)
    modified: str = ""
    num_pages: int = 0  # pages (PDF, DOCX when recorded), slides, sheets, chapters
    metadata: dict[str, str] = field(default_factory=dict)


# -- recognising a document ---------------------------------------------------------


def _zip_kind(head: bytes) -> str | None:
    """The kind of a zip container from its first bytes (or the whole body)."""
    # ODF and EPUB: the first member is "mimetype", stored, holding the media type.
    if head[26:28] == b"\x08\x00" and head[30:38] == b"mimetype":
        extra = int.from_bytes(head[28:30], "little")
        size = int.from_bytes(head[18:22], "little")
        start = 38 + extra
        media = head[start : start + min(size, 100)].decode("ascii", "replace").strip()
        return _MIMETYPES.get(media)
    # OOXML: named by its main part; local headers carry names uncompressed.
    if b"[Content_Types].xml" in head or b"_rels/.rels" in head:
        for name, kind in _OOXML_MAIN:
            if name.encode() in head:
                return kind
    # Writers put parts in any order (openpyxl writes the sheets first and
    # [Content_Types].xml last), so a first few KiB may name only some part of the
    # package: its folder says which kind it is.
    for folder, kind in _OOXML_FOLDERS:
        if folder in head:
            return kind
    return None


def _extension_kind(url: str) -> str | None:
    path = unquote(urlsplit(url).path).lower()
    return _EXTENSIONS.get(posixpath.splitext(path)[1])


def kind_of(mimetype: str, url: str, head: bytes) -> str | None:
    """The document kind of a response ("pdf", "docx", "pptx", "xlsx", "odt", "epub"),
    or None for anything else (HTML, text, images, unsupported documents).

    By its content type, else by magic bytes in ``head`` (the body's first bytes; a few
    KiB suffice, the whole body is best), else, for a generic type such as
    ``application/octet-stream``, by the URL path's extension."""
    mime = mimetype.split(";", 1)[0].strip().lower()
    if mime in _MIMETYPES:
        return _MIMETYPES[mime]
    if b"%PDF-" in head[:_PDF_EOF_WINDOW]:
        return "pdf"
    if head.startswith(_ZIP_MAGIC):
        kind = _zip_kind(head)
        if kind is not None:
            return kind
    if mime in _GENERIC_TYPES:
        return _extension_kind(url)
    return None


# -- shared helpers -----------------------------------------------------------------


class _Budget:
    """The markdown being built, cut at ``max_chars`` characters."""

    def __init__(self, max_chars: int) -> None:
        self.parts: list[str] = []
        self.left = max_chars
        self.truncated = ""

    @property
    def full(self) -> bool:
        return self.left <= 0

    def add(self, text: str) -> None:
        if self.left <= 0:
            self.truncated = self.truncated or "max_chars"
            return
        if len(text) > self.left:
            text = text[: max(self.left - 2, 0)]
            self.truncated = self.truncated or "max_chars"
        self.parts.append(text)
        self.left -= len(text) + 2  # and the blank line that joins it to the next part

    def text(self) -> str:
        return "\n\n".join(p for p in self.parts if p).strip() + "\n"


_PDF_DATE = re.compile(
    r"D?:?(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?\s*(?:(Z)|([+-])(\d{2})'?(\d{2})?'?)?"
)


def _pdf_date(value: str) -> str:
    """A PDF date (``D:YYYYMMDDHHmmSS+HH'mm'``, any suffix optional) as ISO 8601."""
    m = _PDF_DATE.match(value.strip())
    if m is None:
        return ""
    year, month, day, hour, minute, second, zulu, sign, tzh, tzm = m.groups()
    out = year
    if month:
        out += f"-{month}"
        if day:
            out += f"-{day}"
            if hour:
                out += f"T{hour}:{minute or '00'}:{second or '00'}"
                if zulu:
                    out += "Z"
                elif sign and tzh:
                    out += f"{sign}{tzh}:{tzm or '00'}"
    return out


def _finish(conv: Converted, budget: _Budget, truncated: str = "") -> Converted:
    conv.markdown = budget.text()
    why = truncated or budget.truncated
    if why:
        conv.metadata["truncated"] = why
    conv.metadata = {k: v for k, v in conv.metadata.items() if v}
    return conv


# -- PDF ----------------------------------------------------------------------------


def _pdf(body: bytes, max_pages: int | None, budget: _Budget) -> Converted:
    if len(body) > _PDF_EOF_WINDOW and b"%%EOF" not in body[-_PDF_EOF_WINDOW:]:
        raise DocumentError("truncated PDF: no %%EOF marker at its end")
    if b"%%EOF" not in body:
        raise DocumentError("truncated PDF: no %%EOF marker")
    with _PDFIUM_LOCK:
        try:
            doc = pdfium.PdfDocument(body)
        except pdfium.PdfiumError as exc:
            if getattr(exc, "err_code", None) == pdfium_c.FPDF_ERR_PASSWORD:
                raise DocumentError("encrypted PDF: a password is required") from exc
            raise DocumentError(f"unreadable PDF: {exc}") from exc
        try:
            return _pdf_read(doc, max_pages, budget)
        except pdfium.PdfiumError as exc:
            raise DocumentError(f"unreadable PDF: {exc}") from exc
        finally:
            doc.close()


def _pdf_read(doc: pdfium.PdfDocument, max_pages: int | None, budget: _Budget) -> Converted:
    pages = len(doc)
    info = doc.get_metadata_dict()
    version = doc.get_version()
    conv = Converted(
        kind="pdf",
        markdown="",
        title=info.get("Title", "").strip(),
        author=info.get("Author", "").strip(),
        created=_pdf_date(info.get("CreationDate", "")),
        modified=_pdf_date(info.get("ModDate", "")),
        num_pages=pages,
        metadata={
            "subject": info.get("Subject", "").strip(),
            "keywords": info.get("Keywords", "").strip(),
            "creator": info.get("Creator", "").strip(),
            "producer": info.get("Producer", "").strip(),
            "pdf_version": f"{version // 10}.{version % 10}" if version else "",
        },
    )
    limit = pages if max_pages is None else min(pages, max(max_pages, 0))
    for index in range(limit):
        if budget.full:
            budget.add("")  # records the cut
            break
        page = doc[index]
        try:
            textpage = page.get_textpage()
            try:
                text = textpage.get_text_range()
            finally:
                textpage.close()
        finally:
            page.close()
        text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "").strip()
        budget.add(f"<!-- page {index + 1} -->\n\n{text}" if text else f"<!-- page {index + 1} -->")
    return _finish(conv, budget, "max_pages" if limit < pages else "")


# -- zip containers -----------------------------------------------------------------

_DTD = re.compile(rb"<!\s*(?:DOCTYPE|ENTITY)", re.IGNORECASE)


class _Zip:
    """A zip read under caps on member count, member size and total inflated bytes."""

    def __init__(self, body: bytes, kind: str) -> None:
        if body.startswith(_OLE_MAGIC):
            raise DocumentError(f"{kind}: an encrypted (password) or legacy OLE Office file")
        try:
            self.zf = zipfile.ZipFile(io.BytesIO(body))
            infos = self.zf.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
            raise DocumentError(f"{kind}: not a readable zip file: {exc}") from exc
        if len(infos) > MAX_ZIP_MEMBERS:
            raise DocumentError(f"{kind}: more than {MAX_ZIP_MEMBERS} zip members")
        self.kind = kind
        self.members = {info.filename: info for info in infos}
        self.inflated = 0

    def has(self, name: str) -> bool:
        return name in self.members

    def read(self, name: str) -> bytes:
        info = self.members.get(name)
        if info is None:
            raise DocumentError(f"{self.kind}: the part {name} is missing")
        if info.flag_bits & 0x1:
            raise DocumentError(f"{self.kind}: the part {name} is encrypted")
        if info.file_size > MAX_MEMBER_BYTES:
            raise DocumentError(f"{self.kind}: the part {name} inflates past the size cap")
        try:
            with self.zf.open(info) as f:
                data = f.read(MAX_MEMBER_BYTES + 1)
        except (zipfile.BadZipFile, ValueError, EOFError, OSError, NotImplementedError) as exc:
            raise DocumentError(f"{self.kind}: the part {name} is unreadable: {exc}") from exc
        except Exception as exc:  # zlib.error, bz2/lzma errors: a corrupt stream
            raise DocumentError(f"{self.kind}: the part {name} is corrupt: {exc}") from exc
        if len(data) > MAX_MEMBER_BYTES:
            raise DocumentError(f"{self.kind}: the part {name} inflates past the size cap")
        self.inflated += len(data)
        if self.inflated > MAX_UNZIPPED_BYTES:
            raise DocumentError(f"{self.kind}: the file inflates past the total size cap")
        return data

    def xml(self, name: str) -> ET.Element:
        """A small part parsed whole (metadata, relationships, manifests)."""
        return _parse(self.read(name), self.kind, name)

    def events(self, name: str) -> Iterator[tuple[str, ET.Element]]:
        """("start"|"end", element) of a large part, streamed."""
        data = self.read(name)
        _refuse_dtd(data, self.kind, name)
        parser: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start", "end"))
        try:
            for offset in range(0, len(data), 1 << 16):
                parser.feed(data[offset : offset + (1 << 16)])
                yield from parser.read_events()  # type: ignore[misc]
            parser.close()
            yield from parser.read_events()  # type: ignore[misc]
        except ET.ParseError as exc:
            raise DocumentError(f"{self.kind}: the part {name} is not well-formed XML") from exc


def _refuse_dtd(data: bytes, kind: str, name: str) -> None:
    if _DTD.search(data):
        raise DocumentError(f"{kind}: the part {name} declares a DTD or entities")


def _parse(data: bytes, kind: str, name: str) -> ET.Element:
    _refuse_dtd(data, kind, name)
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise DocumentError(f"{kind}: the part {name} is not well-formed XML") from exc


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child_text(root: ET.Element, local: str) -> str:
    for el in root.iter():
        if _local(el.tag) == local:
            return "".join(el.itertext()).strip()
    return ""


def _rels(z: _Zip, part: str) -> dict[str, str]:
    """Relationship id -> target part path (zip name) for ``part``."""
    folder, base = posixpath.split(part)
    rels_name = posixpath.join(folder, "_rels", base + ".rels")
    if not z.has(rels_name):
        return {}
    out: dict[str, str] = {}
    for el in z.xml(rels_name):
        target = el.get("Target", "")
        if el.get("TargetMode") == "External" or not target:
            continue
        path = target.lstrip("/") if target.startswith("/") else posixpath.join(folder, target)
        out[el.get("Id", "")] = posixpath.normpath(path)
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(rows: list[list[str]]) -> str:
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    if width == 0:
        return ""
    lines = []
    for i, row in enumerate(rows):
        cells = [_cell(c) for c in row] + [""] * (width - len(row))
        lines.append("| " + " | ".join(cells) + " |")
        if i == 0:
            lines.append("|" + " --- |" * width)
    return "\n".join(lines)


def _ooxml_props(z: _Zip, conv: Converted) -> None:
    if z.has("docProps/core.xml"):
        core = z.xml("docProps/core.xml")
        conv.title = _child_text(core, "title")
        conv.author = _child_text(core, "creator")
        conv.created = _child_text(core, "created")
        conv.modified = _child_text(core, "modified")
        for local, key in (
            ("subject", "subject"),
            ("keywords", "keywords"),
            ("description", "description"),
            ("lastModifiedBy", "last_modified_by"),
            ("language", "language"),
        ):
            conv.metadata[key] = _child_text(core, local)
    if z.has("docProps/app.xml"):
        app = z.xml("docProps/app.xml")
        conv.metadata["application"] = _child_text(app, "Application")
        for local in ("Pages", "Words", "Slides"):
            conv.metadata[local.lower()] = _child_text(app, local)


def _main_part(z: _Zip, default: str) -> str:
    """The office document part the package relationships name (else ``default``)."""
    if z.has("_rels/.rels"):
        for el in z.xml("_rels/.rels"):
            target = el.get("Target", "").lstrip("/")
            if el.get("Type", "").endswith("/officeDocument") and z.has(target):
                return target
    return default


# -- DOCX ---------------------------------------------------------------------------

_HEADING = re.compile(r"^heading\s*(\d)$", re.IGNORECASE)


def _docx(body: bytes, budget: _Budget) -> Converted:
    z = _Zip(body, "docx")
    conv = Converted(kind="docx", markdown="")
    _ooxml_props(z, conv)
    pages = conv.metadata.get("pages", "")
    conv.num_pages = int(pages) if pages.isdigit() else 0
    table: list[list[list[str]]] = []  # nested tables: a stack of row lists
    row: list[list[str]] = []
    cell: list[list[str]] = []
    for event, el in z.events(_main_part(z, "word/document.xml")):
        if budget.full:
            budget.add("")
            break
        name = _local(el.tag)
        if event == "start":
            if name == "tbl":
                table.append([])
            elif name == "tr":
                row.append([])
            elif name == "tc":
                cell.append([])
            continue
        if name == "p":
            text = _docx_paragraph(el)
            if cell:
                cell[-1].append(text)
            elif text:
                budget.add(text)
            el.clear()
        elif name == "tc" and cell:
            done = " ".join(t for t in cell.pop() if t)
            if row:
                row[-1].append(done)
        elif name == "tr" and row:
            done_row = [str(c) for c in row.pop()]
            if table:
                table[-1].append(done_row)
        elif name == "tbl" and table:
            rendered = _table(table.pop())
            if cell:  # a table inside a cell: flatten into that cell
                cell[-1].append(rendered.replace("\n", " "))
            elif rendered:
                budget.add(rendered)
            el.clear()
    return _finish(conv, budget)


def _docx_paragraph(p: ET.Element) -> str:
    parts: list[str] = []
    style = ""
    numbered = False
    for el in p.iter():
        name = _local(el.tag)
        if name == "t" and el.text:
            parts.append(el.text)
        elif name == "tab":
            parts.append("\t")
        elif name in ("br", "cr"):
            parts.append("\n")
        elif name == "pStyle":
            style = next((v for k, v in el.attrib.items() if _local(k) == "val"), "")
        elif name == "numPr":
            numbered = True
    text = "".join(parts).strip()
    if not text:
        return ""
    heading = _HEADING.match(style)
    if heading:
        return "#" * min(int(heading.group(1)), 6) + " " + " ".join(text.split())
    if style.lower() == "title":
        return "# " + " ".join(text.split())
    if numbered:
        return "- " + text
    return text


# -- PPTX ---------------------------------------------------------------------------


def _pptx(body: bytes, max_pages: int | None, budget: _Budget) -> Converted:
    z = _Zip(body, "pptx")
    conv = Converted(kind="pptx", markdown="")
    _ooxml_props(z, conv)
    main = _main_part(z, "ppt/presentation.xml")
    rels = _rels(z, main)
    slides = []
    for el in z.xml(main).iter():
        if _local(el.tag) == "sldId":
            rid = next((v for k, v in el.attrib.items() if _local(k) == "id" and "}" in k), "")
            if rels.get(rid):
                slides.append(rels[rid])
    conv.num_pages = len(slides)
    limit = len(slides) if max_pages is None else min(len(slides), max(max_pages, 0))
    for number, part in enumerate(slides[:limit], start=1):
        if budget.full:
            budget.add("")
            break
        paragraphs: list[str] = []
        for event, el in z.events(part):
            if event == "end" and _local(el.tag) == "p":
                text = "".join(t.text or "" for t in el.iter() if _local(t.tag) == "t").strip()
                if text:
                    paragraphs.append(text)
                el.clear()
        budget.add(f"<!-- slide {number} -->\n\n" + "\n\n".join(paragraphs))
    return _finish(conv, budget, "max_pages" if limit < len(slides) else "")


# -- XLSX ---------------------------------------------------------------------------

_CELL_REF = re.compile(r"([A-Z]{1,3})")


def _column(ref: str) -> int:
    m = _CELL_REF.match(ref)
    if m is None:
        return -1
    col = 0
    for ch in m.group(1):
        col = col * 26 + (ord(ch) - 64)
    return col - 1


def _xlsx(body: bytes, max_pages: int | None, budget: _Budget) -> Converted:
    z = _Zip(body, "xlsx")
    conv = Converted(kind="xlsx", markdown="")
    _ooxml_props(z, conv)
    main = _main_part(z, "xl/workbook.xml")
    rels = _rels(z, main)
    shared: list[str] = []
    strings = next((t for t in rels.values() if t.endswith("sharedStrings.xml")), "")
    if strings and z.has(strings):
        for event, el in z.events(strings):
            if event == "end" and _local(el.tag) == "si":
                shared.append("".join(t.text or "" for t in el.iter() if _local(t.tag) == "t"))
                el.clear()
    sheets: list[tuple[str, str]] = []
    for el in z.xml(main).iter():
        if _local(el.tag) == "sheet":
            rid = next((v for k, v in el.attrib.items() if _local(k) == "id" and "}" in k), "")
            if rels.get(rid):
                sheets.append((el.get("name", ""), rels[rid]))
    conv.num_pages = len(sheets)
    conv.metadata["sheets"] = ", ".join(name for name, _ in sheets)
    limit = len(sheets) if max_pages is None else min(len(sheets), max(max_pages, 0))
    for name, part in sheets[:limit]:
        if budget.full:
            budget.add("")
            break
        rows = _xlsx_rows(z, part, shared, budget.left)
        budget.add(f"## {name}\n\n{_table(rows)}".strip())
    return _finish(conv, budget, "max_pages" if limit < len(sheets) else "")


def _xlsx_rows(z: _Zip, part: str, shared: list[str], max_chars: int) -> list[list[str]]:
    rows: list[list[str]] = []
    row: list[str] = []
    size = 0
    for event, el in z.events(part):
        if event != "end":
            continue
        name = _local(el.tag)
        if name == "c":
            kind = el.get("t", "")
            value = ""
            for sub in el:
                if _local(sub.tag) == "v":
                    value = sub.text or ""
                elif _local(sub.tag) == "is":
                    value = "".join(t.text or "" for t in sub.iter() if _local(t.tag) == "t")
            if kind == "s":
                value = shared[int(value)] if value.isdigit() and int(value) < len(shared) else ""
            elif kind == "b":
                value = "TRUE" if value == "1" else "FALSE"
            col = _column(el.get("r", "")) if el.get("r") else len(row)
            if 0 <= col < MAX_SHEET_COLUMNS:
                row.extend([""] * (col - len(row)))
                if col == len(row):
                    row.append(value)
                    size += len(value) + 3
            el.clear()
        elif name == "row":
            while row and not row[-1]:
                row.pop()
            rows.append(row)
            row = []
            el.clear()
            if size > max_chars:  # the budget would cut it anyway: stop reading
                break
    while rows and not rows[-1]:
        rows.pop()
    return rows


# -- ODT ----------------------------------------------------------------------------


def _odf_text(el: ET.Element) -> str:
    """Text of an ODF paragraph: spans, ``text:s`` runs of spaces, tabs, line breaks."""
    parts = [el.text or ""]
    for child in el:
        name = _local(child.tag)
        if name == "s":
            count = next((v for k, v in child.attrib.items() if _local(k) == "c"), "1")
            parts.append(" " * min(int(count) if count.isdigit() else 1, 100))
        elif name == "tab":
            parts.append("\t")
        elif name == "line-break":
            parts.append("\n")
        elif name not in ("note", "annotation"):
            parts.append(_odf_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _odt(body: bytes, budget: _Budget) -> Converted:
    z = _Zip(body, "odt")
    conv = Converted(kind="odt", markdown="")
    if z.has("meta.xml"):
        meta = z.xml("meta.xml")
        conv.title = _child_text(meta, "title")
        conv.author = _child_text(meta, "initial-creator") or _child_text(meta, "creator")
        conv.created = _child_text(meta, "creation-date")
        conv.modified = _child_text(meta, "date")
        conv.metadata["subject"] = _child_text(meta, "subject")
        conv.metadata["description"] = _child_text(meta, "description")
        conv.metadata["generator"] = _child_text(meta, "generator")
        conv.metadata["language"] = _child_text(meta, "language")
        for el in meta.iter():
            if _local(el.tag) == "document-statistic":
                for key, value in el.attrib.items():
                    if _local(key) == "page-count" and value.isdigit():
                        conv.num_pages = int(value)
    depth = 0  # paragraphs inside paragraphs (frames, notes) are read with their parent
    for event, el in z.events("content.xml"):
        if budget.full:
            budget.add("")
            break
        name = _local(el.tag)
        if name not in ("p", "h"):
            continue
        if event == "start":
            depth += 1
            continue
        depth -= 1
        if depth:
            continue
        text = _odf_text(el).strip()
        if text and name == "h":
            level = next((v for k, v in el.attrib.items() if _local(k) == "outline-level"), "1")
            text = "#" * min(int(level) if level.isdigit() else 1, 6) + " " + " ".join(text.split())
        if text:
            budget.add(text)
        el.clear()
    return _finish(conv, budget)


# -- EPUB ---------------------------------------------------------------------------


def _epub(body: bytes, url: str, max_pages: int | None, budget: _Budget) -> Converted:
    from pagesift.primary.extract import to_markdown  # the HTML path's renderer

    z = _Zip(body, "epub")
    container = z.xml("META-INF/container.xml")
    opf_path = next(
        (el.get("full-path", "") for el in container.iter() if _local(el.tag) == "rootfile"), ""
    )
    if not opf_path:
        raise DocumentError("epub: no rootfile in META-INF/container.xml")
    opf = z.xml(opf_path)
    folder = posixpath.dirname(opf_path)
    conv = Converted(kind="epub", markdown="")
    conv.title = _child_text(opf, "title")
    conv.author = _child_text(opf, "creator")
    conv.created = _child_text(opf, "date")
    for el in opf.iter():
        if _local(el.tag) == "meta" and el.get("property") == "dcterms:modified":
            conv.modified = (el.text or "").strip()
    conv.metadata["language"] = _child_text(opf, "language")
    conv.metadata["publisher"] = _child_text(opf, "publisher")
    conv.metadata["identifier"] = _child_text(opf, "identifier")
    conv.metadata["description"] = _child_text(opf, "description")
    manifest = {
        el.get("id", ""): posixpath.normpath(posixpath.join(folder, unquote(el.get("href", ""))))
        for el in opf.iter()
        if _local(el.tag) == "item"
    }
    chapters = [
        manifest[el.get("idref", "")]
        for el in opf.iter()
        if _local(el.tag) == "itemref" and el.get("idref", "") in manifest
    ]
    conv.num_pages = len(chapters)
    limit = len(chapters) if max_pages is None else min(len(chapters), max(max_pages, 0))
    for number, part in enumerate(chapters[:limit], start=1):
        if budget.full:
            budget.add("")
            break
        html = z.read(part).decode("utf-8", errors="replace")
        text = to_markdown(html, url).strip()
        budget.add(f"<!-- chapter {number} -->\n\n{text}".strip())
    return _finish(conv, budget, "max_pages" if limit < len(chapters) else "")


# -- entry points -------------------------------------------------------------------


def convert(
    body: bytes,
    mimetype: str,
    url: str,
    *,
    max_pages: int | None,
    max_chars: int = MAX_MARKDOWN_CHARS,
) -> Converted:
    """The document ``body`` (served as ``mimetype`` from ``url``) as markdown and
    metadata; raises ``DocumentError`` for anything it cannot read (see the module
    docstring for the caps)."""
    kind = kind_of(mimetype, url, body)
    if kind is None:
        raise DocumentError(f"not a supported document ({mimetype or 'no content type'})")
    budget = _Budget(max_chars)
    readers: dict[str, Callable[[], Converted]] = {
        "pdf": lambda: _pdf(body, max_pages, budget),
        "docx": lambda: _docx(body, budget),
        "pptx": lambda: _pptx(body, max_pages, budget),
        "xlsx": lambda: _xlsx(body, max_pages, budget),
        "odt": lambda: _odt(body, budget),
        "epub": lambda: _epub(body, url, max_pages, budget),
    }
    try:
        return readers[kind]()
    except DocumentError:
        raise
    except (RecursionError, MemoryError) as exc:
        raise DocumentError(f"{kind}: too complex to read ({type(exc).__name__})") from exc
    except (ValueError, KeyError, IndexError, TypeError, UnicodeError, OSError) as exc:
        raise DocumentError(f"{kind}: malformed ({type(exc).__name__}: {exc})") from exc


def convert_compact(
    body: bytes, mimetype: str, url: str, max_pages: int | None, max_chars: int
) -> Converted:
    """``convert`` with positional arguments only, for ``WorkerPool.run`` (which passes
    positional arguments); ``Converted`` and ``DocumentError`` pickle cheaply (plain
    strings, ints and one dict)."""
    return convert(body, mimetype, url, max_pages=max_pages, max_chars=max_chars)
