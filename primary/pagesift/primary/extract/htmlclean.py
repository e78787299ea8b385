"""A parsed page's content: the root the controls choose, cleaned, and its markdown.

Owns what ``html`` and ``markdown`` are made from. The order is fixed: the content
root (``<main>``, else the only ``<article>``, else ``<body>`` with
``only_main_content``; ``<body>`` without), then the extraction controls, then the
cleaning, then the conversion; so the controls shape ``html`` and ``markdown`` only
(links, images and metadata read the whole page, before any of this).

Invariants:

- ``include_tags`` keeps only the top-most elements the selectors match (their
  subtrees, in document order) as the content, ``exclude_tags`` then removes every
  top-most match, ``remove_base64_images`` every ``<img src="data:...">``.
- ``clean`` drops script/style/noscript/template/iframe/svg, and with
  ``only_main_content`` nav/header/footer/aside/[role=navigation] too; it changes the
  tree it is given (the caller's one parse).
- ``to_markdown`` renders exactly the cleaned HTML, links made absolute against the
  base URL: html_to_markdown's own preprocessing (which drops nav/header/forms even
  without ``only_main_content``) and its front matter are off, so this module's
  cleaning is the only cleaning. ``epub`` renders its chapters with it too.
"""

from __future__ import annotations

from typing import Any

from html_to_markdown import _html_to_markdown as _native  # the binding convert calls
from selectolax.lexbor import LexborHTMLParser, LexborNode

__all__ = ["clean", "content_root", "controlled_root", "native_options", "to_markdown"]

_ALWAYS_DROP = ["script", "style", "noscript", "template", "iframe", "svg"]
_MAIN_DROP = ["nav", "header", "footer", "aside"]


def content_root(tree: LexborHTMLParser, only_main: bool) -> LexborNode | None:
    """``<main>``, else the only ``<article>`` (with ``only_main``), else the body."""
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


def controlled_root(
    tree: LexborHTMLParser,
    only_main: bool,
    include_tags: tuple[str, ...],
    exclude_tags: tuple[str, ...],
    remove_base64_images: bool,
) -> tuple[LexborNode | None, LexborHTMLParser | None]:
    """The content root once the extraction controls are applied, and the parser that
    owns it when it is not ``tree`` (the include_tags fragment: the caller keeps it
    alive while it reads the root)."""
    owner: LexborHTMLParser | None = None
    if include_tags:
        whole = tree.body or tree.root
        matched = [] if whole is None else _topmost(whole.css(", ".join(include_tags)))
        owner = LexborHTMLParser(
            "<html><body>" + "".join(n.html or "" for n in matched) + "</body></html>"
        )
        root = owner.body
    else:
        root = content_root(tree, only_main)
    if root is None:
        return None, owner
    if exclude_tags:
        for node in _topmost(root.css(", ".join(exclude_tags))):
            node.decompose()
    if remove_base64_images:
        for img in root.css("img[src]"):
            if (img.attrs.get("src") or "").lstrip()[:5].lower() == "data:":
                img.decompose()
    return root, owner


def clean(root: LexborNode, only_main: bool) -> str:
    """The HTML of ``root`` with the dropped elements removed (``root`` is changed)."""
    root.strip_tags(_ALWAYS_DROP, recursive=True)
    if only_main:
        root.strip_tags(_MAIN_DROP, recursive=True)
        for node in root.css('[role="navigation"]'):
            node.decompose()
    return root.html or ""


# This module's cleaning is the only cleaning: html_to_markdown's own preprocessing (which
# drops nav/header/forms even without only_main_content) is off, and so is its front matter.
_NO_PREPROCESSING = _native.PreprocessingOptions(enabled=False)


def to_markdown(html: str, base_url: str) -> str:
    """Markdown of an HTML fragment, links resolved against ``base_url``."""
    return _native.convert(html=html, options=native_options(base_url), visitor=None).content or ""


def native_options(base_url: str) -> Any:
    """``to_markdown``'s options, built as the binding's own object: the one
    ``html_to_markdown.convert`` would build from its dataclass on every call, a dozen
    enum lookups by name (~0.13 ms, as much as converting a small page).
    ``tests/test_markdown_options.py`` holds it equal to what the public way builds."""
    return _native.ConversionOptions(
        extract_metadata=False, preprocessing=_NO_PREPROCESSING, base_url=base_url
    )
