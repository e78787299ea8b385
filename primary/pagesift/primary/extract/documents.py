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
- **DOCX, PPTX, XLSX** (OOXML) and **ODT** (ODF text) are read with ``zipfile`` and
  the stdlib's expat behind defusedxml (a thin hardening layer), streamed: the text
  lives in a few well-specified XML parts, so no office library (python-docx/-pptx/
  openpyxl build a whole object model and parse styles we do not need). DOCX:
  paragraphs, ``#`` headings from ``Heading N``/``Title`` styles, tables as markdown
  tables. PPTX: slide text in slide order, each slide after ``<!-- slide N -->``.
  XLSX: each sheet under ``## name`` as a markdown table (shared and inline strings,
  raw cell values; no formula evaluation). ODT: headings and paragraphs. Metadata
  from ``docProps/core.xml``/``app.xml`` or ``meta.xml``.
- **EPUB**: the spine's XHTML chapters in spine order, each rendered by
  ``extract.to_markdown`` (the HTML path's renderer), after ``<!-- chapter N -->``.

Left out: legacy binary Office (.doc/.xls/.ppt: OLE files need a heavy parser; they,
and password-protected OOXML, which is also an OLE file, raise ``DocumentError``), ODP
and ODS (rare on the web), RTF, and OCR of scanned PDFs (needs Tesseract-sized
machinery).

Guarantees:

- ``convert`` returns a ``Converted`` or raises ``DocumentError(reason)`` (the caller
  maps it to the page error ``parse_failed``; its subclass ``DocumentTooLarge``, a file
  past one of the caps below, whose reason names the cap, to ``too_large``): broken,
  truncated (a PDF without ``%%EOF`` in its last KiB), encrypted (password) and
  unsupported files all raise; no other exception escapes for bad input.
- Bounded output: at most ``max_pages`` pages/slides/sheets/chapters are read (the rest
  are never parsed; DOCX and ODT have no pages in the file, only the character cap
  bounds them), at most ``max_chars`` characters of markdown (``MAX_MARKDOWN_CHARS``,
  5 M by default), counted with a table's padding (every row as wide as the widest);
  when either cap cut the text, ``metadata["truncated"]`` says which. A PDF page is
  loaded, read and closed one at a time.
- Bounded memory, whatever the file says. Zip formats: at most ``MAX_ZIP_MEMBERS``
  members, ``MAX_MEMBER_BYTES`` per member and ``MAX_UNZIPPED_BYTES`` in all are
  decompressed, counted on the bytes actually inflated (a lying header does not help a
  zip bomb), and large parts are streamed from the zip, never held whole. Every XML
  part goes through defusedxml's expat parser, which refuses a DTD, an entity
  declaration or an external reference in any encoding (expat reports them after
  decoding: a UTF-16 ``<!DOCTYPE`` is caught like a UTF-8 one), under caps counted as
  the parse goes: ``MAX_XML_DEPTH`` nesting, ``MAX_PART_ELEMENTS`` per part,
  ``MAX_DOCUMENT_ELEMENTS`` per document, and ``MAX_HELD_ELEMENTS`` held at once (an
  element is dropped from the tree once read, unless it is inside the paragraph, cell
  or string being read, so memory follows that, not the part). XLSX: rows are kept
  sparse (a cell in a far column costs one entry), ``MAX_SHEET_COLUMNS`` columns and
  ``MAX_SHEET_CELLS`` cells (and shared strings) at most; slide ids, sheets and spine
  items at most ``MAX_SLIDES`` (each names a part of its own). PDF: before PDFium
  opens the file, a pre-scan inflates (and drops) each FlateDecode stream PDFium may
  decode to read text, refusing one past ``MAX_PDF_STREAM_BYTES`` or all past
  ``MAX_PDF_INFLATED_BYTES``; PDFium decodes a whole content stream in memory, so this
  is what keeps an inflating page out. The pre-scan cannot see a stream behind another
  filter or encryption, or labelled an image: those, and whatever else PDFium does in
  C, are bounded by the worker's memory cap (``workers``), not here.
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
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit
from xml.etree import ElementTree as ET

import defusedxml.ElementTree as _SAFE_ET
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from defusedxml import DefusedXmlException

__all__ = [
    "KINDS",
    "MAX_MARKDOWN_CHARS",
    "Converted",
    "DocumentError",
    "DocumentTooLarge",
    "convert",
    "convert_compact",
    "kind_of",
]

MAX_MARKDOWN_CHARS = 5_000_000
MAX_ZIP_MEMBERS = 10_000
MAX_MEMBER_BYTES = 32 * 1024 * 1024
MAX_UNZIPPED_BYTES = 128 * 1024 * 1024
MAX_SHEET_COLUMNS = 512  # XLSX/ODS cells right of this are dropped (a far "XFD1" cell)
# XML parts (every zip format): caps on the parse itself, so that memory follows what
# is kept, not what the file says. Real documents stay far below each.
MAX_XML_DEPTH = 256  # elements nested in one part (Word nests tables ~10 per level)
# Elements in one part, and across a document's parts: the character budget stops a
# real document's reading first (2 M elements carry far more than 5 M characters of
# text but in element-heavy, text-light parts, which are what these caps are for).
MAX_PART_ELEMENTS = 2_000_000
MAX_DOCUMENT_ELEMENTS = 4_000_000
MAX_HELD_ELEMENTS = 100_000  # elements held at once: one paragraph/cell/string, or a
# part read whole (metadata, relationships, manifests)
MAX_SLIDES = MAX_ZIP_MEMBERS  # slide ids (PPTX), sheets (XLSX), spine items (EPUB): each
# names a part of its own, and a zip has at most MAX_ZIP_MEMBERS parts
MAX_SHEET_CELLS = 2_000_000  # cells read from one workbook (and shared strings)
# PDF: streams inflated by a pre-scan before PDFium sees the file (images and embedded
# files excepted: PDFium decodes neither to read text)
MAX_PDF_STREAM_BYTES = 64 * 1024 * 1024  # one FlateDecode stream, inflated
MAX_PDF_INFLATED_BYTES = 512 * 1024 * 1024  # all of them together
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


class DocumentTooLarge(DocumentError):
    """The document is past one of the module's caps (its ``reason`` names the cap:
    ``MAX_XML_DEPTH``, ``MAX_MEMBER_BYTES``, ...): the page error ``too_large``."""


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
    _pdf_inflation(body)
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


_PDF_STREAM = re.compile(rb"stream\r?\n")
_PDF_FLATE = re.compile(rb"/FlateDecode\b")
# streams PDFium does not decode to read text: images (and their soft masks), attachments
_PDF_NOT_READ = re.compile(rb"/Subtype\s*/Image\b|/Type\s*/EmbeddedFile\b")
_PDF_DICT_WINDOW = 4096  # bytes before "stream" searched for its dictionary


def _pdf_inflation(body: bytes) -> None:
    """Inflate, and count, every FlateDecode stream PDFium may decode to read text
    (content streams, object streams, fonts, forms): past ``MAX_PDF_STREAM_BYTES`` in
    one or ``MAX_PDF_INFLATED_BYTES`` in all, ``DocumentTooLarge`` before PDFium (which
    decodes a whole content stream in memory) sees the file. Output is counted in 1 MiB
    steps and never kept. A stream it cannot inflate (another filter first, encrypted)
    is left to PDFium and to the worker's memory cap."""
    total = 0
    view = memoryview(body)
    for m in _PDF_STREAM.finditer(body):
        start = m.start()
        if body[max(start - 3, 0) : start] == b"end":
            continue
        window = body[max(start - _PDF_DICT_WINDOW, 0) : start]
        at = window.rfind(b"obj")
        head = window[at:] if at >= 0 else window
        if not _PDF_FLATE.search(head) or _PDF_NOT_READ.search(head):
            continue
        inflater = zlib.decompressobj()
        offset = m.end()
        size = 0
        pending: bytes | memoryview = view[offset : offset + (1 << 16)]
        offset += 1 << 16
        try:
            while True:
                size += len(inflater.decompress(pending, 1 << 20))
                if size > MAX_PDF_STREAM_BYTES:
                    raise DocumentTooLarge(
                        f"pdf: a stream inflates past {MAX_PDF_STREAM_BYTES} bytes "
                        "(MAX_PDF_STREAM_BYTES)"
                    )
                if total + size > MAX_PDF_INFLATED_BYTES:
                    raise DocumentTooLarge(
                        f"pdf: its streams inflate past {MAX_PDF_INFLATED_BYTES} bytes "
                        "(MAX_PDF_INFLATED_BYTES)"
                    )
                if inflater.eof:
                    break
                if inflater.unconsumed_tail:
                    pending = inflater.unconsumed_tail
                elif offset < len(body):
                    pending = view[offset : offset + (1 << 16)]
                    offset += 1 << 16
                else:
                    break
        except zlib.error:
            pass  # not a zlib stream from here: PDFium will say what it is
        total += size


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


class _Zip:
    """A zip read under caps on member count, member size and total inflated bytes,
    whose XML parts go through the hardened parser under the element caps."""

    def __init__(self, body: bytes, kind: str) -> None:
        if body.startswith(_OLE_MAGIC):
            raise DocumentError(f"{kind}: an encrypted (password) or legacy OLE Office file")
        try:
            self.zf = zipfile.ZipFile(io.BytesIO(body))
            infos = self.zf.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
            raise DocumentError(f"{kind}: not a readable zip file: {exc}") from exc
        if len(infos) > MAX_ZIP_MEMBERS:
            raise DocumentTooLarge(
                f"{kind}: more than {MAX_ZIP_MEMBERS} zip members (MAX_ZIP_MEMBERS)"
            )
        self.kind = kind
        self.members = {info.filename: info for info in infos}
        self.inflated = 0
        self.elements = 0  # XML elements parsed, all parts together

    def has(self, name: str) -> bool:
        return name in self.members

    def _info(self, name: str) -> zipfile.ZipInfo:
        info = self.members.get(name)
        if info is None:
            raise DocumentError(f"{self.kind}: the part {name} is missing")
        if info.flag_bits & 0x1:
            raise DocumentError(f"{self.kind}: the part {name} is encrypted")
        if info.file_size > MAX_MEMBER_BYTES:
            raise self._past_member_cap(name)
        return info

    def _past_member_cap(self, name: str) -> DocumentTooLarge:
        return DocumentTooLarge(
            f"{self.kind}: the part {name} inflates past the size cap "
            f"(MAX_MEMBER_BYTES={MAX_MEMBER_BYTES})"
        )

    def _count(self, name: str, got: int, part_total: int) -> None:
        if part_total > MAX_MEMBER_BYTES:
            raise self._past_member_cap(name)
        self.inflated += got
        if self.inflated > MAX_UNZIPPED_BYTES:
            raise DocumentTooLarge(
                f"{self.kind}: the file inflates past the total size cap "
                f"(MAX_UNZIPPED_BYTES={MAX_UNZIPPED_BYTES})"
            )

    def _broken(self, name: str, exc: Exception) -> DocumentError:
        if isinstance(exc, (zipfile.BadZipFile, ValueError, EOFError, OSError)):
            return DocumentError(f"{self.kind}: the part {name} is unreadable: {exc}")
        if isinstance(exc, NotImplementedError):
            return DocumentError(f"{self.kind}: the part {name} is unreadable: {exc}")
        # zlib.error, bz2/lzma errors: a corrupt stream
        return DocumentError(f"{self.kind}: the part {name} is corrupt: {exc}")

    def read(self, name: str) -> bytes:
        info = self._info(name)
        try:
            with self.zf.open(info) as f:
                data = f.read(MAX_MEMBER_BYTES + 1)
        except Exception as exc:  # see _broken: every failure of a bad stream
            raise self._broken(name, exc) from exc
        self._count(name, len(data), len(data))
        return data

    def _chunks(self, name: str) -> Iterator[bytes]:
        """The part's inflated bytes in chunks of 64 KiB, counted against the size caps
        as they come (never the whole part in memory)."""
        info = self._info(name)
        total = 0
        try:
            f = self.zf.open(info)
        except Exception as exc:
            raise self._broken(name, exc) from exc
        with f:
            while True:
                try:
                    chunk = f.read(1 << 16)
                except Exception as exc:
                    raise self._broken(name, exc) from exc
                if not chunk:
                    return
                total += len(chunk)
                self._count(name, len(chunk), total)
                yield chunk

    def xml(self, name: str) -> ET.Element:
        """A small part parsed whole (metadata, relationships, manifests): at most
        ``MAX_HELD_ELEMENTS`` elements."""
        root: ET.Element | None = None
        for event, el in self.events(name, hold=True):
            if root is None and event == "start":
                root = el
        if root is None:  # pragma: no cover - a well-formed part has a root
            raise DocumentError(f"{self.kind}: the part {name} is empty")
        return root

    def events(
        self, name: str, keep: frozenset[str] = frozenset(), *, hold: bool = False
    ) -> Iterator[tuple[str, ET.Element]]:
        """("start"|"end", element) of a part, streamed through the hardened parser.

        Once the caller has seen an element's "end", the element is detached from the
        tree unless it lies inside an element whose local name is in ``keep`` (the
        caller reads those subtrees at their end) or ``hold`` is set (the whole part is
        kept): memory holds the open elements and the kept subtree, no more. Raises
        ``DocumentTooLarge`` past ``MAX_XML_DEPTH``, ``MAX_PART_ELEMENTS``,
        ``MAX_DOCUMENT_ELEMENTS`` or ``MAX_HELD_ELEMENTS``, and ``DocumentError`` for a
        DTD, an entity declaration or XML that is not well-formed."""
        stack: list[ET.Element] = []
        kept = 0  # kept elements open on the stack
        held = 0  # elements inside the outermost kept element (or the part, with hold)
        count = 0
        source = _ChunkReader(self._chunks(name))
        parse = _SAFE_ET.iterparse(
            source,
            events=("start", "end"),
            forbid_dtd=True,
            forbid_entities=True,
            forbid_external=True,
        )
        # the caps, read once a part (tests lower them); "hold" counts from the root
        max_depth, max_count, max_held = MAX_XML_DEPTH, MAX_PART_ELEMENTS, MAX_HELD_ELEMENTS
        room = MAX_DOCUMENT_ELEMENTS - self.elements
        local = _local
        try:
            for event, el in parse:
                if event == "start":
                    count += 1
                    stack.append(el)
                    if kept or hold:
                        held += 1
                    if keep and local(el.tag) in keep:
                        kept += 1
                    if (
                        len(stack) > max_depth
                        or count > max_count
                        or count > room
                        or held > max_held
                    ):
                        self._caps(name, count, len(stack), held, hold)
                    yield event, el
                    continue
                yield event, el
                stack.pop()
                if kept and local(el.tag) in keep:
                    kept -= 1
                    if not kept:
                        held = 0
                if stack and not (kept or hold):
                    # earlier siblings are gone already: el is the parent's first child
                    stack[-1].remove(el)
        except ET.ParseError as exc:
            raise DocumentError(f"{self.kind}: the part {name} is not well-formed XML") from exc
        except DefusedXmlException as exc:
            raise DocumentError(
                f"{self.kind}: the part {name} declares a DTD or entities ({type(exc).__name__})"
            ) from exc
        finally:
            self.elements += count
            source.close()

    def _caps(self, name: str, count: int, depth: int, held: int, hold: bool) -> None:
        where = f"{self.kind}: the part {name}"
        if depth > MAX_XML_DEPTH:
            raise DocumentTooLarge(
                f"{where} nests XML elements deeper than {MAX_XML_DEPTH} (MAX_XML_DEPTH)"
            )
        if count > MAX_PART_ELEMENTS:
            raise DocumentTooLarge(
                f"{where} has more than {MAX_PART_ELEMENTS} XML elements (MAX_PART_ELEMENTS)"
            )
        if self.elements + count > MAX_DOCUMENT_ELEMENTS:
            raise DocumentTooLarge(
                f"{self.kind}: more than {MAX_DOCUMENT_ELEMENTS} XML elements in all "
                "(MAX_DOCUMENT_ELEMENTS)"
            )
        if held > MAX_HELD_ELEMENTS:
            what = "in the part" if hold else "in one of its paragraphs, cells or strings"
            raise DocumentTooLarge(
                f"{where} has more than {MAX_HELD_ELEMENTS} XML elements {what} (MAX_HELD_ELEMENTS)"
            )


class _ChunkReader:
    """A read()-able view of an iterator of byte chunks (what ``iterparse`` reads)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""

    def read(self, size: int = -1) -> bytes:
        if not self._rest:
            self._rest = next(self._chunks, b"")
        if size < 0 or size >= len(self._rest):
            out, self._rest = self._rest, b""
        else:
            out, self._rest = self._rest[:size], self._rest[size:]
        return out

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


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


def _table(rows: list[list[str]], max_chars: int) -> str:
    """``rows`` as a markdown table (``_sparse_table``: padded to the widest, cut after
    the row that passes ``max_chars``)."""
    return _sparse_table([list(enumerate(row)) for row in rows], max_chars)


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
_DOCX_KEEP = frozenset({"p"})  # read whole at its end (_docx_paragraph)


def _docx(body: bytes, budget: _Budget) -> Converted:
    z = _Zip(body, "docx")
    conv = Converted(kind="docx", markdown="")
    _ooxml_props(z, conv)
    pages = conv.metadata.get("pages", "")
    conv.num_pages = int(pages) if pages.isdigit() else 0
    table: list[list[list[str]]] = []  # nested tables: a stack of row lists
    row: list[list[str]] = []
    cell: list[list[str]] = []
    pending = 0  # characters held in open tables, not yet in the budget
    for event, el in z.events(_main_part(z, "word/document.xml"), _DOCX_KEEP):
        if budget.full or pending > budget.left:
            budget.add("")
            budget.truncated = budget.truncated or "max_chars"
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
                pending += len(text) + 1
            elif text:
                budget.add(text)
        elif name == "tc" and cell:
            done = " ".join(t for t in cell.pop() if t)
            if row:
                row[-1].append(done)
        elif name == "tr" and row:
            done_row = [str(c) for c in row.pop()]
            if table:
                table[-1].append(done_row)
        elif name == "tbl" and table:
            rendered = _table(table.pop(), budget.left)
            if cell:  # a table inside a cell: flatten into that cell
                cell[-1].append(rendered.replace("\n", " "))
                pending += len(rendered)
            else:
                pending = 0
                if rendered:
                    budget.add(rendered)
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
    slides = [target for _, target in _listed(z, main, "sldId", "slide ids", rels)]
    conv.num_pages = len(slides)
    limit = len(slides) if max_pages is None else min(len(slides), max(max_pages, 0))
    for number, part in enumerate(slides[:limit], start=1):
        if budget.full:
            budget.add("")
            break
        paragraphs: list[str] = []
        size = 0
        for event, el in z.events(part, _PPTX_KEEP):
            if event == "end" and _local(el.tag) == "p":
                text = "".join(t.text or "" for t in el.iter() if _local(t.tag) == "t").strip()
                if text:
                    paragraphs.append(text)
                    size += len(text) + 2
                    if size > budget.left:  # the budget would cut it anyway
                        break
        budget.add(f"<!-- slide {number} -->\n\n" + "\n\n".join(paragraphs))
    return _finish(conv, budget, "max_pages" if limit < len(slides) else "")


_PPTX_KEEP = frozenset({"p"})


def _listed(
    z: _Zip, part: str, local: str, what: str, rels: dict[str, str]
) -> list[tuple[str, str]]:
    """(name attribute, target) of the ``local`` elements of ``part`` whose ``r:id`` is
    in ``rels``, streamed, at most ``MAX_SLIDES`` of them (slide ids, sheets)."""
    out: list[tuple[str, str]] = []
    seen = 0
    for event, el in z.events(part):
        if event != "end" or _local(el.tag) != local:
            continue
        seen += 1
        if seen > MAX_SLIDES:
            raise DocumentTooLarge(
                f"{z.kind}: the part {part} lists more than {MAX_SLIDES} {what} (MAX_SLIDES)"
            )
        rid = next((v for k, v in el.attrib.items() if _local(k) == "id" and "}" in k), "")
        if rels.get(rid):
            out.append((el.get("name", ""), rels[rid]))
    return out


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
        for event, el in z.events(strings, _XLSX_STRING_KEEP):
            if event == "end" and _local(el.tag) == "si":
                if len(shared) >= MAX_SHEET_CELLS:
                    raise DocumentTooLarge(
                        f"xlsx: more than {MAX_SHEET_CELLS} shared strings (MAX_SHEET_CELLS)"
                    )
                shared.append("".join(t.text or "" for t in el.iter() if _local(t.tag) == "t"))
    sheets = _listed(z, main, "sheet", "sheets", rels)
    conv.num_pages = len(sheets)
    conv.metadata["sheets"] = ", ".join(name for name, _ in sheets)
    limit = len(sheets) if max_pages is None else min(len(sheets), max(max_pages, 0))
    cells = _CellCount()
    for name, part in sheets[:limit]:
        if budget.full:
            budget.add("")
            break
        rows, cut = _xlsx_rows(z, part, shared, budget.left, cells)
        budget.add(f"## {name}\n\n{_sparse_table(rows, budget.left)}".strip())
        if cut:
            budget.truncated = budget.truncated or "max_chars"
    return _finish(conv, budget, "max_pages" if limit < len(sheets) else "")


_XLSX_STRING_KEEP = frozenset({"si"})
_XLSX_CELL_KEEP = frozenset({"c"})


class _CellCount:
    """Cells read from one workbook, against ``MAX_SHEET_CELLS``."""

    def __init__(self) -> None:
        self.n = 0

    def add(self) -> None:
        self.n += 1
        if self.n > MAX_SHEET_CELLS:
            raise DocumentTooLarge(f"xlsx: more than {MAX_SHEET_CELLS} cells (MAX_SHEET_CELLS)")


_Row = list[tuple[int, str]]  # (column, value) of the cells that hold something


def _xlsx_rows(
    z: _Zip, part: str, shared: list[str], max_chars: int, cells: _CellCount
) -> tuple[list[_Row], bool]:
    """The sheet's rows, sparse (a far column costs one entry, not the empties before
    it), and whether reading stopped because the table would pass ``max_chars``: the
    rendered size is counted with its padding (every row as wide as the widest)."""
    rows: list[_Row] = []
    row: _Row = []
    next_col = 0
    width = 0
    text = 0  # characters of cell values
    for event, el in z.events(part, _XLSX_CELL_KEEP):
        if event != "end":
            continue
        name = _local(el.tag)
        if name == "c":
            cells.add()
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
            col = _column(el.get("r", "")) if el.get("r") else next_col
            if next_col <= col < MAX_SHEET_COLUMNS:
                next_col = col + 1
                if value:
                    row.append((col, value))
                    text += len(value)
        elif name == "row":
            rows.append(row)
            if row:
                width = max(width, row[-1][0] + 1)
            row = []
            next_col = 0
            # "| " + " | ".join(cells) + " |": 3 characters a cell and 2 a row at least
            if text + len(rows) * (3 * width + 2) > max_chars:
                return _trim(rows), True
    return _trim(rows), False


def _trim(rows: list[_Row]) -> list[_Row]:
    while rows and not rows[-1]:
        rows.pop()
    return rows


def _sparse_table(rows: list[_Row], max_chars: int) -> str:
    """Sparse rows as a markdown table, every row as wide as the widest, cut after the
    row that passes ``max_chars``."""
    width = max((r[-1][0] + 1 for r in rows if r), default=0)
    if width == 0:
        return ""
    lines = []
    size = 0
    for i, row in enumerate(rows):
        cells = [""] * width
        for col, value in row:
            cells[col] = _cell(value)
        lines.append("| " + " | ".join(cells) + " |")
        if i == 0:
            lines.append("|" + " --- |" * width)
        size += len(lines[-1]) + 1
        if size > max_chars:
            break
    return "\n".join(lines)


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


_ODT_KEEP = frozenset({"p", "h"})  # read whole at their end (_odf_text)


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
    for event, el in z.events("content.xml", _ODT_KEEP):
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
    from pagesift.primary.extract.html import to_markdown  # the HTML path's renderer

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
    if len(chapters) > MAX_SLIDES:
        raise DocumentTooLarge(
            f"epub: the spine lists more than {MAX_SLIDES} chapters (MAX_SLIDES)"
        )
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
