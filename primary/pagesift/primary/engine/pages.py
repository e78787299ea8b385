"""Pages: what a fetched response is, and how it becomes a ``Page`` off the event loop.

Owns the content side of a scrape: which responses a page request accepts
(``page_accept``: HTML, documents, text with ``allow_non_html``; anything else is
``UNSUPPORTED_CONTENT`` before its body is read), the kind of a body served without
Content-Type (``kind_of``), and ``PageMaker``, which turns the final response into a
``Page`` and owns the node's extraction workers (``workers.WorkerPool``). The
invariants:

- no page is parsed on the event loop: every HTML page is extracted in a worker
  bounded by ``extract_timeout``, every document (PDF, DOCX, PPTX, XLSX, ODT, EPUB:
  ``documents.kind_of`` by content type, magic bytes, or a generic type plus the URL's
  extension) converted in one bounded by ``document_timeout``, both under the
  workers' memory cap. Parsing holds the GIL and lexbor's time grows faster than
  linearly on hostile nesting: on the loop it would stall every other call;
- a worker that crashes, runs out of memory or is killed on its deadline fails that
  page alone (``parse_failed``, or ``too_large`` for memory and the parsers' own caps,
  with ``PageError.worker_lost``); the page is never redone inline, where a crash
  would take the node down;
- what stays on the loop is linear and bounded: ``content.decode``, ``content.sniff``
  (the first KiB) and the text of a non-HTML page;
- with ``judge_render`` (AUTO), the worker that extracts an HTML page first decides
  whether it needs a browser (``autorender.judge_and_extract``, one call): such a page
  raises ``RenderNeeded`` and is not extracted;
- FORMAT_SELECTORS reads HTML only: a document or a text page keeps ``selected`` ""
  and gets a FormatError ``not_html`` for it (``_no_selection``); an HTML page's
  selection runs in the same worker call as its other formats (``html.extract``);
- ``Page.noindex``/``nofollow`` come from meta robots and X-Robots-Tag
  (``robots.page_directives``), ``canonical`` from the page's ``<link>``, else its
  ``Link:`` header (the form PDFs use); the job runtime applies them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from pagesift.core.api.metrics import Metrics
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine import autorender, content, workers
from pagesift.primary.engine.hops import Accept, Response, status_error
from pagesift.primary.engine.interface import Page
from pagesift.primary.engine.robots import page_directives
from pagesift.primary.extract import documents, html
from pagesift.primary.extract.converted import DocumentError, DocumentTooLarge
from pagesift.primary.extract.htmlshape import TooLarge
from pagesift.primary.extract.metadata import add_metadata
from pagesift.v1 import jobs_pb2

__all__ = ["PageMaker", "RenderNeeded", "kind_of", "page_accept"]

# Imported once in the workers' forkserver, so a fresh worker starts without imports.
_WORKER_PRELOAD = (
    "pagesift.primary.extract.html",
    "pagesift.primary.extract.documents",
    "pagesift.primary.engine.autorender",
)


class RenderNeeded(Exception):
    """The HTML page needs a browser (``reason``: ``autorender.needs_render``'s); raised
    by ``PageMaker.page`` with ``judge_render`` instead of extracting it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def page_accept(allow_non_html: bool) -> Accept:
    """The ``Accept`` of a page request: the kind of a final response by its
    Content-Type ("html", "document", "text", or "sniff" without one); raises the
    page's error for an error status or a type it does not take."""

    def accept(resp: aiohttp.ClientResponse) -> str:
        if resp.status >= 400:
            raise status_error(resp)
        if "Content-Type" not in resp.headers:
            return "sniff"
        mimetype = resp.content_type
        if mimetype in content.HTML_TYPES:
            return "html"
        if documents.kind_of(mimetype, str(resp.url), b"") is not None:
            return "document"  # by its type, or a generic type and its extension
        if content.is_text(mimetype):
            if allow_non_html:
                return "text"
            raise PageError(
                ErrorCode.UNSUPPORTED_CONTENT,
                f"content type {mimetype} is not HTML (allow_non_html keeps it)",
            )
        raise PageError(ErrorCode.UNSUPPORTED_CONTENT, f"content type {mimetype} is binary")

    return accept


def kind_of(resp: Response, allow_non_html: bool) -> str:
    """The kind of a response ``page_accept`` took: its own, or for one served without
    Content-Type, sniffed from its first bytes (a document's magic, else HTML or text)."""
    if resp.kind != "sniff":
        return resp.kind
    if documents.kind_of("", resp.url, resp.body[:4096]) is not None:
        return "document"
    return content.sniff(resp.body, allow_non_html)


def _no_selection(doc: jobs_pb2.Document, options: jobs_pb2.ScrapeOptions, what: str) -> None:
    """FORMAT_SELECTORS on a page that is not HTML: ``selected`` stays "" and a
    FormatError says why."""
    if jobs_pb2.FORMAT_SELECTORS in options.formats:
        doc.format_errors.add(
            format=jobs_pb2.FORMAT_SELECTORS,
            code="not_html",
            message=f"a selector schema reads HTML; the page is {what} ({doc.content_type})",
        )


class PageMaker:
    """Final responses into ``Page``s, extracted in the node's worker processes (in a
    thread with ``extract_processes = 0``: no deadline, no memory cap, so that mode
    is for tests and tiny deployments, not for untrusted sites)."""

    def __init__(self, config: ServerConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        count = workers.worker_count(config.extract_processes)
        limits = workers.Limits(
            memory_bytes=config.worker_memory_limit, recycle_rss_bytes=config.worker_recycle_rss
        )
        self.workers = (
            workers.WorkerPool(count, limits, preload=_WORKER_PRELOAD) if count > 0 else None
        )

    async def page(
        self,
        url: str,
        resp: Response,
        kind: str,
        options: jobs_pb2.ScrapeOptions,
        agent: str,
        owner: str = "",
        *,
        judge_render: bool = False,
    ) -> Page:
        """The ``Page`` of ``url`` whose final response is ``resp`` of ``kind``
        (``kind_of``); ``agent`` is the robots.txt product token the directives are
        read for, ``owner`` the account the workers' fair share counts it to. With
        ``judge_render``, an HTML page that needs a browser raises ``RenderNeeded``."""
        doc = jobs_pb2.Document(
            url=url,
            final_url=resp.url,
            status_code=resp.status,
            content_type=resp.content_type or resp.mimetype,
        )
        doc.fetched_at.FromNanoseconds(time.time_ns())
        if kind == "document":
            await self._convert(doc, resp, options, owner)
            _no_selection(doc, options, "a document")
            noindex, nofollow = page_directives([], list(resp.robots_tag), agent)
            return Page(document=doc, canonical=resp.canonical, noindex=noindex,
                        nofollow=nofollow, validators=resp.validators)  # fmt: skip
        text = resp.text
        if text is None or kind != "html":
            text = content.decode(resp.body, resp.charset, html=kind == "html")
        if kind == "html":
            try:
                judge = resp.content_type if judge_render else None
                got = await self._extract(
                    doc, text, resp.url, options, resp.meta_headers, owner, judge
                )
            except (PageError, RenderNeeded):
                raise
            except Exception as exc:  # the parsers are lenient; keep the contract anyway
                raise PageError(ErrorCode.UNSUPPORTED_CONTENT, f"cannot extract: {exc}") from exc
            noindex, nofollow = page_directives(got.robots_meta, list(resp.robots_tag), agent)
            return Page(document=doc, links=got.links, canonical=got.canonical or resp.canonical,
                        noindex=noindex, nofollow=nofollow, validators=resp.validators)  # fmt: skip
        noindex, nofollow = page_directives([], list(resp.robots_tag), agent)
        want = html.wanted(options)
        if want.markdown:
            doc.markdown = text
        if want.raw_html:
            doc.raw_html = text
        _no_selection(doc, options, "text")
        return Page(
            document=doc,
            canonical=resp.canonical,
            noindex=noindex,
            nofollow=nofollow,
            validators=resp.validators,
        )

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()

    async def _convert(
        self,
        doc: jobs_pb2.Document,
        resp: Response,
        options: jobs_pb2.ScrapeOptions,
        owner: str,
    ) -> None:
        """A PDF or office document into ``doc`` (``documents``), within
        ``document_timeout`` and the worker memory cap: a file that cannot be read,
        a conversion that times out and a worker that dies on it are
        ``parse_failed``, one past the memory cap ``too_large``."""
        cap = self.config.max_document_pages
        max_pages = min(options.max_pages or cap, cap)
        args = (resp.body, resp.mimetype, resp.url, max_pages, documents.MAX_MARKDOWN_CHARS)
        timeout = self.config.document_timeout
        try:
            if self.workers is None:
                conv = await asyncio.to_thread(documents.convert_compact, *args)
            else:
                out = await self.workers.call(
                    documents.convert_compact, *args, timeout=timeout, owner=owner
                )
                self._worker_done(out)
                conv = out.value
        except DocumentTooLarge as exc:  # past a cap of a document reader: named
            raise PageError(ErrorCode.TOO_LARGE, exc.reason) from None
        except DocumentError as exc:
            raise PageError(ErrorCode.PARSE_FAILED, exc.reason) from None
        except workers.WorkerLost as exc:
            raise self._worker_error(exc, "the conversion", timeout) from None
        want = html.wanted(options)
        if want.markdown:
            doc.markdown = conv.markdown
        doc.title = conv.title
        doc.num_pages = conv.num_pages
        meta = {**conv.metadata, "source": conv.kind}
        for key, value in (("author", conv.author), ("created", conv.created)):
            if value:
                meta[key] = value
        if conv.modified:
            meta["modified"] = conv.modified
        add_metadata(doc.metadata, resp.meta_headers)  # bounded, headers first
        add_metadata(doc.metadata, meta.items())

    async def _extract(
        self,
        doc: jobs_pb2.Document,
        text: str,
        base_url: str,
        options: jobs_pb2.ScrapeOptions,
        headers: tuple[tuple[str, str], ...],
        owner: str,
        judge: str | None = None,
    ) -> html.Extracted:
        """Extract the page, whatever its size, within ``extract_timeout`` and the
        worker memory cap; ``headers`` (the response's ``metadata.response_metadata``)
        join ``doc.metadata``. With ``judge`` (the response's Content-Type), the same
        call first decides whether the page needs a browser: ``RenderNeeded``."""
        want = html.wanted(options)
        fn: Any = html.extract_compact
        args: tuple[object, ...] = (text, base_url, want, options.only_main_content)
        if judge is not None:
            fn, args = autorender.judge_and_extract, (text, judge, *args[1:])
        timeout = self.config.extract_timeout
        try:
            if self.workers is None:
                got = await asyncio.to_thread(fn, *args)
            else:
                out = await self.workers.call(fn, *args, timeout=timeout, owner=owner)
                self._worker_done(out)
                got = out.value
        except TooLarge as exc:  # past a cap of ``htmlshape``: named
            raise PageError(ErrorCode.TOO_LARGE, exc.reason) from None
        except workers.WorkerLost as exc:
            raise self._worker_error(exc, "the extraction", timeout) from None
        if isinstance(got, str):
            raise RenderNeeded(got)
        assert isinstance(got, html.Extracted)
        html.apply(doc, got, want, text, headers)
        return got

    def _worker_done(self, out: workers.Outcome[Any]) -> None:
        if self.metrics is not None:
            self.metrics.worker_call(out.peak_rss_bytes)

    def _worker_error(self, exc: workers.WorkerLost, what: str, timeout: float) -> PageError:
        """The page error for a call whose worker was lost, naming the cause."""
        if self.metrics is not None:
            self.metrics.worker_lost(exc.cause)
        if isinstance(exc, workers.WorkerTimeout):
            msg = f"{what} took over {timeout:g}s (its worker was killed)"
            return PageError(ErrorCode.PARSE_FAILED, msg, worker_lost=True)
        if isinstance(exc, workers.WorkerOutOfMemory):
            cap = workers.describe_bytes(self.config.worker_memory_limit)
            msg = f"{what} needed more than the worker memory cap ({cap})"
            return PageError(ErrorCode.TOO_LARGE, msg, worker_lost=True)
        if isinstance(exc, workers.PoolClosed):  # the node is stopping: a transient failure
            return PageError(ErrorCode.TIMEOUT, f"{what} was cut short: the node is stopping")
        if exc.charged:
            return PageError(ErrorCode.PARSE_FAILED, f"{what} crashed: {exc}", worker_lost=True)
        return PageError(ErrorCode.PARSE_FAILED, f"no extraction worker could run it: {exc}")
