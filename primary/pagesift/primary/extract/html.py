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
- ``metadata`` (always, one pass over the page's title/base/meta/link tags, shared
  with the fields above): every ``og:*``/``twitter:*`` meta tag (key as written,
  first one wins), ``canonical``, ``keywords``, ``author``, ``published`` and
  ``modified`` (the best-ranked of ``_PUBLISHED``/``_MODIFIED``), ``favicon`` (the
  best ``<link rel=icon>``, absolute, else the origin's ``/favicon.ico``) and
  ``robots``; at most ``MAX_METADATA_KEYS`` keys of at most ``MAX_METADATA_KEY``
  characters, values cut at ``MAX_METADATA_VALUE`` characters (``add_metadata``
  applies the same bounds to the response headers of ``response_metadata``).
- Extraction controls (``Wanted``): ``include_tags`` keeps only the top-most elements
  the selectors match (their subtrees, in document order) as the content,
  ``exclude_tags`` then removes every match, ``remove_base64_images`` every
  ``<img src="data:...">``; all before cleaning and conversion, so they shape
  ``html`` and ``markdown`` only (links, images and metadata read the whole page).
- ``images`` (only with ``FORMAT_IMAGES``): ``img`` src and srcset and ``picture
  source`` srcset, absolute, ``urls.normalize``d, once each, in document order;
  never ``data:``. ``link_texts`` (only with ``FORMAT_LINKS``) is parallel to
  ``links``: the text of the first anchor of each link.

- Bounded parse: before lexbor sees a page, ``check_shape`` (one linear pass over the
  text) refuses it with ``TooLarge`` (the page error ``too_large``, its reason naming
  the cap) when it nests deeper than ``MAX_HTML_DEPTH`` or holds more than
  ``MAX_HTML_ELEMENTS`` elements; lexbor's time grows with tags x depth, so under the
  caps a page costs at most elements x ``MAX_HTML_DEPTH`` steps of it (a few seconds for the
  worst page the caps admit, ``tests.hostile.html.deep_and_wide``). The deadline and
  memory cap of the worker process it runs in bound the rest.

Nothing here does I/O; ``extract`` is safe to run in a worker thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import html_to_markdown
from selectolax.lexbor import LexborHTMLParser, LexborNode

from pagesift.shared.jobs import urls
from pagesift.v1 import jobs_pb2

__all__ = [
    "MAX_HTML_DEPTH",
    "MAX_HTML_ELEMENTS",
    "MAX_METADATA_KEYS",
    "MAX_METADATA_VALUE",
    "Extracted",
    "TooLarge",
    "Wanted",
    "add_metadata",
    "apply",
    "check_shape",
    "extract",
    "fill_document",
    "response_metadata",
    "shape",
    "to_markdown",
    "wanted",
]

_ALWAYS_DROP = ["script", "style", "noscript", "template", "iframe", "svg"]
_MAIN_DROP = ["nav", "header", "footer", "aside"]
_SKIP_PREFIXES = ("#", "javascript:", "mailto:", "tel:", "data:")


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


_WantedKey = tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...], bool]
_WANTED_CACHE: dict[_WantedKey, Wanted] = {}


def wanted(options: jobs_pb2.ScrapeOptions) -> Wanted:
    """What ``options`` asks for (an empty format list means markdown only)."""
    key = (
        tuple(options.formats),
        tuple(options.include_tags),
        tuple(options.exclude_tags),
        options.remove_base64_images,
    )
    got = _WANTED_CACHE.get(key)
    if got is None:
        fmts = set(key[0])
        got = Wanted(
            markdown=not fmts or jobs_pb2.FORMAT_MARKDOWN in fmts,
            html=jobs_pb2.FORMAT_HTML in fmts,
            raw_html=jobs_pb2.FORMAT_RAW_HTML in fmts,
            links=jobs_pb2.FORMAT_LINKS in fmts,
            images=jobs_pb2.FORMAT_IMAGES in fmts,
            include_tags=key[1],
            exclude_tags=key[2],
            remove_base64_images=key[3],
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
    metadata: dict[str, str] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)
    link_texts: list[str] = field(default_factory=list)  # parallel to links (FORMAT_LINKS)


MAX_METADATA_KEYS = 100
MAX_METADATA_VALUE = 1024  # characters
MAX_METADATA_KEY = 128  # characters; a longer key is dropped
MAX_LINK_TEXT = 500  # characters

# Meta names (lowercase) of a page's publication and modification time, best first.
_PUBLISHED = {
    name: rank
    for rank, name in enumerate((
        "article:published_time", "datepublished", "og:published_time", "published_time",
        "pubdate", "publishdate", "publish-date", "publish_date", "date", "dc.date.issued",
        "dcterms.issued", "dc.date", "dcterms.created", "dcterms.date", "citation_publication_date",
        "citation_date", "sailthru.date", "parsely-pub-date",
    ))
}  # fmt: skip
_MODIFIED = {
    name: rank
    for rank, name in enumerate((
        "article:modified_time", "datemodified", "og:updated_time", "modified_time",
        "last-modified", "dcterms.modified", "dc.date.modified", "revised",
    ))
}  # fmt: skip
_ROBOTS_NAMES = frozenset({"robots", "pagesift"})
_HEAD_SELECTOR = "title, base[href], meta[content], link[rel][href]"
_ICON_RELS = frozenset({"icon", "apple-touch-icon", "apple-touch-icon-precomposed"})


@dataclass(slots=True)
class _Head:
    title: str = ""
    description: str = ""
    base_href: str = ""
    canonical_href: str = ""
    robots: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    icon_href: str = ""


def _bounded(value: str) -> str:
    return value if len(value) <= MAX_METADATA_VALUE else value[:MAX_METADATA_VALUE]


def _icon_rank(rels: list[str], sizes: str) -> tuple[int, int]:
    """(rel=icon over apple-touch-icon, largest declared size; "any" is the largest)."""
    best = 0
    for size in sizes.lower().split():
        if size == "any":
            return ("icon" in rels, 1 << 30)
        w, _, h = size.partition("x")
        if w.isdigit() and h.isdigit():
            best = max(best, int(w) * int(h))
    return ("icon" in rels, best)


def _head(tree: LexborHTMLParser) -> _Head:
    """Title, description, base href, rel=canonical, meta robots and the metadata
    keys, in ONE pass over the page's title/base/meta/link tags; og: values are the
    fallback title and description."""
    out = _Head()
    meta = out.metadata
    title_seen = False
    description = og_description = og_title = ""
    published = modified = ""
    published_rank = modified_rank = len(_PUBLISHED)
    robots: list[str] = []
    icon_rank: tuple[int, int] = (-1, -1)
    for node in tree.css(_HEAD_SELECTOR):
        tag = node.tag
        if tag == "meta":
            attrs = node.attributes
            written = attrs.get("name") or attrs.get("property") or attrs.get("itemprop") or ""
            written = written.strip()
            name = written.lower()
            if not name:
                continue
            content = (attrs.get("content") or "").strip()
            if name.startswith(("og:", "twitter:")):
                if (
                    content
                    and written not in meta
                    and len(meta) < MAX_METADATA_KEYS
                    and len(written) <= MAX_METADATA_KEY
                ):
                    meta[written] = _bounded(content)
                if name == "og:description" and not og_description:
                    og_description = content
                elif name == "og:title" and not og_title:
                    og_title = content
            elif name == "description":
                if not description:
                    description = content
            elif name in _ROBOTS_NAMES:
                if "name" in attrs:
                    out.robots.append(attrs.get("content") or "")
                    if name == "robots" and content:
                        robots.append(content)
                continue
            elif name in ("keywords", "author"):
                if content and name not in meta and len(meta) < MAX_METADATA_KEYS:
                    meta[name] = _bounded(content)
                continue
            rank = _PUBLISHED.get(name)
            if rank is not None and rank < published_rank and content:
                published, published_rank = content, rank
            rank = _MODIFIED.get(name)
            if rank is not None and rank < modified_rank and content:
                modified, modified_rank = content, rank
        elif tag == "link":
            attrs = node.attributes
            rels = (attrs.get("rel") or "").lower().split()
            if "canonical" in rels and not out.canonical_href:
                out.canonical_href = (attrs.get("href") or "").strip() or " "
            elif not _ICON_RELS.isdisjoint(rels):
                href = (attrs.get("href") or "").strip()
                if href and not href.lower().startswith("data:"):
                    rank2 = _icon_rank(rels, attrs.get("sizes") or "")
                    if rank2 > icon_rank:
                        out.icon_href, icon_rank = href, rank2
        elif tag == "title":
            if not title_seen:
                title_seen = True
                out.title = node.text(strip=True)
        elif tag == "base" and not out.base_href:
            out.base_href = (node.attributes.get("href") or "").strip()
    out.title = out.title or og_title
    out.description = description or og_description
    for key, value in (
        ("published", published),
        ("modified", modified),
        ("robots", ", ".join(robots)),
    ):
        if value and len(meta) < MAX_METADATA_KEYS:
            meta[key] = _bounded(value)
    return out


def _absolute(base_url: str, href: str) -> str:
    """``href`` made absolute, fragment dropped; "" unless http(s)."""
    joined = urljoin(base_url, href).partition("#")[0] if href else ""
    return joined if joined.startswith(("http://", "https://")) else ""


def _finish_metadata(head: _Head, page_url: str, base_url: str, canonical: str) -> None:
    meta = head.metadata
    if canonical and len(meta) < MAX_METADATA_KEYS:
        meta["canonical"] = _bounded(canonical)
    icon = _absolute(base_url, head.icon_href) if head.icon_href else ""
    if not icon and page_url.startswith(("http://", "https://")):
        parts = urlsplit(page_url)
        icon = f"{parts.scheme}://{parts.netloc}/favicon.ico"
    if icon and len(meta) < MAX_METADATA_KEYS:
        meta["favicon"] = _bounded(urls.strip_userinfo(icon) if "@" in icon else icon)


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
            out.append((key, _bounded(value.strip())))
    return tuple(out)


def add_metadata(target: MutableMapping[str, str], items: Iterable[tuple[str, str]]) -> None:
    """Add ``items`` to ``target`` (a ``Document.metadata``) within the bounds: keys
    already there are kept, no more than ``MAX_METADATA_KEYS`` in all, values cut."""
    for key, value in items:
        if key in target or len(key) > MAX_METADATA_KEY:
            continue
        if len(target) >= MAX_METADATA_KEYS:
            return
        target[key] = _bounded(value)


def _srcset_urls(value: str) -> list[str]:
    """The URLs of a ``srcset`` (HTML's candidate parsing: a URL is a run of
    non-space characters, trailing commas are separators; descriptors skipped)."""
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and (value[i].isspace() or value[i] == ","):
            i += 1
        if i >= n:
            break
        j = i
        while j < n and not value[j].isspace():
            j += 1
        url = value[i:j]
        if url.endswith(","):
            url = url.rstrip(",")
            i = j
        else:
            k = value.find(",", j)
            i = n if k < 0 else k + 1
        if url:
            out.append(url)
    return out


def _images(tree: LexborHTMLParser, base_url: str) -> list[str]:
    """Absolute, normalized image URLs (img src/srcset, picture source srcset), once
    each, in document order; data: URIs and non-http(s) URLs skipped."""
    seen: set[str] = set()
    out: list[str] = []
    for node in tree.css("img, picture source"):
        attrs = node.attrs
        found = []
        if node.tag == "img":
            src = attrs.get("src")
            if src:
                found.append(src.strip())
        srcset = attrs.get("srcset")
        if srcset:
            found.extend(_srcset_urls(srcset))
        for ref in found:
            if not ref or ref[:5].lower() == "data:":
                continue
            absolute = _absolute(base_url, ref)
            if not absolute:
                continue
            try:
                key = urls.normalize(absolute)
            except ValueError:
                continue
            if key not in seen:
                seen.add(key)
                out.append(key)
    return out


def _anchor_text(node: LexborNode) -> str:
    """An anchor's text, whitespace collapsed; else its title, aria-label or image alt."""
    text = " ".join((node.text(deep=True, separator=" ") or "").split())
    if not text:
        attrs = node.attrs
        text = (attrs.get("title") or attrs.get("aria-label") or "").strip()
        if not text:
            img = node.css_first("img[alt]")
            if img is not None:
                text = (img.attrs.get("alt") or "").strip()
        text = " ".join(text.split())
    return text[:MAX_LINK_TEXT]


def _links(tree: LexborHTMLParser, base_url: str, texts: list[str] | None = None) -> list[str]:
    """Absolute http(s) links without fragments, one per page key, in document order.

    Links keep the form the page wrote (``/docs/`` stays ``/docs/``), so fetching
    one costs no redirect; callers key them with ``urls.normalize`` (cached). A
    ``user:password@`` in a link is dropped: credentials are never stored or sent.
    With ``texts``, the text of each link's first anchor is appended to it.
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
            if texts is not None:
                texts.append(_anchor_text(node))
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


def _topmost(nodes: list[LexborNode]) -> list[LexborNode]:
    """``nodes`` (document order) without those inside another of them."""
    if len(nodes) < 2:
        return nodes
    ids = {n.mem_id for n in nodes}
    out = []
    for node in nodes:
        parent = node.parent
        while parent is not None and parent.mem_id not in ids:
            parent = parent.parent
        if parent is None:
            out.append(node)
    return out


def _controlled_root(
    tree: LexborHTMLParser, want: Wanted, only_main: bool
) -> tuple[LexborNode | None, LexborHTMLParser | None]:
    """The content root once ``want``'s extraction controls are applied, and the
    parser that owns it when it is not ``tree`` (the include_tags fragment)."""
    owner: LexborHTMLParser | None = None
    if want.include_tags:
        whole = tree.body or tree.root
        matched = [] if whole is None else _topmost(whole.css(", ".join(want.include_tags)))
        owner = LexborHTMLParser(
            "<html><body>" + "".join(n.html or "" for n in matched) + "</body></html>"
        )
        root = owner.body
    else:
        root = _content_root(tree, only_main)
    if root is None:
        return None, owner
    if want.exclude_tags:
        for node in _topmost(root.css(", ".join(want.exclude_tags))):
            node.decompose()
    if want.remove_base64_images:
        for img in root.css("img[src]"):
            if (img.attrs.get("src") or "").lstrip()[:5].lower() == "data:":
                img.decompose()
    return root, owner


def _clean(root: LexborNode, only_main: bool) -> str:
    root.strip_tags(_ALWAYS_DROP, recursive=True)
    if only_main:
        root.strip_tags(_MAIN_DROP, recursive=True)
        for node in root.css('[role="navigation"]'):
            node.decompose()
    return root.html or ""


# -- the shape check: linear, before lexbor sees the page -------------------------------

# Elements open at once: html_to_markdown drops whatever lies deeper than ~1,020 levels,
# and Blink's parser flattens past 512, so no page that renders needs more.
MAX_HTML_DEPTH = 1_000
MAX_HTML_ELEMENTS = 1_000_000  # elements in one page (a 10 MiB body of real HTML: ~200 K)


class TooLarge(Exception):
    """A page whose shape is past a cap (``reason`` names it): the page error
    ``too_large``. Plain (one string argument), so it crosses a process boundary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# What may follow "<": a start or end tag's name, or markup that is no tag.
_TAG = re.compile(r"<(?:(/?)([A-Za-z][^\t\n\f\r />]*)|(!--)|(!\[CDATA\[)|[!?]|/)")
_WS = "\t\n\f\r "
# The rest of a tag as HTML's tokenizer reads it: attributes (a value is quoted only when
# the quote follows its "="; quoted values may hold ">" and "<"), then "/>" or ">".
# Possessive throughout: one pass, no backtracking.
_TAG_REST = re.compile(
    rf"(?:[{_WS}]++|/(?!>)|[^{_WS}/>][^{_WS}/>=]*+"
    rf"""(?:[{_WS}]*+=[{_WS}]*+(?:"[^"]*+"|'[^']*+'|[^{_WS}>]*+))?+)*+(/?)>"""
)
_COMMENT_END = re.compile(r"--!?>")
_VOID = frozenset((
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "image", "img",
    "input", "keygen", "link", "meta", "param", "source", "track", "wbr",
))  # fmt: skip
# Elements whose content is text up to their end tag, in HTML content.
_RAW_END = {
    name: re.compile(f"</{name}(?=[{_WS}/>])", re.IGNORECASE)
    for name in (
        "script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "plaintext",
    )
}  # fmt: skip
_BLOCKS = (
    "address", "article", "aside", "blockquote", "center", "details", "dialog", "dir", "div", "dl",
    "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
    "header", "hgroup", "main", "menu", "nav", "ol", "p", "pre", "section", "summary", "table",
    "ul",
)  # fmt: skip
# Start tags that close an open p (in button scope), and the open elements a start tag
# closes when they are the current node (HTML's implied end tags).
_CLOSES_P = frozenset((
    *_BLOCKS, "li", "dd", "dt", "hr", "listing", "plaintext", "search", "xmp", "form",
))  # fmt: skip
_IMPLIED: dict[str, frozenset[str]] = {
    "li": frozenset({"li", "p"}),
    "dt": frozenset({"dt", "dd", "p"}),
    "dd": frozenset({"dt", "dd", "p"}),
    "td": frozenset({"td", "th"}),
    "th": frozenset({"td", "th"}),
    "tr": frozenset({"tr", "td", "th"}),
    "thead": frozenset({"thead", "tbody", "tfoot", "tr", "td", "th"}),
    "tbody": frozenset({"thead", "tbody", "tfoot", "tr", "td", "th"}),
    "tfoot": frozenset({"thead", "tbody", "tfoot", "tr", "td", "th"}),
    "option": frozenset({"option"}),
    "optgroup": frozenset({"option", "optgroup"}),
    "rt": frozenset({"rt", "rp"}),
    "rp": frozenset({"rt", "rp"}),
}
# HTML's "special" elements: an end tag of any other element is ignored when one of them
# is open above its match.
_SPECIAL = frozenset((
    "address", "applet", "area", "article", "aside", "base", "basefont", "bgsound",
    "blockquote", "body", "br", "button", "caption", "center", "col", "colgroup", "dd",
    "details", "dir", "div", "dl", "dt", "embed", "fieldset", "figcaption", "figure", "footer",
    "form", "frame", "frameset", "h1", "h2", "h3", "h4", "h5", "h6", "head", "header", "hgroup",
    "hr", "html", "iframe", "img", "input", "keygen", "li", "link", "listing", "main",
    "marquee", "menu", "meta", "nav", "noembed", "noframes", "noscript", "object", "ol", "p",
    "param", "plaintext", "pre", "script", "search", "section", "select", "source", "style",
    "summary", "table", "tbody", "td", "template", "textarea", "tfoot", "th", "thead", "title",
    "tr", "track", "ul", "wbr", "xmp",
))  # fmt: skip
# Scope boundaries: an end tag of a special element closes nothing past one of these.
_SCOPE = frozenset((
    "applet", "caption", "html", "table", "td", "th", "marquee", "object", "template", "mi",
    "mo", "mn", "ms", "mtext", "annotation-xml", "foreignobject", "desc", "title",
))  # fmt: skip
_SCOPE_EXTRA = {"li": frozenset({"ol", "ul"}), "p": frozenset({"button"})}
# HTML elements that end SVG/MathML content, and the foreign elements whose children
# are HTML again (integration points).
_BREAKOUT = frozenset((
    "b", "big", "blockquote", "body", "br", "center", "code", "dd", "div", "dl", "dt", "em",
    "embed", "h1", "h2", "h3", "h4", "h5", "h6", "head", "hr", "i", "img", "li",
    "listing", "menu", "meta", "nobr", "ol", "p", "pre", "ruby", "s", "small", "span", "strong",
    "strike", "sub", "sup", "table", "tt", "u", "ul", "var",
))  # fmt: skip
_FONT_BREAKOUT = re.compile(r"[\t\n\f\r /](?:color|face|size)[\t\n\f\r /=>]", re.I)
_INTEGRATION = frozenset(("foreignobject", "desc", "title", "mi", "mo", "mn", "ms", "mtext"))
_FOREIGN_ROOTS = frozenset({"svg", "math"})
_FORMATTING = frozenset((
    "a", "b", "big", "code", "em", "font", "i", "nobr", "s", "small", "strike", "strong", "tt",
    "u",
))  # fmt: skip
_MARKERS = frozenset({"applet", "object", "marquee", "template", "td", "th", "caption"})
# Table parts: ignored in body, outside a table.
_IGNORED_IN_BODY = frozenset((
    "caption", "col", "colgroup", "frame", "head", "tbody", "td", "tfoot", "th", "thead", "tr",
))  # fmt: skip
_TABLE_PARTS = frozenset({"table", "tbody", "thead", "tfoot", "tr", "td", "th", "caption"})
# what a stack entry is: an HTML element, an SVG/MathML one, a formatting element in
# the parser's list of elements to reopen, or one its Noah's Ark dropped from the list
_HTML, _FOREIGN_EL, _FORMAT, _UNLISTED = 0, 1, 2, 3
# Start tags before which the parser does not reopen formatting elements.
_NO_REOPEN = frozenset((
    *_BLOCKS, "search", "listing", "form", "li", "dd", "dt", "plaintext", "table", "hr",
    "iframe", "noembed", "noscript", "rb", "rp", "rt", "rtc", "textarea", "param", "source",
    "track", "script", "style", "template", "title", "base", "basefont", "bgsound", "link",
    "meta", "caption", "col", "colgroup", "frame", "head", "tbody", "td", "tfoot", "th",
    "thead", "tr", "html", "body", "frameset",
))  # fmt: skip
_KEPT_OPEN = frozenset({"body", "html", "head"})  # their end tags close nothing
_CLOSE_SLOW = _KEPT_OPEN | {"form", "select"}
_TABLE_SECTIONS = frozenset({"table", "tbody", "thead", "tfoot"})
_END_SEARCH = 64  # an end tag closes a match this near the current node, else is ignored
_SHAPE_MIN_TAGS = 20_000  # pages with fewer "<" are not scanned (see check_shape)


def check_shape(html: str) -> None:
    """Raise ``TooLarge`` when ``html`` nests elements deeper than ``MAX_HTML_DEPTH`` or
    holds more than ``MAX_HTML_ELEMENTS``.

    lexbor's tree builder searches its stack of open elements for every tag (HTML's
    scope checks), so its time grows with tags x depth: 40,000 nested ``<div>`` take
    1.4 s, 200,000 take minutes. ``shape`` reads the text once, a few regex steps a
    tag, and under the caps lexbor's work is at most elements x ``MAX_HTML_DEPTH``.
    A page of at most ``_SHAPE_MIN_TAGS`` tags is not scanned: nested all the way down
    it costs lexbor ~0.3 s, and ordinary pages, nearly all that small, skip the scan's
    cost (it reads ~20 MB/s where lexbor parses ~100 MB/s)."""
    if html.count("<") <= max(MAX_HTML_DEPTH, _SHAPE_MIN_TAGS):
        return  # too few tags to cost lexbor much, or to pass the element cap
    depth, elements = shape(html, MAX_HTML_DEPTH, MAX_HTML_ELEMENTS)
    if elements > MAX_HTML_ELEMENTS:
        raise TooLarge(f"the page has more than {MAX_HTML_ELEMENTS} elements (MAX_HTML_ELEMENTS)")
    if depth > MAX_HTML_DEPTH:
        raise TooLarge(f"the page nests elements deeper than {MAX_HTML_DEPTH} (MAX_HTML_DEPTH)")


def shape(html: str, max_depth: int, max_elements: int) -> tuple[int, int]:
    """(the deepest nesting, the number of elements) of ``html`` as HTML's tree builder
    would make them, read in one pass that stops once either passes its cap.

    It keeps a stack of open elements the way the tree builder does for the markup that
    decides depth. Tokenizing follows the HTML tokenizer: attribute values quoted only
    after "=", comments ending at ``-->``/``--!>``/``<!-->``, bogus comments, CDATA in
    SVG/MathML, raw text of ``script``/``style``/... in HTML content; anything
    unterminated is read on as markup (the parser would take the rest as text). Tree
    building: void elements; implied end tags (``p``, ``li``, ``td``, ...) and the
    ``tbody``/``tr`` a row or cell implies; table parts outside a table, a select in a
    select and a form in a form ignored; ``</body>``/``</html>`` closing nothing and
    ``</form>`` only the form; ``<x/>`` closing itself only in SVG/MathML, which an
    HTML breakout tag ends and integration points leave; an end tag closing its match
    only if it is among the last ``_END_SEARCH`` open elements with no scope boundary
    (for a non-special element, no special element) above it; formatting elements
    (``b``, ``font``, ...) an end tag closes counted again, as the parser reopens them,
    three alike at most (its "Noah's Ark").

    On real pages this is the parser's depth (a 2,000-page sample of the Rust
    documentation: within one level). It is an estimate, not the parser: fuzzed
    against lexbor (15,000 random snippets of tag soup, each repeated 60 times), it
    is deeper on most, but lexbor's repairs (reopened formatting elements, foreign
    content, forms, selects, ...) still nest some up to ~3 times deeper than it says. So
    the cap bounds lexbor's work within such a factor for those, and the worker's
    deadline bounds whatever gets further; ``tests/test_hostile_html.py`` holds the
    cases it must agree with lexbor on."""
    stack: list[str] = []
    kinds: list[int] = []  # parallel to stack: _HTML, _FOREIGN_EL, _FORMAT, _UNLISTED
    idents: list[str] = []  # parallel to stack: a formatting element's attributes
    selects: list[int] = []  # stack positions of the open select elements
    form_open = False  # the parser's form element pointer is set
    pending: list[tuple[str, str]] = []  # formatting elements closed, to be reopened
    elements = deepest = 0
    pos = 0
    n = len(html)
    while pos < n:
        m = _TAG.search(html, pos)
        if m is None:
            break
        in_foreign = bool(kinds) and kinds[-1] == _FOREIGN_EL and stack[-1] not in _INTEGRATION
        if pending and not in_foreign and m.start() > pos:
            _reopen(stack, kinds, idents, pending)  # text (even white space) reopens them
        pos = m.end()
        slash, name, comment, cdata = m.group(1, 2, 3, 4)
        if name is None:
            if comment:  # "<!--": to "-->" or "--!>", or closed at once by "<!-->"
                if html.startswith(">", pos) or html.startswith("->", pos):
                    continue
                end = _COMMENT_END.search(html, pos)
                if end is not None:
                    pos = end.end()
            elif cdata and in_foreign:
                close = html.find("]]>", pos)
                if close >= 0:
                    pos = close + 3
            else:  # "<!x", "<?x", "</x": a bogus comment, to ">"
                if m.group(0) == "</" and html.startswith(">", pos):
                    pos += 1
                    continue
                close = html.find(">", pos)
                if close >= 0:
                    pos = close + 1
            continue
        if html.startswith(">", pos):  # most tags: no attributes
            tag_end = pos + 1
            self_closing = False
        else:
            rest = _TAG_REST.match(html, pos)
            if rest is None:
                continue  # a tag cut by the end of the page: read on (deep side)
            tag_end = rest.end()
            self_closing = bool(rest.group(1))
        name = name.lower()
        if slash:
            if in_foreign and name in ("br", "p"):  # they end SVG/MathML content
                while kinds and kinds[-1] == _FOREIGN_EL and stack[-1] not in _INTEGRATION:
                    stack.pop()
                    kinds.pop()
                    idents.pop()
            if name == "br":  # </br> is read as <br>, which reopens formatting elements
                if pending and not (kinds and kinds[-1] == _FOREIGN_EL):
                    _reopen(stack, kinds, idents, pending)
                pos = tag_end
                continue
            if stack and stack[-1] == name and name not in _CLOSE_SLOW:
                stack.pop()  # the common case: it closes the current node
                kinds.pop()
                idents.pop()
                pos = tag_end
                continue
            if name == "form":
                form_open = False
            _close(stack, kinds, idents, name, pending)
            while selects and selects[-1] >= len(stack):
                selects.pop()
            pos = tag_end
            continue
        elements += 1
        if elements > max_elements:
            break
        pos = tag_end
        if in_foreign and (
            name in _BREAKOUT
            or (name == "font" and _FONT_BREAKOUT.search(html, m.end(), tag_end) is not None)
        ):
            while kinds and kinds[-1] == _FOREIGN_EL and stack[-1] not in _INTEGRATION:
                stack.pop()
                kinds.pop()
                idents.pop()
            in_foreign = False
        if pending and not in_foreign and name not in _NO_REOPEN:
            _reopen(stack, kinds, idents, pending)
        if in_foreign:
            if not self_closing:  # <x/> closes itself in SVG/MathML
                stack.append(name)
                kinds.append(_FOREIGN_EL)
                idents.append("")
        elif name == "select" and selects:  # a select in a select ends the first
            _close(stack, kinds, idents, "select", pending)
            while selects and selects[-1] >= len(stack):
                selects.pop()
        elif (
            name in _VOID
            or (name == "form" and form_open)  # a form in a form is ignored
            or (name in _IGNORED_IN_BODY and not _in_table(stack))
        ):
            pass
        elif name in _FOREIGN_ROOTS:
            if not self_closing:
                stack.append(name)
                kinds.append(_FOREIGN_EL)
                idents.append("")
        else:
            if name in _CLOSES_P and "p" in stack[-_END_SEARCH:]:
                _close(stack, kinds, idents, "p", pending)  # p in button scope: closed
            raw = _RAW_END.get(name)
            if raw is not None:
                end = raw.search(html, pos)
                if end is not None:
                    pos = end.start()
                    continue
            implied = _IMPLIED.get(name)
            if implied is not None:
                while stack and stack[-1] in implied:
                    stack.pop()
                    kinds.pop()
                    idents.pop()
            if stack and stack[-1] in _TABLE_SECTIONS:  # the rows and sections implied
                if name in ("tr", "td", "th") and stack[-1] == "table":
                    stack.append("tbody")
                    kinds.append(_HTML)
                    idents.append("")
                if name in ("td", "th"):
                    stack.append("tr")
                    kinds.append(_HTML)
                    idents.append("")
            if name == "select":
                selects.append(len(stack))
            elif name == "form":
                form_open = True
            if name in _FORMATTING:
                ident = name + html[m.end() : tag_end]
                _noahs_ark(stack, kinds, idents, ident, pending)
                stack.append(name)
                kinds.append(_FORMAT)
                idents.append(ident)
            else:
                stack.append(name)
                kinds.append(_HTML)
                idents.append("")
        if len(stack) > deepest:
            deepest = len(stack)
            if deepest > max_depth:
                break
    return deepest, elements


def _in_table(stack: list[str]) -> bool:
    """Whether a table is open near the current node (table parts count there)."""
    return any(name in _TABLE_PARTS for name in stack[-_END_SEARCH:])


def _reopen(
    stack: list[str], kinds: list[int], idents: list[str], pending: list[tuple[str, str]]
) -> None:
    """The parser reopens the formatting elements an end tag closed (its "reconstruct
    the active formatting elements"), before text or an inline start tag."""
    for name, ident in pending:
        stack.append(name)
        kinds.append(_FORMAT)
        idents.append(ident)
    pending.clear()


def _noahs_ark(
    stack: list[str],
    kinds: list[int],
    idents: list[str],
    ident: str,
    pending: list[tuple[str, str]],
) -> None:
    """Before a formatting element ``ident`` opens: with three alike already in the
    parser's list (open near the current node since the last marker, or pending), the
    earliest leaves the list: it will not be reopened (an open one stays open)."""
    in_pending = [i for i, (_, pending_ident) in enumerate(pending) if pending_ident == ident]
    if len(in_pending) + idents[-_END_SEARCH:].count(ident) < 3:
        return
    alike: list[int] = []
    for i in range(len(stack) - 1, max(len(stack) - _END_SEARCH, 0) - 1, -1):
        if stack[i] in _MARKERS and kinds[i] == _HTML:
            break
        if idents[i] == ident and kinds[i] == _FORMAT:
            alike.append(i)
    if len(alike) + len(in_pending) < 3:
        return
    if alike:
        kinds[alike[-1]] = _UNLISTED
    else:
        del pending[in_pending[0]]


def _close(
    stack: list[str],
    kinds: list[int],
    idents: list[str],
    name: str,
    pending: list[tuple[str, str]],
) -> None:
    """Apply the end tag ``name`` to the open elements (see ``shape``); the formatting
    elements it closes above its match join ``pending`` (the parser reopens them)."""
    if name in _KEPT_OPEN:
        return
    special = name in _SPECIAL
    bounds = _SCOPE | _SCOPE_EXTRA.get(name, frozenset()) if special else _SPECIAL
    # from an SVG/MathML current node, the walk matches foreign elements until it meets
    # an HTML one; from there HTML's rules hold, which stop at integration points (also
    # those the foreign walk passed: HTML's scope checks start from the current node)
    foreign_walk = bool(kinds) and kinds[-1] == _FOREIGN_EL
    passed_boundary = False
    for i in range(len(stack) - 1, max(len(stack) - _END_SEARCH, 0) - 1, -1):
        open_name = stack[i]
        kind = kinds[i]
        boundary = kind == _FOREIGN_EL and (
            open_name in _INTEGRATION or open_name == "annotation-xml"
        )
        if kind == _FOREIGN_EL and not foreign_walk:
            if boundary:
                return
            continue
        if kind == _FOREIGN_EL:
            passed_boundary = passed_boundary or boundary
        else:
            if foreign_walk and passed_boundary:
                return
            foreign_walk = False
        if open_name == name:
            if name == "form":  # the form element alone leaves the stack
                del stack[i]
                del kinds[i]
                del idents[i]
                return
            if name in _MARKERS:  # a cell (or other marker) clears what it opened
                pending.clear()
            else:
                for j in range(i + 1, len(stack)):
                    if stack[j] in _MARKERS and kinds[j] == _HTML:
                        break
                    if kinds[j] == _FORMAT:
                        pending.append((stack[j], idents[j]))
            del stack[i:]
            del kinds[i:]
            del idents[i:]
            return
        if kind != _FOREIGN_EL and open_name in bounds:
            return


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
    ``<base href>`` in the page overrides it. Raises ``TooLarge`` for a page past
    ``MAX_HTML_DEPTH`` or ``MAX_HTML_ELEMENTS`` (``check_shape``), before parsing it.
    """
    check_shape(html)
    tree = LexborHTMLParser(html)
    head = _head(tree)
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
    out.links = _links(tree, base_url, out.link_texts if want.links else None)
    if head.canonical_href:
        canonical = _absolute(base_url, head.canonical_href.strip())
        out.canonical = urls.strip_userinfo(canonical) if canonical else ""
    _finish_metadata(head, page_url, base_url, out.canonical)
    if want.images:
        out.images = _images(tree, base_url)
    if want.markdown or want.html:
        if want.include_tags or want.exclude_tags or want.remove_base64_images:
            root, _owner = _controlled_root(tree, want, only_main_content)
        else:
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
