"""The XML parts of a zip document, parsed streamed through a hardened parser under caps.

Owns ``Package``: a ``zipguard.Zip`` whose XML parts (the text of DOCX, PPTX, XLSX,
ODT and the manifests of EPUB) are read as ``events`` or, for a small part, whole
(``xml``); and the tag helpers every format uses (``local``, ``child_text``).

Invariants:

- Every part goes through defusedxml's expat parser, which refuses a DTD, an entity
  declaration or an external reference in any encoding (expat reports them after
  decoding: a UTF-16 ``<!DOCTYPE`` is caught like a UTF-8 one): ``DocumentError``.
- The parse is capped as it goes, so memory follows what is kept, not what the file
  says: ``MAX_XML_DEPTH`` nesting, ``MAX_PART_ELEMENTS`` per part,
  ``MAX_DOCUMENT_ELEMENTS`` across one document's parts and ``MAX_HELD_ELEMENTS`` held
  at once; past one, ``DocumentTooLarge`` naming it. Real documents stay far below
  each.
- An element is detached from the tree once the caller has seen its end, unless it
  lies inside a subtree the caller reads whole (``keep``), so memory holds the open
  elements and one paragraph, cell or string.
- The bytes come from ``Zip.chunks``, so the zip's size caps hold during the parse.
- The caps are module globals read once a part, so a test may lower them.
"""

from __future__ import annotations

from collections.abc import Iterator
from xml.etree import ElementTree as ET

import defusedxml.ElementTree as _SAFE_ET
from defusedxml import DefusedXmlException

from pagesift.primary.extract.converted import DocumentError, DocumentTooLarge
from pagesift.primary.extract.zipguard import Zip

__all__ = [
    "MAX_DOCUMENT_ELEMENTS",
    "MAX_HELD_ELEMENTS",
    "MAX_PART_ELEMENTS",
    "MAX_XML_DEPTH",
    "Package",
    "child_text",
    "local",
]

MAX_XML_DEPTH = 256  # elements nested in one part (Word nests tables ~10 per level)
# Elements in one part, and across a document's parts: the character budget stops a
# real document's reading first (2 M elements carry far more than 5 M characters of
# text but in element-heavy, text-light parts, which are what these caps are for).
MAX_PART_ELEMENTS = 2_000_000
MAX_DOCUMENT_ELEMENTS = 4_000_000
MAX_HELD_ELEMENTS = 100_000  # elements held at once: one paragraph/cell/string, or a
# part read whole (metadata, relationships, manifests)


class Package(Zip):
    """A zip document whose XML parts go through the hardened parser under the element
    caps; ``elements`` counts the elements parsed in all its parts together."""

    def __init__(self, body: bytes, kind: str) -> None:
        super().__init__(body, kind)
        self.elements = 0

    def xml(self, name: str) -> ET.Element:
        """A small part parsed whole (metadata, relationships, manifests): at most
        ``MAX_HELD_ELEMENTS`` elements."""
        root: ET.Element | None = None
        for event, el in self.events(name, hold=True):
            if root is None and event == "start":
                root = el
        if root is None:  # pragma: no cover - a well-formed part has a root
            raise DocumentError(f"{self.kind}: the part {name} is empty")
        return root

    def events(
        self, name: str, keep: frozenset[str] = frozenset(), *, hold: bool = False
    ) -> Iterator[tuple[str, ET.Element]]:
        """("start"|"end", element) of a part, streamed through the hardened parser.

        Once the caller has seen an element's "end", the element is detached from the
        tree unless it lies inside an element whose local name is in ``keep`` (the
        caller reads those subtrees at their end) or ``hold`` is set (the whole part is
        kept): memory holds the open elements and the kept subtree, no more. Raises
        ``DocumentTooLarge`` past ``MAX_XML_DEPTH``, ``MAX_PART_ELEMENTS``,
        ``MAX_DOCUMENT_ELEMENTS`` or ``MAX_HELD_ELEMENTS``, and ``DocumentError`` for a
        DTD, an entity declaration or XML that is not well-formed."""
        stack: list[ET.Element] = []
        kept = 0  # kept elements open on the stack
        held = 0  # elements inside the outermost kept element (or the part, with hold)
        count = 0
        source = _ChunkReader(self.chunks(name))
        parse = _SAFE_ET.iterparse(
            source,
            events=("start", "end"),
            forbid_dtd=True,
            forbid_entities=True,
            forbid_external=True,
        )
        # the caps, read once a part (tests lower them); "hold" counts from the root
        max_depth, max_count, max_held = MAX_XML_DEPTH, MAX_PART_ELEMENTS, MAX_HELD_ELEMENTS
        room = MAX_DOCUMENT_ELEMENTS - self.elements
        local_name = local  # a fast local lookup: called for every element
        try:
            for event, el in parse:
                if event == "start":
                    count += 1
                    stack.append(el)
                    if kept or hold:
                        held += 1
                    if keep and local_name(el.tag) in keep:
                        kept += 1
                    if (
                        len(stack) > max_depth
                        or count > max_count
                        or count > room
                        or held > max_held
                    ):
                        self._caps(name, count, len(stack), held, hold)
                    yield event, el
                    continue
                yield event, el
                stack.pop()
                if kept and local_name(el.tag) in keep:
                    kept -= 1
                    if not kept:
                        held = 0
                if stack and not (kept or hold):
                    # earlier siblings are gone already: el is the parent's first child
                    stack[-1].remove(el)
        except ET.ParseError as exc:
            raise DocumentError(f"{self.kind}: the part {name} is not well-formed XML") from exc
        except DefusedXmlException as exc:
            raise DocumentError(
                f"{self.kind}: the part {name} declares a DTD or entities ({type(exc).__name__})"
            ) from exc
        finally:
            self.elements += count
            source.close()

    def _caps(self, name: str, count: int, depth: int, held: int, hold: bool) -> None:
        where = f"{self.kind}: the part {name}"
        if depth > MAX_XML_DEPTH:
            raise DocumentTooLarge(
                f"{where} nests XML elements deeper than {MAX_XML_DEPTH} (MAX_XML_DEPTH)"
            )
        if count > MAX_PART_ELEMENTS:
            raise DocumentTooLarge(
                f"{where} has more than {MAX_PART_ELEMENTS} XML elements (MAX_PART_ELEMENTS)"
            )
        if self.elements + count > MAX_DOCUMENT_ELEMENTS:
            raise DocumentTooLarge(
                f"{self.kind}: more than {MAX_DOCUMENT_ELEMENTS} XML elements in all "
                "(MAX_DOCUMENT_ELEMENTS)"
            )
        if held > MAX_HELD_ELEMENTS:
            what = "in the part" if hold else "in one of its paragraphs, cells or strings"
            raise DocumentTooLarge(
                f"{where} has more than {MAX_HELD_ELEMENTS} XML elements {what} (MAX_HELD_ELEMENTS)"
            )


class _ChunkReader:
    """A read()-able view of an iterator of byte chunks (what ``iterparse`` reads)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""

    def read(self, size: int = -1) -> bytes:
        if not self._rest:
            self._rest = next(self._chunks, b"")
        if size < 0 or size >= len(self._rest):
            out, self._rest = self._rest, b""
        else:
            out, self._rest = self._rest[:size], self._rest[size:]
        return out

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def local(tag: str) -> str:
    """A tag's local name (``{namespace}p`` -> ``p``): the formats match on these."""
    return tag.rsplit("}", 1)[-1]


def child_text(root: ET.Element, name: str) -> str:
    """The text of the first element under ``root`` whose local name is ``name``."""
    for el in root.iter():
        if local(el.tag) == name:
            return "".join(el.itertext()).strip()
    return ""
