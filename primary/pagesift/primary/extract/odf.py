"""ODT (OpenDocument text) -> markdown and metadata, from ``content.xml`` and ``meta.xml``.

Headings (``text:h``, ``#`` by outline level) and paragraphs in document order; spans,
``text:s`` runs of spaces, tabs and line breaks kept; notes and annotations left out.
A paragraph inside a paragraph (a frame, a note) is read with its parent, once.
``xmlparts.Package`` streams the parts under its caps; the file has no pages, so only
the character budget bounds the text. ODP and ODS are not read (rare on the web).
"""

from __future__ import annotations

from xml.etree import ElementTree as ET

from pagesift.primary.extract.converted import Budget, Converted, finish
from pagesift.primary.extract.xmlparts import Package, child_text, local

__all__ = ["read_odt"]


def _odf_text(el: ET.Element) -> str:
    """Text of an ODF paragraph: spans, ``text:s`` runs of spaces, tabs, line breaks."""
    parts = [el.text or ""]
    for child in el:
        name = local(child.tag)
        if name == "s":
            count = next((v for k, v in child.attrib.items() if local(k) == "c"), "1")
            parts.append(" " * min(int(count) if count.isdigit() else 1, 100))
        elif name == "tab":
            parts.append("\t")
        elif name == "line-break":
            parts.append("\n")
        elif name not in ("note", "annotation"):
            parts.append(_odf_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


_ODT_KEEP = frozenset({"p", "h"})  # read whole at their end (_odf_text)


def read_odt(body: bytes, budget: Budget) -> Converted:
    """The ODT ``body``'s headings and paragraphs, and its metadata."""
    z = Package(body, "odt")
    conv = Converted(kind="odt", markdown="")
    if z.has("meta.xml"):
        meta = z.xml("meta.xml")
        conv.title = child_text(meta, "title")
        conv.author = child_text(meta, "initial-creator") or child_text(meta, "creator")
        conv.created = child_text(meta, "creation-date")
        conv.modified = child_text(meta, "date")
        conv.metadata["subject"] = child_text(meta, "subject")
        conv.metadata["description"] = child_text(meta, "description")
        conv.metadata["generator"] = child_text(meta, "generator")
        conv.metadata["language"] = child_text(meta, "language")
        for el in meta.iter():
            if local(el.tag) == "document-statistic":
                for key, value in el.attrib.items():
                    if local(key) == "page-count" and value.isdigit():
                        conv.num_pages = int(value)
    depth = 0  # paragraphs inside paragraphs (frames, notes) are read with their parent
    for event, el in z.events("content.xml", _ODT_KEEP):
        if budget.full:
            budget.add("")
            break
        name = local(el.tag)
        if name not in ("p", "h"):
            continue
        if event == "start":
            depth += 1
            continue
        depth -= 1
        if depth:
            continue
        text = _odf_text(el).strip()
        if text and name == "h":
            level = next((v for k, v in el.attrib.items() if local(k) == "outline-level"), "1")
            text = "#" * min(int(level) if level.isdigit() else 1, 6) + " " + " ".join(text.split())
        if text:
            budget.add(text)
        el.clear()
    return finish(conv, budget)
