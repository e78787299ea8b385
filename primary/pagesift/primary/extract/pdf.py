"""PDF -> markdown and metadata, with pypdfium2 (PDFium, Apache-2.0/BSD-3).

Why PDFium: measured fastest by far with the lowest memory of the candidates
(``bench/documents.py``: pypdfium2 vs pypdf vs pdfminer.six), it keeps up with
PDFium's fixes, and it is not AGPL. Text is PDFium's text-page text, per page, in
PDFium's reading order; each page starts with the separator ``<!-- page N -->`` (an
HTML comment: invisible when the markdown is rendered, invents no heading, trivial to
split on). No OCR: a scanned page yields only its separator.

Invariants:

- A truncated file (no ``%%EOF`` in its last KiB), an encrypted one (password) and one
  PDFium cannot read raise ``DocumentError``.
- Before PDFium opens the file, a pre-scan inflates (and drops) each FlateDecode
  stream PDFium may decode to read text, refusing one past ``MAX_PDF_STREAM_BYTES`` or
  all past ``MAX_PDF_INFLATED_BYTES`` (``DocumentTooLarge``): PDFium decodes a whole
  content stream in memory, so this is what keeps an inflating page out. The pre-scan
  cannot see a stream behind another filter or encryption, or labelled an image:
  those, and whatever else PDFium does in C, are bounded by the worker's memory cap
  (``engine.workers``), not here.
- At most ``max_pages`` pages are read, one at a time (loaded, read, closed).
- PDFium is not thread-safe, so its use is serialised by a module lock (a worker
  process has one caller; the inline fallback in threads stays correct).
"""

from __future__ import annotations

import re
import threading
import zlib

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from pagesift.primary.extract.converted import (
    Budget,
    Converted,
    DocumentError,
    DocumentTooLarge,
    finish,
)

__all__ = ["EOF_WINDOW", "MAX_PDF_INFLATED_BYTES", "MAX_PDF_STREAM_BYTES", "read_pdf"]

# Streams inflated by a pre-scan before PDFium sees the file (images and embedded
# files excepted: PDFium decodes neither to read text)
MAX_PDF_STREAM_BYTES = 64 * 1024 * 1024  # one FlateDecode stream, inflated
MAX_PDF_INFLATED_BYTES = 512 * 1024 * 1024  # all of them together
EOF_WINDOW = 1024  # %%EOF must be in the last KiB (what Acrobat accepts)

_PDFIUM_LOCK = threading.Lock()


def read_pdf(body: bytes, max_pages: int | None, budget: Budget) -> Converted:
    """The PDF ``body``'s text (at most ``max_pages`` pages) and metadata."""
    if len(body) > EOF_WINDOW and b"%%EOF" not in body[-EOF_WINDOW:]:
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


def _pdf_read(doc: pdfium.PdfDocument, max_pages: int | None, budget: Budget) -> Converted:
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
    return finish(conv, budget, "max_pages" if limit < pages else "")


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
