"""What a fetched body is and how it becomes text: content-type classes, sniffing, decoding.

Owns the pure, I/O-free part of turning a response into a document body, used by
``pages`` and ``http.HttpEngine``. The guarantees:

- ``is_text`` / ``HTML_TYPES`` classify a MIME type as HTML, other text, or binary;
- ``sniff`` gives the kind of a body served without Content-Type (``html`` or
  ``text``), or raises ``PageError(UNSUPPORTED_CONTENT)``;
- ``decode`` never raises: BOM, else the header charset, else ``<meta charset>``
  (HTML only), else UTF-8; Latin-1 labels mean windows-1252 (WHATWG), an unknown
  charset falls back to UTF-8, and bad bytes are replaced.
- ``meta_refresh`` finds a ``<meta http-equiv="refresh" content="N; url=...">`` with
  a target and a delay of at most ``META_REFRESH_MAX_DELAY`` seconds (the engine
  follows it as one more redirect hop); it reads only the first 64 KiB of the page.
"""

from __future__ import annotations

import html
import re

from pagesift.core.jobs.pageerrors import ErrorCode, PageError

__all__ = ["HTML_TYPES", "META_REFRESH_MAX_DELAY", "decode", "is_text", "meta_refresh", "sniff"]

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


# A refresh slower than this is a page that reloads itself (a live score, a
# dashboard), not a redirect: its own content is the page.
META_REFRESH_MAX_DELAY = 10.0
_META_TAG = re.compile(r"<meta\b[^>]{0,1000}>", re.I)
_ATTR = re.compile(r"""([A-Za-z][A-Za-z0-9_:-]*)\s*=\s*("[^"]*"|'[^']*'|[^\s"'>]+)""")
_REFRESH = re.compile(
    r"""\s*(\d+(?:\.\d*)?)?\s*(?:[;,]\s*(?:url\s*=\s*)?(["']?)(.*?)\2?\s*)?$""",
    re.I | re.S,
)


def meta_refresh(text: str) -> str | None:
    """The target of the page's first ``<meta http-equiv="refresh">`` whose delay is at
    most ``META_REFRESH_MAX_DELAY`` seconds, as written (relative or absolute,
    entities decoded); None when there is none, it has no target, or it is slower."""
    head = text[:65536]
    if "efresh" not in head:
        return None
    for tag in _META_TAG.finditer(head):
        attrs = {k.lower(): html.unescape(v.strip("\"'")) for k, v in _ATTR.findall(tag.group(0))}
        if attrs.get("http-equiv", "").strip().lower() != "refresh":
            continue
        m = _REFRESH.match(attrs.get("content", ""))
        if m is None or m.group(1) is None:
            return None
        if float(m.group(1)) > META_REFRESH_MAX_DELAY:
            return None
        target = (m.group(3) or "").strip()
        return target or None
    return None
