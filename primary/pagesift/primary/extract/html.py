"""HTML -> Document fields: the one parse per page, and what it yields into a Document.

Owns ``extract`` (parse a page once and read every field from that one tree),
``extract_compact`` (the same, run in an extraction worker process: only what the
document needs travels back), ``apply`` (copy a result into a ``Document``) and
``Wanted`` (which formats and extraction controls a job asks for). The reading itself
is split by concern: ``htmlshape`` (the shape check before parsing), ``htmlhead``
(title, description, canonical, robots, metadata), ``htmllinks`` (links, anchor
texts, images), ``selectors`` (a selector schema's JSON, FORMAT_SELECTORS),
``htmlclean`` (content root, controls, cleaning, markdown) and ``metadata`` (the
bounds of ``Document.metadata``).

Invariants:

- The page is parsed exactly once (selectolax ``LexborHTMLParser``), after
  ``htmlshape.check_shape`` has admitted it; the work for a format is done only when
  the format is asked for (no formats = markdown only).
- ``links`` is always filled (the crawler needs it whatever the formats), read before
  any cleaning; metadata always, in one pass over the head.
- A selector schema reads the whole page (like links and images: the extraction
  controls and ``only_main_content`` shape markdown and html only), before any
  cleaning; when its JSON would pass ``selectors.MAX_SELECTED_BYTES`` the document
  gets a FormatError (``too_large``) for FORMAT_SELECTORS instead, the rest kept.
- ``<base href>`` (http(s) only) overrides the fetched URL for every relative URL.
- ``Wanted`` and ``Extracted`` are small and picklable: they cross the process
  boundary (``engine.workers`` pickles ``extract_compact`` by its module path).

Nothing here does I/O; ``extract`` is safe to run in a worker thread or process.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser

from pagesift.core.jobs import urls
from pagesift.primary.extract import htmlclean, htmlhead, htmllinks, selectors
from pagesift.primary.extract.htmlshape import check_shape
from pagesift.primary.extract.metadata import add_metadata
from pagesift.v1 import jobs_pb2

__all__ = [
    "Extracted",
    "Wanted",
    "apply",
    "extract",
    "extract_compact",
    "fill_document",
    "wanted",
]


@dataclass(frozen=True, slots=True)
class Wanted:
    """Which document formats to produce, and the extraction controls that shape them
    (small and picklable: it travels to the worker processes)."""

    markdown: bool = True
    html: bool = False
    raw_html: bool = False
    links: bool = False
    images: bool = False
    include_tags: tuple[str, ...] = ()
    exclude_tags: tuple[str, ...] = ()
    remove_base64_images: bool = False
    # FORMAT_SELECTORS: the schema, serialized (deterministically); b"" when not asked
    selectors: bytes = b""


_MARKDOWN_FORMATS = frozenset(
    {jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_JSON, jobs_pb2.FORMAT_SUMMARY}
)
_WantedKey = tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...], bool, bytes]
_WANTED_CACHE: dict[_WantedKey, Wanted] = {}
_CACHED_SCHEMA_BYTES = 16 << 10  # a bigger selector schema is not kept (256 of them would weigh)


def wanted(options: jobs_pb2.ScrapeOptions) -> Wanted:
    """What ``options`` asks for (an empty format list means markdown only)."""
    key = (
        tuple(options.formats),
        tuple(options.include_tags),
        tuple(options.exclude_tags),
        options.remove_base64_images,
        options.selectors.SerializeToString(deterministic=True)
        if jobs_pb2.FORMAT_SELECTORS in options.formats
        else b"",
    )
    got = _WANTED_CACHE.get(key)
    if got is None:
        fmts = set(key[0])
        got = Wanted(
            # the model formats read the page's markdown (and it is stored with them)
            markdown=not fmts or bool(fmts & _MARKDOWN_FORMATS),
            html=jobs_pb2.FORMAT_HTML in fmts,
            raw_html=jobs_pb2.FORMAT_RAW_HTML in fmts,
            links=jobs_pb2.FORMAT_LINKS in fmts,
            images=jobs_pb2.FORMAT_IMAGES in fmts,
            include_tags=key[1],
            exclude_tags=key[2],
            remove_base64_images=key[3],
            selectors=key[4],
        )
        if len(_WANTED_CACHE) < 256 and len(key[4]) <= _CACHED_SCHEMA_BYTES:
            _WANTED_CACHE[key] = got
    return got


@dataclass(slots=True)
class Extracted:
    """What one parse of a page yields ("" for what was not asked for).

    ``cleaned`` is the cleaned HTML (filled when markdown or html is wanted) and
    ``base_url`` the URL relative links resolve against (``<base href>`` applied);
    ``extract_compact`` drops ``cleaned`` when only markdown was asked for.
    """

    title: str = ""
    description: str = ""
    language: str = ""
    links: list[str] = field(default_factory=list)
    markdown: str = ""
    html: str = ""
    cleaned: str = ""
    base_url: str = ""
    canonical: str = ""
    robots_meta: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)
    link_texts: list[str] = field(default_factory=list)  # parallel to links (FORMAT_LINKS)
    selected: str = ""  # FORMAT_SELECTORS: the schema's JSON
    selected_error: tuple[str, str] = ("", "")  # (code, message) when it gave none


def extract(
    html: str,
    base_url: str,
    *,
    want: Wanted = Wanted(),  # frozen, shared safely
    only_main_content: bool = False,
) -> Extracted:
    """Parse ``html`` once and produce what ``want`` asks for (links always).

    ``base_url`` is the URL the page was fetched from after redirects; a
    ``<base href>`` in the page overrides it. Raises ``htmlshape.TooLarge`` for a page past
    ``MAX_HTML_DEPTH`` or ``MAX_HTML_ELEMENTS`` (``htmlshape.check_shape``), before
    parsing it.
    """
    check_shape(html)
    tree = LexborHTMLParser(html)
    head = htmlhead.read_head(tree)
    page_url = base_url
    if head.base_href:
        joined = urljoin(base_url, head.base_href)
        if joined.startswith(("http://", "https://")):
            base_url = joined
    language = ""
    if tree.root is not None:
        language = (tree.root.attrs.get("lang") or "").strip()
    out = Extracted(
        title=head.title,
        description=head.description,
        language=language,
        base_url=base_url,
        robots_meta=head.robots,
        metadata=head.metadata,
    )
    out.links = htmllinks.links(tree, base_url, out.link_texts if want.links else None)
    if head.canonical_href:
        canonical = htmllinks.absolute(base_url, head.canonical_href.strip())
        out.canonical = urls.strip_userinfo(canonical) if canonical else ""
    htmlhead.finish_metadata(head, page_url, base_url, out.canonical)
    if want.images:
        out.images = htmllinks.images(tree, base_url)
    if want.selectors:  # before any cleaning changes the tree
        try:
            out.selected = selectors.select(tree, base_url, want.selectors)
        except selectors.SelectionError as exc:
            out.selected_error = (exc.code, exc.reason)
    if want.markdown or want.html:
        if want.include_tags or want.exclude_tags or want.remove_base64_images:
            root, _owner = htmlclean.controlled_root(
                tree,
                only_main_content,
                want.include_tags,
                want.exclude_tags,
                want.remove_base64_images,
            )
        else:
            root = htmlclean.content_root(tree, only_main_content)
        out.cleaned = htmlclean.clean(root, only_main_content) if root is not None else ""
        if want.html:
            out.html = out.cleaned
        if want.markdown and out.cleaned:
            out.markdown = htmlclean.to_markdown(out.cleaned, base_url)
    return out


def extract_compact(html: str, base_url: str, want: Wanted, only_main_content: bool) -> Extracted:
    """``extract`` for a worker process: drops the cleaned HTML unless it was asked for,
    so only what the document needs travels back."""
    out = extract(html, base_url, want=want, only_main_content=only_main_content)
    if not want.html:
        out.cleaned = ""
    return out


def apply(
    doc: jobs_pb2.Document,
    got: Extracted,
    want: Wanted,
    raw_html: str,
    headers: Iterable[tuple[str, str]] = (),
) -> None:
    """Copy an extraction into ``doc``: metadata always (``headers``, the
    ``response_metadata`` of the response, first), formats as ``want`` says."""
    doc.title = got.title
    doc.description = got.description
    doc.language = got.language
    if want.markdown:
        doc.markdown = got.markdown
    if want.html:
        doc.html = got.html
    if want.raw_html:
        doc.raw_html = raw_html
    if want.links:
        doc.links.extend(got.links)
        doc.link_details.extend(
            jobs_pb2.Link(url=url, text=text)
            for url, text in zip(got.links, got.link_texts, strict=True)
        )
    if want.images:
        doc.images.extend(got.images)
    if want.selectors:
        doc.selected = got.selected
        code, message = got.selected_error
        if code:
            doc.format_errors.add(format=jobs_pb2.FORMAT_SELECTORS, code=code, message=message)
    add_metadata(doc.metadata, headers)
    add_metadata(doc.metadata, got.metadata.items())


def fill_document(
    doc: jobs_pb2.Document, html: str, base_url: str, options: jobs_pb2.ScrapeOptions
) -> list[str]:
    """Extract ``html`` into ``doc`` as ``options`` asks (all inline); return the page's links."""
    want = wanted(options)
    got = extract(html, base_url, want=want, only_main_content=options.only_main_content)
    apply(doc, got, want, html)
    return got.links
