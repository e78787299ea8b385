"""AUTO's decision: does a fetched page need a browser, and does its host always need one?

Owns the pure parts of ``FETCH_ENGINE_AUTO`` (``rendering.RenderingEngine`` is the shell):

- ``needs_render(body, content_type)``: the reason an HTML body needs rendering ("empty
  app root #root", "noscript asks for JavaScript", "scripts and little text"), or None;
- ``judge_and_extract``: that decision and, when no browser is needed, the page's
  extraction, as ONE call of an extraction worker (``pages.PageMaker.page`` with
  ``judge_render``): the decision costs no round trip of its own and no time on the
  event loop, and a page that needs a browser is not extracted at all;
- ``HostMemory``: per (owner, host), how many pages AUTO fetched and how many of them
  needed rendering; after ``threshold`` needed (and most did), the host's next pages go
  straight to the browser, so a JS-only host is not fetched twice per page. At most
  ``capacity`` hosts, least recently used dropped first.

Why it is safe with hostile bytes (it runs in a worker, and was built to be safe even on
the event loop): ``needs_render`` parses nothing.
It reads at most ``SCAN_BYTES`` of the body and works with ``bytes.find``/``count``,
``bytes.translate`` and one regex (``<[^<>]*>``) that cannot backtrack past the next
``<`` or ``>``: every byte is visited a bounded number of times, so its time is
linear in at most ``SCAN_BYTES`` (under 50 ms on the worst input tried, ~1 ms on real pages);
it allocates a few copies of that prefix at most. Text counting stops once the page
has ``RICH_TEXT`` visible characters: a page with that much text never needs a browser.
The skipped parts (scripts, styles, ...) are found by one case-insensitive alternation,
searched at most a step ahead of the count and again only once passed, so a byte is
searched once and a text page is read only as far as its first ``RICH_TEXT`` characters;
the prefix is lowercased only for the checks of a page with little text.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from pagesift.primary.extract import html

__all__ = [
    "LITTLE_TEXT",
    "RICH_TEXT",
    "SCAN_BYTES",
    "HostMemory",
    "judge_and_extract",
    "needs_render",
]

SCAN_BYTES = 512 << 10  # the prefix of a body the decision reads
LITTLE_TEXT = 200  # fewer visible characters than this, with scripts: render
RICH_TEXT = 1500  # at least this many: never render (the page carries its content)

_STEP = 16384  # text is counted this many bytes at a time (a tag cut at a step: a few chars)
_HTML_TYPES = (b"text/html", b"application/xhtml+xml")
_TAG = re.compile(rb"<[^<>]*>")  # linear: stops at the next < or >
_WHITESPACE = b" \t\r\n\f\v\xa0"
# Element ids single-page frameworks mount into (React, Vue, Next, Nuxt, Svelte, Gatsby...).
_ROOT_IDS = (b"root", b"app", b"__next", b"__nuxt", b"svelte", b"___gatsby", b"main-app")
_PARTS = {b"<script": b"</script", b"<style": b"</style", b"<!--": b"-->",
          b"<template": b"</template", b"<noscript": b"</noscript"}  # fmt: skip
# The parts whose bytes are no visible text (ASCII case ignored, as bytes.lower does): one
# alternation, searched a step ahead of the count at most; each opener's closer.
_OPENER = re.compile(b"|".join(re.escape(o) for o in _PARTS), re.IGNORECASE)
_OPENER_MAX = max(len(o) for o in _PARTS)
_CLOSERS = {o: re.compile(re.escape(c), re.IGNORECASE) for o, c in _PARTS.items()}
_NOSCRIPT_END = _CLOSERS[b"<noscript"]
_JS_ASKS = (
    b"enable javascript", b"javascript is required", b"requires javascript",
    b"javascript to run", b"javascript enabled", b"turn on javascript",
    b"javascript must be enabled", b"activate javascript", b"support javascript",
)  # fmt: skip


def needs_render(body: bytes | str, content_type: str = "") -> str | None:
    """Why the HTML ``body`` needs a browser, or None (not HTML, or it has its content)."""
    ctype = content_type.split(";", 1)[0].strip().lower().encode()
    if ctype and ctype not in _HTML_TYPES:
        return None
    raw = body[:SCAN_BYTES].encode("utf-8", "replace") if isinstance(body, str) else body
    text, noscript = _visible_text(raw[:SCAN_BYTES])
    if text >= RICH_TEXT:
        return None
    page = raw[:SCAN_BYTES].lower()
    root = _empty_root(page)
    if root is not None:
        return f"empty app root {root}"
    if any(ask in _squeeze(noscript) for ask in _JS_ASKS):
        return "noscript asks for JavaScript"
    if text < LITTLE_TEXT and page.count(b"<script") > 0:
        return "scripts and little text"
    return None


def judge_and_extract(
    text: str, content_type: str, base_url: str, want: html.Wanted, only_main_content: bool
) -> str | html.Extracted:
    """AUTO's step in an extraction worker: the reason the HTML ``text`` needs a browser
    (``needs_render``; the page is then not extracted), else its extraction
    (``extract.extract_compact``)."""
    reason = needs_render(text, content_type)
    if reason is not None:
        return reason
    return html.extract_compact(text, base_url, want, only_main_content)


def _squeeze(chunk: bytes) -> bytes:
    """``chunk`` with its tags gone and its whitespace runs as one space."""
    return b" ".join(_TAG.sub(b" ", chunk).split())


def _visible_text(page: bytes) -> tuple[int, bytes]:
    """(visible characters outside scripts, styles, comments, templates and noscripts,
    counted up to ``RICH_TEXT``; the noscripts' own bytes, lowercased, at most 64 KiB).
    ``page`` in any case: the parts are found case-insensitively."""
    count, pos, noscript = 0, 0, bytearray()
    size = len(page)
    opener: re.Match[bytes] | None = None  # the next skipped part, found ahead of ``pos``
    while pos < size and count < RICH_TEXT:
        if opener is None or opener.start() < pos:  # searched a step ahead at most
            opener = _OPENER.search(page, pos, pos + _STEP + _OPENER_MAX)
        start = size if opener is None else opener.start()
        end = min(start, pos + _STEP)
        count += len(_TAG.sub(b"", page[pos:end]).translate(None, _WHITESPACE))
        if opener is None or end < start:
            pos = end  # text counted a step at a time, to stop early
            continue
        closer = _CLOSERS[opener.group().lower()]
        close = closer.search(page, opener.end())
        stop = size if close is None else close.end()
        if closer is _NOSCRIPT_END and len(noscript) < 65536:
            noscript += page[start : min(stop, start + 65536)].lower()
        pos = stop
    return count, bytes(noscript)


def _empty_root(page: bytes) -> str | None:
    """The selector of an app root element with nothing inside, or None."""
    for ident in _ROOT_IDS:
        for quote in (b'"', b"'"):
            at = page.find(b"id=" + quote + ident + quote)
            if at >= 0 and _empty_after(page, at):
                return "#" + ident.decode()
    at = page.find(b"ng-version")
    if at >= 0 and _empty_after(page, at):
        return "[ng-version]"
    at = page.find(b"<app-root")
    if at >= 0 and _empty_after(page, at):
        return "app-root"
    return None


def _empty_after(page: bytes, at: int) -> bool:
    """Whether the element whose opening tag holds ``at`` closes with only whitespace
    or comments inside."""
    gt = page.find(b">", at)
    if gt < 0 or page[gt - 1 : gt] == b"/":  # self-closing: nothing to mount into
        return gt >= 0
    pos = gt + 1
    while True:
        while pos < len(page) and page[pos] in _WHITESPACE:
            pos += 1
        if page.startswith(b"<!--", pos):
            close = page.find(b"-->", pos)
            if close < 0:
                return True
            pos = close + 3
            continue
        return page.startswith(b"</", pos) or pos >= len(page)


@dataclass
class _Seen:
    fetched: int = 0  # pages AUTO fetched over HTTP and judged
    needed: int = 0  # of those, pages that needed rendering


class HostMemory:
    """Per (owner, host): whether AUTO should render at once (module docstring). Pure:
    no clock, no I/O; ``capacity`` hosts at most, the least recently used dropped."""

    def __init__(self, capacity: int = 4096, threshold: int = 2, ratio: float = 0.75) -> None:
        self.capacity = max(1, capacity)
        self.threshold = max(1, threshold)
        self.ratio = ratio
        self._hosts: OrderedDict[tuple[str, str], _Seen] = OrderedDict()

    def record(self, owner: str, host: str, needed: bool) -> None:
        """AUTO fetched a page of ``host`` for ``owner``; ``needed``: it had to render it."""
        key = (owner, host)
        seen = self._hosts.pop(key, None) or _Seen()
        seen.fetched += 1
        seen.needed += int(needed)
        self._hosts[key] = seen
        while len(self._hosts) > self.capacity:
            self._hosts.popitem(last=False)

    def render_first(self, owner: str, host: str) -> bool:
        """Whether ``host``'s pages for ``owner`` go straight to the browser."""
        seen = self._hosts.get((owner, host))
        if seen is None:
            return False
        self._hosts.move_to_end((owner, host))
        return seen.needed >= self.threshold and seen.needed >= self.ratio * seen.fetched

    def __len__(self) -> int:
        return len(self._hosts)
