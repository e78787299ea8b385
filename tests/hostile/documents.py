"""Hostile documents (issue 19, finding 4): files far bigger in memory than on the wire.

Each generator builds, in a few hundred milliseconds at most and without ever holding
the inflated payload, one of the documents that drove an extraction worker to
gigabytes on the code of the finding:

- ``utf16_entity_docx``: a DOCX whose ``word/document.xml`` is UTF-16 (so a byte search
  for ``<!DOCTYPE`` misses it) and declares one big internal entity referenced
  ``refs`` times (a quadratic blow-up: ``chars * refs`` characters of text);
- ``sparse_xlsx``: an XLSX whose every row holds one cell, in column 512 (``SR``), so a
  dense row representation allocates 512 cells a row;
- ``empty_elements_docx``: a DOCX body of ``count`` empty elements (every element kept
  by a tree builder that only clears paragraphs);
- ``slide_ids_pptx``: a PPTX whose ``presentation.xml`` lists ``count`` slide ids;
- ``inflating_pdf``: a PDF whose one page's content stream inflates to
  ``inflated`` bytes (a deflate block of 1 MiB of spaces repeated: ~1,000:1).

Defaults are the sizes of the finding (``make bench``); tests pass smaller sizes.
``ROUTES`` serves each default under ``/documents/...`` with its real content type,
built once per process on first request.
"""

from __future__ import annotations

import functools
import io
import zipfile
import zlib
from collections.abc import Callable, Iterable

from aiohttp import web

from tests.hostile import Handler, Routes

__all__ = [
    "DOCX",
    "PDF",
    "PPTX",
    "ROUTES",
    "XLSX",
    "empty_elements_docx",
    "inflating_pdf",
    "slide_ids_pptx",
    "sparse_xlsx",
    "utf16_entity_docx",
]

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"

_CT = "http://schemas.openxmlformats.org/package/2006/content-types"
_PKG_REL = "http://schemas.openxmlformats.org/package/2006/relationships"
_DOC_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_P = "http://schemas.openxmlformats.org/presentationml/2006/main"
_XML = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
_CHUNK = 1 << 20


def _package(main: str, content_type: str, parts: dict[str, Iterable[bytes]]) -> bytes:
    """An OOXML zip: content types, the package relationship to ``main``, and ``parts``
    (each an iterable of byte chunks, deflated as they come: never held whole)."""
    types = (
        _XML + f'<Types xmlns="{_CT}"><Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/{main}" ContentType="{content_type}"/></Types>'
    )
    rels = (
        _XML + f'<Relationships xmlns="{_PKG_REL}">'
        f'<Relationship Id="rId1" Type="{_DOC_REL}/officeDocument" Target="{main}"/>'
        "</Relationships>"
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", types)
        z.writestr("_rels/.rels", rels)
        for name, chunks in parts.items():
            with z.open(name, "w", force_zip64=True) as f:
                for chunk in chunks:
                    f.write(chunk)
    return buf.getvalue()


def _repeat(unit: bytes, count: int) -> Iterable[bytes]:
    """``unit * count`` in chunks of about 1 MiB."""
    per = max(1, _CHUNK // max(len(unit), 1))
    block = unit * per
    for _ in range(count // per):
        yield block
    if count % per:
        yield unit * (count % per)


def utf16_entity_docx(chars: int = 10_000_000, refs: int = 99) -> bytes:
    """A DOCX whose UTF-16 ``document.xml`` declares ``<!ENTITY a "x" * chars>`` and
    uses ``&a;`` ``refs`` times (expat's amplification guard allows up to 100x)."""
    head = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE w:document [<!ENTITY a "'
    tail = (
        f'">]><w:document xmlns:w="{_W}"><w:body><w:p><w:r><w:t>'
        + "&a;" * refs
        + "</w:t></w:r></w:p></w:body></w:document>"
    )

    def chunks() -> Iterable[bytes]:
        yield b"\xff\xfe" + head.encode("utf-16-le")
        yield from _repeat("x".encode("utf-16-le"), chars)
        yield tail.encode("utf-16-le")

    return _package("word/document.xml", DOCX, {"word/document.xml": chunks()})


def _column_letters(index: int) -> str:
    """The A1-style letters of the 0-based column ``index`` (511 -> "SR")."""
    out = ""
    n = index + 1
    while n:
        n, rem = divmod(n - 1, 26)
        out = chr(65 + rem) + out
    return out


def sparse_xlsx(rows: int = 200_000, column: int = 511) -> bytes:
    """An XLSX of one sheet whose ``rows`` rows each hold one number in ``column``
    (0-based; 511 is the 512th column, ``SR``)."""
    letters = _column_letters(column)
    workbook = (
        _XML + f'<workbook xmlns="{_S}" xmlns:r="{_DOC_REL}"><sheets>'
        '<sheet name="Sparse" sheetId="1" r:id="rId1"/></sheets></workbook>'
    )
    workbook_rels = (
        _XML + f'<Relationships xmlns="{_PKG_REL}"><Relationship Id="rId1" '
        f'Type="{_DOC_REL}/worksheet" Target="worksheets/sheet1.xml"/></Relationships>'
    )

    def sheet() -> Iterable[bytes]:
        yield (_XML + f'<worksheet xmlns="{_S}"><sheetData>').encode()
        batch: list[str] = []
        for i in range(1, rows + 1):
            batch.append(f'<row r="{i}"><c r="{letters}{i}"><v>{i % 10}</v></c></row>')
            if len(batch) == 10_000:
                yield "".join(batch).encode()
                batch = []
        yield ("".join(batch) + "</sheetData></worksheet>").encode()

    return _package(
        "xl/workbook.xml",
        XLSX,
        {
            "xl/workbook.xml": [workbook.encode()],
            "xl/_rels/workbook.xml.rels": [workbook_rels.encode()],
            "xl/worksheets/sheet1.xml": sheet(),
        },
    )


def empty_elements_docx(count: int = 5_000_000) -> bytes:
    """A DOCX whose body is ``count`` empty ``<w:x/>`` elements (and one paragraph)."""

    def chunks() -> Iterable[bytes]:
        yield (_XML + f'<w:document xmlns:w="{_W}"><w:body>').encode()
        yield from _repeat(b"<w:x/>", count)
        yield b"<w:p><w:r><w:t>end</w:t></w:r></w:p></w:body></w:document>"

    return _package("word/document.xml", DOCX, {"word/document.xml": chunks()})


def slide_ids_pptx(count: int = 1_400_000) -> bytes:
    """A PPTX whose ``presentation.xml`` lists ``count`` slide ids, all naming one slide."""
    slide = (
        _XML + f'<p:sld xmlns:p="{_P}" xmlns:a="http://schemas.openxmlformats.org/'
        'drawingml/2006/main"><p:cSld><p:spTree><p:sp><p:txBody><a:p><a:r><a:t>one slide'
        "</a:t></a:r></a:p></p:txBody></p:sp></p:spTree></p:cSld></p:sld>"
    )
    rels = (
        _XML + f'<Relationships xmlns="{_PKG_REL}"><Relationship Id="rId1" '
        f'Type="{_DOC_REL}/slide" Target="slides/slide1.xml"/></Relationships>'
    )

    def presentation() -> Iterable[bytes]:
        yield (_XML + f'<presentation xmlns="{_P}" xmlns:r="{_DOC_REL}"><sldIdLst>').encode()
        yield from _repeat(b'<sldId r:id="rId1"/>', count)
        yield b"</sldIdLst></presentation>"

    return _package(
        "ppt/presentation.xml",
        PPTX,
        {
            "ppt/presentation.xml": presentation(),
            "ppt/_rels/presentation.xml.rels": [rels.encode()],
            "ppt/slides/slide1.xml": [slide.encode()],
        },
    )


def _adler32_combine(a1: int, a2: int, len2: int) -> int:
    """zlib's adler32_combine: the Adler-32 of A+B from those of A and B (len(B))."""
    base = 65521
    rem = len2 % base
    sum1 = a1 & 0xFFFF
    sum2 = (rem * sum1) % base
    sum1 += (a2 & 0xFFFF) + base - 1
    sum2 += (a1 >> 16) + (a2 >> 16) + base - rem
    sum1 %= base
    sum2 %= base
    return sum1 | (sum2 << 16)


def _deflate_repeated(prefix: bytes, unit: bytes, count: int) -> bytes:
    """A zlib stream of ``prefix + unit * count``, built by repeating one compressed
    copy of ``unit``: after a full flush the compressor forgets its history, so the
    block it emits for ``unit`` decodes on its own, anywhere."""
    c = zlib.compressobj(9)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(unit) + c.flush(zlib.Z_FULL_FLUSH)
    check = zlib.adler32(prefix)
    unit_check = zlib.adler32(unit)
    for _ in range(count):
        check = _adler32_combine(check, unit_check, len(unit))
    # b"\x03\x00": an empty final block (fixed Huffman, end-of-block only)
    return head + block * count + b"\x03\x00" + check.to_bytes(4, "big")


def inflating_pdf(inflated: int = 4 << 30) -> bytes:
    """A one-page PDF whose content stream (FlateDecode) shows one line of text and then
    inflates to about ``inflated`` bytes of spaces: ~1 KiB on the wire per MiB."""
    prefix = b"BT /F1 12 Tf 72 740 Td (an inflating page) Tj ET\n"
    stream = _deflate_repeated(prefix, b" " * _CHUNK, max(1, inflated // _CHUNK))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def _route(make: Callable[[], bytes], content_type: str) -> Handler:
    build = functools.cache(make)

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=build(), content_type=content_type)

    return handler


ROUTES: Routes = [
    ("/documents/utf16-entity.docx", _route(utf16_entity_docx, DOCX)),
    ("/documents/sparse.xlsx", _route(sparse_xlsx, XLSX)),
    ("/documents/empty-elements.docx", _route(empty_elements_docx, DOCX)),
    ("/documents/slide-ids.pptx", _route(slide_ids_pptx, PPTX)),
    ("/documents/inflating.pdf", _route(inflating_pdf, PDF)),
]
