"""What a fetched body is and how it becomes text: content-type classes, sniffing, decoding.

Owns the pure, I/O-free part of turning a response into a document body, used by
``fetch.HttpEngine``. The guarantees:

- ``is_text`` / ``HTML_TYPES`` classify a MIME type as HTML, other text, or binary;
- ``sniff`` gives the kind of a body served without Content-Type (``html`` or
  ``text``), or raises ``PageError(UNSUPPORTED_CONTENT)``;
- ``decode`` never raises: BOM, else the header charset, else ``<meta charset>``
  (HTML only), else UTF-8; Latin-1 labels mean windows-1252 (WHATWG), an unknown
  charset falls back to UTF-8, and bad bytes are replaced.
"""

from __future__ import annotations

import re

from pagesift.shared.errors import ErrorCode, PageError

__all__ = ["HTML_TYPES", "decode", "is_text", "sniff"]

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/ecmascript",
        "application/x-javascript",
        "application/rss+xml",
        "application/atom+xml",
        "application/x-ndjson",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/csv",
    }
)
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:\-]+)""", re.I)
# WHATWG: these labels mean windows-1252 in HTML.
_CHARSET_ALIASES = {
    "iso-8859-1": "cp1252",
    "iso8859-1": "cp1252",
    "latin1": "cp1252",
    "latin-1": "cp1252",
    "us-ascii": "cp1252",
    "ascii": "cp1252",
    "windows-1252": "cp1252",
}


def is_text(mimetype: str) -> bool:
    return (
        mimetype.startswith("text/")
        or mimetype in _TEXT_TYPES
        or mimetype.endswith(("+json", "+xml"))
    )


def sniff(body: bytes, allow_non_html: bool) -> str:
    """Kind of a body served without Content-Type: html, text, or PageError."""
    head = body[:1024].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")) or b"<html" in head or b"<body" in head:
        return "html"
    if b"\x00" in head:
        raise PageError(ErrorCode.UNSUPPORTED_CONTENT, "no content type and a binary body")
    if allow_non_html:
        return "text"
    raise PageError(ErrorCode.UNSUPPORTED_CONTENT, "no content type and not HTML")


def decode(body: bytes, charset: str | None, *, html: bool) -> str:
    """Body -> text: BOM, else header charset, else <meta charset>, else UTF-8."""
    if body[:3] == b"\xef\xbb\xbf":
        return body[3:].decode("utf-8", errors="replace")
    if body[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return body.decode("utf-16", errors="replace")
    if charset is None and html:
        m = _META_CHARSET.search(body, 0, 2048)
        if m is not None:
            charset = m.group(1).decode("ascii", errors="replace")
    if charset is None:
        return body.decode("utf-8", errors="replace")
    charset = charset.strip().lower()
    charset = _CHARSET_ALIASES.get(charset, charset)
    try:
        return body.decode(charset, errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")
