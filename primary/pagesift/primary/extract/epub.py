"""EPUB -> markdown and metadata: the spine's XHTML chapters in spine order.

Each chapter is rendered by ``htmlclean.to_markdown`` (the HTML path's renderer) after
``<!-- chapter N -->``; metadata comes from the OPF package document that
``META-INF/container.xml`` names. ``xmlparts.Package`` reads the container and the OPF
under its caps; a chapter is read with ``Zip.read`` (at most ``MAX_MEMBER_BYTES``).
At most ``max_pages`` chapters are read, and the spine lists at most
``zipguard.MAX_SLIDES`` (each names a part of its own).
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote

from pagesift.primary.extract.converted import (
    Budget,
    Converted,
    DocumentError,
    DocumentTooLarge,
    finish,
)
from pagesift.primary.extract.htmlclean import to_markdown
from pagesift.primary.extract.xmlparts import Package, child_text, local
from pagesift.primary.extract.zipguard import MAX_SLIDES

__all__ = ["read_epub"]


def read_epub(body: bytes, url: str, max_pages: int | None, budget: Budget) -> Converted:
    """The EPUB ``body``'s chapters (at most ``max_pages``), links against ``url``."""
    z = Package(body, "epub")
    container = z.xml("META-INF/container.xml")
    opf_path = next(
        (el.get("full-path", "") for el in container.iter() if local(el.tag) == "rootfile"), ""
    )
    if not opf_path:
        raise DocumentError("epub: no rootfile in META-INF/container.xml")
    opf = z.xml(opf_path)
    folder = posixpath.dirname(opf_path)
    conv = Converted(kind="epub", markdown="")
    conv.title = child_text(opf, "title")
    conv.author = child_text(opf, "creator")
    conv.created = child_text(opf, "date")
    for el in opf.iter():
        if local(el.tag) == "meta" and el.get("property") == "dcterms:modified":
            conv.modified = (el.text or "").strip()
    conv.metadata["language"] = child_text(opf, "language")
    conv.metadata["publisher"] = child_text(opf, "publisher")
    conv.metadata["identifier"] = child_text(opf, "identifier")
    conv.metadata["description"] = child_text(opf, "description")
    manifest = {
        el.get("id", ""): posixpath.normpath(posixpath.join(folder, unquote(el.get("href", ""))))
        for el in opf.iter()
        if local(el.tag) == "item"
    }
    chapters = [
        manifest[el.get("idref", "")]
        for el in opf.iter()
        if local(el.tag) == "itemref" and el.get("idref", "") in manifest
    ]
    if len(chapters) > MAX_SLIDES:
        raise DocumentTooLarge(
            f"epub: the spine lists more than {MAX_SLIDES} chapters (MAX_SLIDES)"
        )
    conv.num_pages = len(chapters)
    limit = len(chapters) if max_pages is None else min(len(chapters), max(max_pages, 0))
    for number, part in enumerate(chapters[:limit], start=1):
        if budget.full:
            budget.add("")
            break
        html = z.read(part).decode("utf-8", errors="replace")
        text = to_markdown(html, url).strip()
        budget.add(f"<!-- chapter {number} -->\n\n{text}".strip())
    return finish(conv, budget, "max_pages" if limit < len(chapters) else "")
