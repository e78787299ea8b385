"""A tiny, dependency-free writer of real text PDFs, kept for what fpdf2 (the tests' PDF
writer) cannot do: an Info ``/ModDate`` (tests/test_documents.py), and for
tests/test_extraction_controls.py.

``text_pdf`` writes a valid PDF 1.4 file (catalog, page tree, one standard Helvetica
font, one content stream per page, an Info dictionary and a byte-exact xref table), the
way any PDF producer does, so readers parse it through their normal path. Text is
ASCII (Helvetica's WinAnsi subset); each page holds its lines top to bottom.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["text_pdf"]


def _pdf_string(text: str) -> bytes:
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    return b"(" + escaped.encode("latin-1") + b")"


def text_pdf(
    pages: Sequence[Sequence[str]],
    *,
    title: str = "",
    author: str = "",
    created: str = "",
    modified: str = "",
) -> bytes:
    """A PDF whose page ``i`` shows the lines ``pages[i]``; ``created``/``modified`` are
    PDF dates (``D:20240102030405Z``). Info entries left "" are omitted."""
    objects: list[bytes] = []  # object i+1

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in below, once the page tree's number is known
    tree = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    kids: list[int] = []
    for lines in pages:
        ops = [b"BT", b"/F1 12 Tf", b"14 TL", b"72 740 Td"]
        for line in lines:
            ops.append(_pdf_string(line) + b" Tj T*")
        ops.append(b"ET")
        stream = b"\n".join(ops)
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        kids.append(
            add(
                b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] "
                b"/Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>"
                % (tree, font, content)
            )
        )
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % tree
    objects[tree - 1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids),
        len(kids),
    )
    entries = {"Title": title, "Author": author, "CreationDate": created, "ModDate": modified}
    info_body = b" ".join(
        b"/" + key.encode() + b" " + _pdf_string(value) for key, value in entries.items() if value
    )
    info = add(b"<< /Producer (pagesift tests) " + info_body + b" >>")

    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root %d 0 R /Info %d 0 R >>\n" % (
        len(objects) + 1,
        catalog,
        info,
    )
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)
