"""What every document reader returns and raises, and the character budget they share.

Owns ``Converted`` (one document's markdown and metadata), ``DocumentError`` and its
subclass ``DocumentTooLarge`` (the page errors ``parse_failed`` and ``too_large``), and
``Budget``, the markdown being built under ``max_chars``. The readers (``pdf``,
``ooxml``, ``odf``, ``epub``) import this module and nothing of each other's, and
``documents`` dispatches to them: imports flow from ``documents`` down to here.

Invariants:

- A reader's output passes through ``finish``: the markdown is the budget's parts
  joined by blank lines, ``metadata["truncated"]`` names the first cap that cut it
  ("max_pages" or "max_chars"), and empty metadata values are dropped.
- The exceptions take one string argument and keep it as ``reason``, so they pickle:
  ``convert_compact`` raises them in a worker process and the engine reads ``reason``
  on the other side.
- Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Budget", "Converted", "DocumentError", "DocumentTooLarge", "finish"]


class DocumentError(Exception):
    """The body is not a document the readers can read; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DocumentTooLarge(DocumentError):
    """The document is past one of the readers' caps (its ``reason`` names the cap:
    ``MAX_XML_DEPTH``, ``MAX_MEMBER_BYTES``, ...): the page error ``too_large``."""


@dataclass(slots=True)
class Converted:
    """One document's text and metadata ("" / 0 when the file does not say)."""

    kind: str
    markdown: str
    title: str = ""
    author: str = ""
    created: str = ""  # ISO 8601 (as precise as the file is)
    modified: str = ""
    num_pages: int = 0  # pages (PDF, DOCX when recorded), slides, sheets, chapters
    metadata: dict[str, str] = field(default_factory=dict)


class Budget:
    """The markdown being built, cut at ``max_chars`` characters."""

    def __init__(self, max_chars: int) -> None:
        self.parts: list[str] = []
        self.left = max_chars
        self.truncated = ""

    @property
    def full(self) -> bool:
        return self.left <= 0

    def add(self, text: str) -> None:
        if self.left <= 0:
            self.truncated = self.truncated or "max_chars"
            return
        if len(text) > self.left:
            text = text[: max(self.left - 2, 0)]
            self.truncated = self.truncated or "max_chars"
        self.parts.append(text)
        self.left -= len(text) + 2  # and the blank line that joins it to the next part

    def text(self) -> str:
        return "\n\n".join(p for p in self.parts if p).strip() + "\n"


def finish(conv: Converted, budget: Budget, truncated: str = "") -> Converted:
    """``conv`` with the budget's markdown and the cut that ``truncated`` (a reader's
    own, e.g. "max_pages") or the budget names; empty metadata values dropped."""
    conv.markdown = budget.text()
    why = truncated or budget.truncated
    if why:
        conv.metadata["truncated"] = why
    conv.metadata = {k: v for k, v in conv.metadata.items() if v}
    return conv
