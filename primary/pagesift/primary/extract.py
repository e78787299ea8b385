"""HTML -> Document fields: metadata, outgoing links, cleaned HTML and markdown.

Owns the one HTML parse per page. The guarantees:

- The page is parsed exactly once (selectolax ``LexborHTMLParser``); every field is
  read from that one tree, and the work for a format is done only when the format
  is asked for (no formats = markdown only).
- ``links`` is always filled (the crawler needs it whatever the formats): every
  ``<a href>``/``<area href>`` resolved against the page URL and ``<base href>``,
  http(s) only, fragments and userinfo dropped, one per ``urls.normalize`` key, in
  document order.
  Links are read before any cleaning, so navigation links are kept even with
  ``only_main_content``.
- Cleaned HTML drops script/style/noscript/template/iframe/svg (and, with
  ``only_main_content``, nav/header/footer/aside/[role=navigation], keeping the page's
  ``<main>``, else its only ``<article>``, else ``<body>``); markdown is rendered
  from exactly that cleaned HTML, with links made absolute.
- ``canonical`` is the page's first ``<link rel="canonical" href>`` made absolute
  (http(s) only, fragment dropped), and ``robots_meta`` the contents of its
  ``<meta name="robots">`` and ``<meta name="pagesift">`` tags; the engine and the
  job runtime decide what they mean (``fetch``, ``jobs``).

Nothing here does I/O; ``extract`` is safe to run in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import html_to_markdown
from selectolax.lexbor import LexborHTMLParser, LexborNode

from pagesift.shared import urls
from pagesift.v1 import jobs_pb2

__all__ = ["Extracted", "Wanted", "apply", "extract", "fill_document", "to_markdown", "wanted"]

_ALWAYS_DROP = ["script", "style", "noscript", "template", "iframe", "svg"]
_MAIN_DROP = ["nav", "header", "footer", "aside"]
_SKIP_PREFIXES = ("#", "javascript:", "mailto:", "tel:", "data:")


@dataclass(frozen=True, slots=True)
class Wanted:
    """Which document formats to produce."""

    markdown: bool = True
    html: bool = False
    raw_html: bool = False
    links: bool = False


_WANTED_CACHE: dict[tuple[int, ...], Wanted] = {}


def wanted(options: jobs_pb2.ScrapeOptions) -> Wanted:
    """The formats ``options`` asks for (an empty list means markdown only)."""
    key = tuple(options.formats)
    got = _WANTED_CACHE.get(key)
    if got is None:
        fmts = set(key)
        got = Wanted(
            markdown=not fmts or jobs_pb2.FORMAT_MARKDOWN in fmts,
            html=jobs_pb2.FORMAT_HTML in fmts,
            raw_html=jobs_pb2.FORMAT_RAW_HTML in fmts,
            links=jobs_pb2.FORMAT_LINKS in fmts,
        )
        if len(_WANTED_CACHE) < 256:
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


def _head_meta(tree: LexborHTMLParser) -> tuple[str, str, str]:
    """(title, description, base href) from the head; og: values as fallbacks."""
    title = ""
    node = tree.css_first("title")
    if node is not None:
        title = node.text(strip=True)
    description = og_description = og_title = ""
    for meta in tree.css("meta[content]"):
        attrs = meta.attributes
        name = (attrs.get("name") or attrs.get("property") or "").lower()
        if name == "description" and not description:
            description = (attrs.get("content") or "").strip()
        elif name == "og:description" and not og_description:
            og_description = (attrs.get("content") or "").strip()
        elif name == "og:title" and not og_title:
            og_title = (attrs.get("content") or "").strip()
    base = ""
    base_node = tree.css_first("base[href]")
    if base_node is not None:
        base = (base_node.attributes.get("href") or "").strip()
    return title or og_title, description or og_description, base


_ROBOTS_NAMES = frozenset({"robots", "pagesift"})


def _identity(tree: LexborHTMLParser, base_url: str) -> tuple[str, list[str]]:
    """(absolute rel=canonical URL or "", meta robots contents)."""
    canonical = ""
    for node in tree.css("link[rel][href]"):
        rels = (node.attributes.get("rel") or "").lower().split()
        if "canonical" in rels:
            href = (node.attributes.get("href") or "").strip()
            joined = urljoin(base_url, href).partition("#")[0] if href else ""
            if joined.startswith(("http://", "https://")):
                canonical = urls.strip_userinfo(joined)
            break
    robots = [
        (m.attributes.get("content") or "")
        for m in tree.css("meta[name][content]")
        if (m.attributes.get("name") or "").strip().lower() in _ROBOTS_NAMES
    ]
    return canonical, robots


def _links(tree: LexborHTMLParser, base_url: str) -> list[str]:
    """Absolute http(s) links without fragments, one per page key, in document order.

    Links keep the form the page wrote (``/docs/`` stays ``/docs/``), so fetching
    one costs no redirect; callers key them with ``urls.normalize`` (cached). A
    ``user:password@`` in a link is dropped: credentials are never stored or sent.
    """
    parts = urlsplit(base_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    base_dir = origin + (parts.path[: parts.path.rfind("/") + 1] or "/")
    seen_raw: set[str] = set()
    seen: set[str] = set()
    out: list[str] = []
    for node in tree.css("a[href], area[href]"):
        href = node.attrs.get("href")
        if not href or href in seen_raw:
            continue
        seen_raw.add(href)
        href = href.strip()
        if not href or href.startswith(_SKIP_PREFIXES):
            continue
        if "./" in (path := href.partition("?")[0].partition("#")[0]) or path.endswith("."):
            # dot segments (../x, ./y, a/..): the full RFC 3986 resolution removes them
            absolute = urljoin(base_url, href)
            if not absolute.startswith(("http://", "https://")):
                continue
        elif href.startswith(("http://", "https://")):
            absolute = href
        elif href[0] == "/" and not href.startswith("//"):
            absolute = origin + href  # path-absolute
        elif href[0] not in "/?" and ":" not in href.partition("/")[0]:
            absolute = base_dir + href  # path-relative (RFC 3986 5.2.3 merge)
        else:
            absolute = urljoin(base_url, href)
            if not absolute.startswith(("http://", "https://")):
                continue
        try:
            key = urls.normalize(absolute)
        except ValueError:
            continue
        if key not in seen:
            seen.add(key)
            link = absolute.partition("#")[0]
            out.append(urls.strip_userinfo(link) if "@" in link else link)  # never kept
    return out


def _content_root(tree: LexborHTMLParser, only_main: bool) -> LexborNode | None:
    if only_main:
        main = tree.css_first("main")
        if main is not None:
            return main
        articles = tree.css("article")
        if len(articles) == 1:
            return articles[0]
    return tree.body or tree.root


def _clean(root: LexborNode, only_main: bool) -> str:
    root.strip_tags(_ALWAYS_DROP, recursive=True)
    if only_main:
        root.strip_tags(_MAIN_DROP, recursive=True)
        for node in root.css('[role="navigation"]'):
            node.decompose()
    return root.html or ""


# Our cleaning is the only cleaning: html_to_markdown's own preprocessing (which drops
# nav/header/forms even without only_main_content) is off, and so is its front matter.
_NO_PREPROCESSING = html_to_markdown.PreprocessingOptions(enabled=False)


def to_markdown(html: str, base_url: str) -> str:
    """Markdown of an HTML fragment, links resolved against ``base_url``."""
    options = html_to_markdown.ConversionOptions(
        extract_metadata=False, preprocessing=_NO_PREPROCESSING, base_url=base_url
    )
    return html_to_markdown.convert(html, options).content or ""


def extract(
    html: str,
    base_url: str,
    *,
    want: Wanted = Wanted(),  # frozen, shared safely
    only_main_content: bool = False,
) -> Extracted:
    """Parse ``html`` once and produce what ``want`` asks for (links always).

    ``base_url`` is the URL the page was fetched from after redirects; a
    ``<base href>`` in the page overrides it.
    """
    tree = LexborHTMLParser(html)
    title, description, base_href = _head_meta(tree)
    if base_href:
        joined = urljoin(base_url, base_href)
        if joined.startswith(("http://", "https://")):
            base_url = joined
    language = ""
    if tree.root is not None:
        language = (tree.root.attrs.get("lang") or "").strip()
    out = Extracted(
        title=title,
        description=description,
        language=language,
        links=_links(tree, base_url),
        base_url=base_url,
    )
    out.canonical, out.robots_meta = _identity(tree, base_url)
    if want.markdown or want.html:
        root = _content_root(tree, only_main_content)
        out.cleaned = _clean(root, only_main_content) if root is not None else ""
        if want.html:
            out.html = out.cleaned
        if want.markdown and out.cleaned:
            out.markdown = to_markdown(out.cleaned, base_url)
    return out


def extract_compact(html: str, base_url: str, want: Wanted, only_main_content: bool) -> Extracted:
    """``extract`` for a worker process: drops the cleaned HTML unless it was asked for,
    so only what the document needs travels back."""
    out = extract(html, base_url, want=want, only_main_content=only_main_content)
    if not want.html:
        out.cleaned = ""
    return out


def apply(doc: jobs_pb2.Document, got: Extracted, want: Wanted, raw_html: str) -> None:
    """Copy an extraction into ``doc``: metadata always, formats as ``want`` says."""
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


def fill_document(
    doc: jobs_pb2.Document, html: str, base_url: str, options: jobs_pb2.ScrapeOptions
) -> list[str]:
    """Extract ``html`` into ``doc`` as ``options`` asks (all inline); return the page's links."""
    want = wanted(options)
    got = extract(html, base_url, want=want, only_main_content=options.only_main_content)
    apply(doc, got, want, html)
    return got.links
