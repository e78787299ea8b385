"""The bounds of ``Document.metadata``, and the response headers that join it.

Owns the caps every path that fills ``Document.metadata`` applies (the HTML head,
a document's properties, the response headers): at most ``MAX_METADATA_KEYS`` keys of
at most ``MAX_METADATA_KEY`` characters, values cut at ``MAX_METADATA_VALUE``
characters. A page chooses its own meta tags, so without these a page could make its
stored document (and every WatchJob message carrying it) as large as it likes.

Invariants: ``add_metadata`` never replaces a key already there (so what is added
first wins: the engine adds the response headers before the page's own keys), and
never passes the key cap. Pure functions; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

__all__ = [
    "MAX_METADATA_KEY",
    "MAX_METADATA_KEYS",
    "MAX_METADATA_VALUE",
    "add_metadata",
    "bounded",
    "response_metadata",
]

MAX_METADATA_KEYS = 100
MAX_METADATA_VALUE = 1024  # characters
MAX_METADATA_KEY = 128  # characters; a longer key is dropped


def bounded(value: str) -> str:
    """``value`` cut at ``MAX_METADATA_VALUE`` characters."""
    return value if len(value) <= MAX_METADATA_VALUE else value[:MAX_METADATA_VALUE]


# Response headers kept as metadata: header name -> metadata key.
_HEADER_KEYS = (
    ("ETag", "etag"),
    ("Last-Modified", "last-modified"),
    ("Content-Language", "content-language"),
    ("Cache-Control", "cache-control"),
)


def response_metadata(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The metadata entries of a response's headers (``etag``, ``last-modified``,
    ``content-language``, ``cache-control``: the ones it has), values bounded."""
    out = []
    for header, key in _HEADER_KEYS:
        value = headers.get(header)
        if value:
            out.append((key, bounded(value.strip())))
    return tuple(out)


def add_metadata(target: MutableMapping[str, str], items: Iterable[tuple[str, str]]) -> None:
    """Add ``items`` to ``target`` (a ``Document.metadata``) within the bounds: keys
    already there are kept, no more than ``MAX_METADATA_KEYS`` in all, values cut."""
    for key, value in items:
        if key in target or len(key) > MAX_METADATA_KEY:
            continue
        if len(target) >= MAX_METADATA_KEYS:
            return
        target[key] = bounded(value)
