"""Non-HTML documents -> markdown and metadata: recognising one, and the reader per format.

Owns recognising a fetched body as a document (``kind_of``: by content type, magic
bytes, then the URL's extension) and dispatching it to its format's reader
(``convert``; ``convert_compact`` is the same for ``WorkerPool.run``). The readers:
``pdf`` (PDFium), ``ooxml`` (DOCX, PPTX, XLSX), ``odf`` (ODT), ``epub``; the zip-based
ones read through ``zipguard`` and ``xmlparts``; all return ``converted.Converted``.

Left out: legacy binary Office (.doc/.xls/.ppt: OLE files need a heavy parser; they,
and password-protected OOXML, which is also an OLE file, raise ``DocumentError``), ODP
and ODS (rare on the web), RTF, and OCR of scanned PDFs (needs Tesseract-sized
machinery).

Guarantees:

- ``convert`` returns a ``Converted`` or raises ``DocumentError(reason)`` (the engine
  maps it to the page error ``parse_failed``, and its subclass ``DocumentTooLarge``,
  whose reason names the cap, to ``too_large``): broken, truncated, encrypted and
  unsupported files all raise; no other exception escapes for bad input (the
  dispatcher turns a reader's stray ``ValueError``, ``RecursionError``, ... into one).
- Bounded output: at most ``max_pages`` pages, slides, sheets or chapters are read
  (DOCX and ODT have none in the file), at most ``max_chars`` characters of markdown
  (``MAX_MARKDOWN_CHARS`` by default); ``metadata["truncated"]`` says which cap cut it.
- Bounded memory and time: each reader's caps bound the work per byte; the hard bound
  is the engine's, which runs ``convert_compact`` in a worker under a memory cap and
  a deadline that kills it (even in PDFium's C code). Nothing here does I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from pagesift.primary.extract import epub, odf, ooxml, pdf
from pagesift.primary.extract.converted import Budget, Converted, DocumentError
from pagesift.primary.extract.zipguard import ZIP_MAGIC

__all__ = ["KINDS", "MAX_MARKDOWN_CHARS", "convert", "convert_compact", "kind_of"]

MAX_MARKDOWN_CHARS = 5_000_000

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
    if b"%PDF-" in head[: pdf.EOF_WINDOW]:
        return "pdf"
    if head.startswith(ZIP_MAGIC):
        kind = _zip_kind(head)
        if kind is not None:
            return kind
    if mime in _GENERIC_TYPES:
        return _extension_kind(url)
    return None


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
    metadata; raises ``DocumentError`` for anything it cannot read (each reader's
    module names its caps)."""
    kind = kind_of(mimetype, url, body)
    if kind is None:
        raise DocumentError(f"not a supported document ({mimetype or 'no content type'})")
    budget = Budget(max_chars)
    readers: dict[str, Callable[[], Converted]] = {
        "pdf": lambda: pdf.read_pdf(body, max_pages, budget),
        "docx": lambda: ooxml.read_docx(body, budget),
        "pptx": lambda: ooxml.read_pptx(body, max_pages, budget),
        "xlsx": lambda: ooxml.read_xlsx(body, max_pages, budget),
        "odt": lambda: odf.read_odt(body, budget),
        "epub": lambda: epub.read_epub(body, url, max_pages, budget),
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
