"""A parsed page's outgoing links (with their anchor texts) and image URLs.

Owns reading ``<a href>``/``<area href>`` and ``img``/``picture source`` from the one
lexbor tree ``html.extract`` builds, and ``absolute`` (an href resolved against the
page's base URL), which the head's canonical and favicon use too.

Invariants:

- ``links``: every link resolved against the base URL (``<base href>`` applied by the
  caller), http(s) only, fragments and ``user:password@`` dropped (credentials are
  never stored or sent), one per ``urls.normalize`` key, in document order, in the
  form the page wrote (so fetching one costs no redirect). The crawler needs them
  whatever the formats, so they are read before any cleaning: navigation links are
  kept even with ``only_main_content``.
- ``link_texts`` (with ``FORMAT_LINKS``) is parallel to the links: the text of each
  link's first anchor, at most ``MAX_LINK_TEXT`` characters.
- ``images``: ``img`` src and srcset and ``picture source`` srcset, absolute,
  ``urls.normalize``d, once each, in document order; never ``data:``.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

from selectolax.lexbor import LexborHTMLParser, LexborNode

from pagesift.core.jobs import urls

__all__ = ["MAX_LINK_TEXT", "absolute", "images", "links"]

MAX_LINK_TEXT = 500  # characters
_SKIP_PREFIXES = ("#", "javascript:", "mailto:", "tel:", "data:")


def absolute(base_url: str, href: str) -> str:
    """``href`` made absolute, fragment dropped; "" unless http(s)."""
    joined = urljoin(base_url, href).partition("#")[0] if href else ""
    return joined if joined.startswith(("http://", "https://")) else ""


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


def images(tree: LexborHTMLParser, base_url: str) -> list[str]:
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
            resolved = absolute(base_url, ref)
            if not resolved:
                continue
            try:
                key = urls.normalize(resolved)
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


def links(tree: LexborHTMLParser, base_url: str, texts: list[str] | None = None) -> list[str]:
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
            resolved = urljoin(base_url, href)
            if not resolved.startswith(("http://", "https://")):
                continue
        elif href.startswith(("http://", "https://")):
            resolved = href
        elif href[0] == "/" and not href.startswith("//"):
            resolved = origin + href  # path-absolute
        elif href[0] not in "/?" and ":" not in href.partition("/")[0]:
            resolved = base_dir + href  # path-relative (RFC 3986 5.2.3 merge)
        else:
            resolved = urljoin(base_url, href)
            if not resolved.startswith(("http://", "https://")):
                continue
        try:
            key = urls.normalize(resolved)
        except ValueError:
            continue
        if key not in seen:
            seen.add(key)
            link = resolved.partition("#")[0]
            out.append(urls.strip_userinfo(link) if "@" in link else link)  # never kept
            if texts is not None:
                texts.append(_anchor_text(node))
    return out
