"""The page cache and change tracking: what an account fetched before, kept in the store.

Layout (store KVs, written through ``Store.write`` like every durable change, so they
are replicated and a promoted standby starts with a warm cache):

    KV cache/{account}/{sha256(page key, shaping options)}  CachedPage (store.proto)
    KV cache/{account}/model/{answer digest}                 a model format's answer,
                                                            JSON {"value", "stored_ms"}
                                                            (``models.formats``)
    KV track/{account}/{sha256(page key)}                   TrackedPage
    KV crawlset/{account}/{sha256(start page key)}          page keys of the account's
                                                            last change-tracked crawl
                                                            from that start, one per line
    KV stamp/{cache or track key}                           when it was written (8 bytes,
                                                            ms): what ``sweep`` reads

The page key is ``urls.normalize`` of the URL. The shaping options are the request's
``ScrapeOptions`` serialized deterministically without ``max_age``,
``change_tracking_diff`` and the change-tracking format: everything that can change
the document (formats, extraction options, headers, cookies, user agent, proxy...)
selects its own entry.

Privacy: nothing is shared between accounts. A page fetched with one account's
cookies, headers or proxy may differ from what another would get, and an entry tells
what was crawled; one account's cache can never answer another's request.

Freshness (``fresh``): an entry younger than the request's ``max_age`` is the answer,
without a fetch (``Page.cache == "hit"``). An older entry lends its ETag and
Last-Modified to the fetch (``FetchPolicy.validators``); a ``304 Not Modified`` reuses
its document (``"revalidated"``) and counts as a fresh fetch: the entry is stamped
again. Entries are written only for requests that set ``max_age``, in the page's own
write group (``remember``), so the cache never holds a page its job did not store.

Change tracking (``track``): inside the page's write group, the page's markdown is
compared with the account's previous change-tracked scrape of the URL (``new``,
``same`` by SHA-256, ``changed``, with a unified diff when asked), and the new
scrape replaces the record. Reading and writing in one group means two jobs scraping
one URL at once each compare against a whole previous scrape, never half of one.
``crawl_removed`` compares a finished crawl's stored pages with the account's previous
change-tracked crawl from the same start URL.

Model answers (``model_key``) follow the page cache's rules: kept only for requests
that set ``max_age``, in the group of the page whose fetch asked the model, answering
a request only while younger than its ``max_age`` (``model_answer``), and swept with
the page entries. Their name is the digest of the markdown and the question, not the
URL, so the same content asked the same question is answered once.

Bounds: a diff is cut at ``MAX_DIFF_CHARS``; entries older than ``page_cache_ttl`` /
``change_tracking_ttl`` are deleted by ``sweep`` (the job runtime's expiry sweeper),
which reads only the 8-byte stamps, never the pages, and deletes at most
``SWEEP_BATCH`` keys per write group.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Sequence

from pagesift.core.jobs import urls
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.engine.interface import Page
from pagesift.v1 import jobs_pb2, store_pb2

__all__ = [
    "cache_key",
    "compare",
    "crawl_removed",
    "fresh",
    "lookup",
    "model_answer",
    "model_key",
    "page_of",
    "remember",
    "sweep",
    "track",
    "tracks_changes",
]

CACHE_PREFIX = "cache/"
TRACK_PREFIX = "track/"
CRAWLSET_PREFIX = "crawlset/"
STAMP_PREFIX = "stamp/"
MAX_DIFF_CHARS = 1_000_000
SWEEP_BATCH = 500


def _page_key(url: str) -> str:
    try:
        return urls.normalize(url)
    except ValueError:
        return url


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def tracks_changes(options: jobs_pb2.ScrapeOptions) -> bool:
    return jobs_pb2.FORMAT_CHANGE_TRACKING in options.formats


def max_age_ms(options: jobs_pb2.ScrapeOptions) -> int:
    """The request's ``max_age`` in milliseconds (0: no cache)."""
    if not options.HasField("max_age"):
        return 0
    return max(0, options.max_age.seconds * 1000 + options.max_age.nanos // 1_000_000)


def cache_key(owner: str, url: str, options: jobs_pb2.ScrapeOptions) -> str:
    shaping = jobs_pb2.ScrapeOptions()
    shaping.CopyFrom(options)
    shaping.ClearField("max_age")
    shaping.ClearField("change_tracking_diff")
    formats = [f for f in shaping.formats if f != jobs_pb2.FORMAT_CHANGE_TRACKING]
    del shaping.formats[:]
    shaping.formats.extend(formats)
    key = _digest(_page_key(url).encode(), shaping.SerializeToString(deterministic=True))
    return f"{CACHE_PREFIX}{owner}/{key}"


def model_key(owner: str, digest: str) -> str:
    return f"{CACHE_PREFIX}{owner}/model/{digest}"


def model_answer(store: Store, owner: str, digest: str, max_age: int, now_ms: int) -> bytes | None:
    """The account's model answer ``digest`` when younger than ``max_age`` ms, else None."""
    key = model_key(owner, digest)
    raw, stamp = store.get(key), store.get(STAMP_PREFIX + key)
    if raw is None or stamp is None or not 0 <= now_ms - int.from_bytes(stamp, "big") < max_age:
        return None
    return raw


def lookup(store: Store, key: str) -> store_pb2.CachedPage | None:
    raw = store.get(key)
    return None if raw is None else store_pb2.CachedPage.FromString(raw)


def fresh(entry: store_pb2.CachedPage, max_age: int, now_ms: int) -> bool:
    """Whether ``entry`` may answer a request with ``max_age`` (ms) at ``now_ms``."""
    return max_age > 0 and 0 <= now_ms - entry.stored_ms < max_age


def page_of(entry: store_pb2.CachedPage, url: str, how: str) -> Page:
    """The cached page as a fresh ``Page`` for ``url`` (``how``: "hit" or
    "revalidated"); the document says it came from the cache."""
    doc = jobs_pb2.Document()
    doc.CopyFrom(entry.document)
    doc.url = url
    doc.cache_hit = True
    return Page(
        document=doc,
        links=list(entry.links),
        canonical=entry.canonical,
        noindex=entry.noindex,
        nofollow=entry.nofollow,
        cache=how,
    )


def remember(
    g: WriteGroup, owner: str, url: str, options: jobs_pb2.ScrapeOptions, page: Page, now_ms: int
) -> None:
    """Inside the page's group: cache the page when the request set ``max_age`` and
    the page was fetched or revalidated now (a plain hit changes nothing)."""
    if max_age_ms(options) <= 0 or page.cache == "hit":
        return
    doc = jobs_pb2.Document()
    doc.CopyFrom(page.document)
    doc.cache_hit = False
    doc.change_status = jobs_pb2.CHANGE_STATUS_UNSPECIFIED
    doc.change_diff = ""
    doc.ClearField("previous_scrape_at")
    entry = store_pb2.CachedPage(
        document=doc,
        stored_ms=now_ms,
        etag=page.validators[0],
        last_modified=page.validators[1],
        links=page.links,
        canonical=page.canonical,
        noindex=page.noindex,
        nofollow=page.nofollow,
    )
    _put_stamped(g, cache_key(owner, url, options), entry.SerializeToString(), now_ms)
    for digest, record in page.model_answers:
        _put_stamped(g, model_key(owner, digest), record, now_ms)


def _put_stamped(g: WriteGroup, key: str, value: bytes, now_ms: int) -> None:
    g.put(key, value)
    g.put(STAMP_PREFIX + key, now_ms.to_bytes(8, "big"))


def compare(
    previous: store_pb2.TrackedPage | None, markdown: str, want_diff: bool
) -> tuple[jobs_pb2.ChangeStatus.ValueType, str]:
    """(status, diff) of ``markdown`` against the previous tracked scrape."""
    if previous is None:
        return jobs_pb2.CHANGE_STATUS_NEW, ""
    if hashlib.sha256(markdown.encode()).digest() == previous.markdown_sha256:
        return jobs_pb2.CHANGE_STATUS_SAME, ""
    diff = ""
    if want_diff:
        lines = difflib.unified_diff(
            previous.markdown.splitlines(),
            markdown.splitlines(),
            fromfile="previous",
            tofile="current",
            lineterm="",
        )
        diff = "\n".join(lines)[:MAX_DIFF_CHARS]
    return jobs_pb2.CHANGE_STATUS_CHANGED, diff


def track(g: WriteGroup, owner: str, doc: jobs_pb2.Document, want_diff: bool, now_ms: int) -> None:
    """Inside the page's group: set ``doc``'s change status (and diff, and when the
    previous scrape was stored) against the account's previous scrape of its URL, and
    record this scrape in its place."""
    key = f"{TRACK_PREFIX}{owner}/{_digest(_page_key(doc.url).encode())}"
    raw = g.get(key)
    previous = None if raw is None else store_pb2.TrackedPage.FromString(raw)
    doc.change_status, doc.change_diff = compare(previous, doc.markdown, want_diff)
    doc.ClearField("previous_scrape_at")
    if previous is not None:
        doc.previous_scrape_at.FromMilliseconds(previous.scraped_ms)
    record = store_pb2.TrackedPage(
        scraped_ms=now_ms,
        markdown_sha256=hashlib.sha256(doc.markdown.encode()).digest(),
        markdown=doc.markdown,
    )
    _put_stamped(g, key, record.SerializeToString(), now_ms)


def crawl_removed(g: WriteGroup, owner: str, start_url: str, stored: Sequence[str]) -> list[str]:
    """Inside a group, at a change-tracked crawl's end: the page keys the account's
    previous change-tracked crawl from ``start_url`` stored and this one (``stored``:
    its documents' URLs) did not, sorted; this crawl becomes the previous one."""
    key = f"{CRAWLSET_PREFIX}{owner}/{_digest(_page_key(start_url).encode())}"
    current = sorted({_page_key(u) for u in stored})
    raw = g.get(key)
    before = set(raw.decode().split("\n")) if raw else set()
    g.put(key, "\n".join(current).encode())
    return sorted(before.difference(current) - {""})


def sweep(store: Store, now_ms: int, cache_ttl_ms: int, track_ttl_ms: int) -> int:
    """Delete cache entries older than ``cache_ttl_ms`` and tracking records older
    than ``track_ttl_ms`` (by their stamps); returns how many. (Crawl sets are one
    small KV per account and start URL, and kept.)"""
    stale: list[str] = []
    for stamp in store.keys(STAMP_PREFIX):
        key = stamp[len(STAMP_PREFIX) :]
        raw = store.get(stamp)
        ttl = cache_ttl_ms if key.startswith(CACHE_PREFIX) else track_ttl_ms
        if raw is None or now_ms - int.from_bytes(raw, "big") > ttl:
            stale.append(key)
    for start in range(0, len(stale), SWEEP_BATCH):
        batch = stale[start : start + SWEEP_BATCH]

        def group(g: WriteGroup, batch: list[str] = batch) -> None:
            for key in batch:
                g.delete(key)
                g.delete(STAMP_PREFIX + key)

        store.write(group)
    return len(stale)
