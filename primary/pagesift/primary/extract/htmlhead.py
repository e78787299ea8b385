"""A parsed page's head: title, description, base href, canonical, meta robots, metadata.

Owns the one pass over the page's ``title``/``base``/``meta``/``link`` tags that every
head field is read from (``read_head``), and the metadata keys resolved once the base
URL is known (``finish_metadata``: canonical, favicon).

Invariants:

- ``metadata`` holds every ``og:*``/``twitter:*`` meta tag (key as written, first one
  wins), ``keywords``, ``author``, ``published`` and ``modified`` (the best-ranked of
  ``_PUBLISHED``/``_MODIFIED``), ``robots``, ``canonical`` and ``favicon`` (the best
  ``<link rel=icon>``, absolute, else the origin's ``/favicon.ico``), within the
  bounds of ``metadata`` (keys, key length, value length).
- ``canonical_href`` is the first ``<link rel="canonical">``'s href as written (the
  caller makes it absolute), ``robots`` the contents of the ``<meta name="robots">``
  and ``<meta name="pagesift">`` tags; the engine and the job runtime decide what they
  mean. og:title and og:description are the fallback title and description.
- A favicon never keeps a ``user:password@``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from selectolax.lexbor import LexborHTMLParser

from pagesift.core.jobs import urls
from pagesift.primary.extract.htmllinks import absolute
from pagesift.primary.extract.metadata import MAX_METADATA_KEY, MAX_METADATA_KEYS, bounded

__all__ = ["Head", "finish_metadata", "read_head"]

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
class Head:
    """What the head pass read: the fields ``html.extract`` copies, hrefs as written."""

    title: str = ""
    description: str = ""
    base_href: str = ""
    canonical_href: str = ""
    robots: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    icon_href: str = ""


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


def read_head(tree: LexborHTMLParser) -> Head:
    """Title, description, base href, rel=canonical, meta robots and the metadata
    keys, in ONE pass over the page's title/base/meta/link tags; og: values are the
    fallback title and description."""
    out = Head()
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
                    meta[written] = bounded(content)
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
                    meta[name] = bounded(content)
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
            meta[key] = bounded(value)
    return out


def finish_metadata(head: Head, page_url: str, base_url: str, canonical: str) -> None:
    """Add ``canonical`` (already absolute) and the favicon, resolved against
    ``base_url`` (else ``page_url``'s origin), to ``head.metadata``."""
    meta = head.metadata
    if canonical and len(meta) < MAX_METADATA_KEYS:
        meta["canonical"] = bounded(canonical)
    icon = absolute(base_url, head.icon_href) if head.icon_href else ""
    if not icon and page_url.startswith(("http://", "https://")):
        parts = urlsplit(page_url)
        icon = f"{parts.scheme}://{parts.netloc}/favicon.ico"
    if icon and len(meta) < MAX_METADATA_KEYS:
        meta["favicon"] = bounded(urls.strip_userinfo(icon) if "@" in icon else icon)
