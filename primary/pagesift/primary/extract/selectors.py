"""Selector schemas on a parsed page: ``ScrapeOptions.selectors`` into JSON text (FORMAT_SELECTORS).

Owns ``select(tree, base_url, schema)``: the schema (``SelectorSchema``, serialized,
as ``html.Wanted`` carries it to the extraction worker) read over the page's one
selectolax tree, before ``htmlclean`` changes that tree, into ``Document.selected``.
``docs/selectors.md`` is the user's account; the rules here are its reference:

- ``base_selector`` empty: one object read from the whole page; else a list with one
  object per match, in document order, at most ``MAX_ITEMS`` (the first ones).
- A field's ``selector`` matches under its item (the item's descendants; never the
  item itself), empty meaning the item itself (for the whole page: ``<html>``).
  ``all``: every match's value, in document order, as a list (at most ``MAX_ITEMS``;
  empty when none matched); else the first match's value, null when none matched.
- TEXT: the element's text (``text``), whitespace collapsed to single spaces, block
  elements and ``<br>`` separating words, the contents of script, style, template
  and noscript elements inside it left out. ATTRIBUTE: the attribute's value (its
  name matched in lowercase, as HTML parses it), null when the element has none;
  ``href`` and ``src`` are made absolute against the page's URL (its ``<base href>``
  applied). HTML: the element's outer HTML. NESTED: an object of the nested fields
  read under the element.
- ``type`` (``convert``): STRING as read; NUMBER the first number in the text
  (``number``: "," separates thousands in groups of three, "." is the decimal point,
  a sign counts when no letter or digit is glued before it; null when there is none
  or it does not fit a double); INTEGER that number truncated toward zero (null
  outside the signed 64-bit range); BOOLEAN false for "", "0", "false", "no", "off"
  (any case, surrounding spaces ignored), else true.
- Keys come in schema order; ``json.dumps(..., ensure_ascii=False)``, no NaN.

Bounds (all constants): at most ``MAX_ITEMS`` base matches and ``MAX_ITEMS`` values in
one ``all`` list; at most ``MAX_SELECTED_BYTES`` of JSON: the values are counted as
they are read, so a schema whose output would pass it stops early (``TooLarge``,
which ``html.extract`` turns into a FormatError ``too_large`` of FORMAT_SELECTORS, the
rest of the document kept). The time is the worker's ``extract_timeout``, like every
format (the selectors are lexbor's own matching; the schema's size is bounded at
submission: ``pagesift.core.jobs.selectorschemas``).

Deterministic: the same page and schema give the same bytes (lexbor's matches come in
document order, nothing reads a clock or a random source). Nothing here does I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urljoin, urlsplit

from selectolax.lexbor import LexborHTMLParser, LexborNode

from pagesift.v1 import jobs_pb2

__all__ = [
    "MAX_ITEMS",
    "MAX_SELECTED_BYTES",
    "SelectionError",
    "TooLarge",
    "convert",
    "number",
    "select",
    "text",
]

MAX_ITEMS = 10_000  # base matches read, and values of one ``all`` list
MAX_SELECTED_BYTES = 8 << 20  # of the JSON text (UTF-8)

_TEXT, _ATTRIBUTE, _HTML, _NESTED = (
    jobs_pb2.SELECTOR_SOURCE_TEXT,
    jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE,
    jobs_pb2.SELECTOR_SOURCE_HTML,
    jobs_pb2.SELECTOR_SOURCE_NESTED,
)
_URL_ATTRIBUTES = frozenset({"href", "src"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_INT64 = 1 << 63
# A sign counts only when no letter or digit is glued before it ("SKU-42" is 42).
_NUMBER = re.compile(
    r"(?P<sign>(?<!\w)[-+\u2212])?"
    r"(?P<num>(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
)
_MAX_INTEGER_DIGITS = 19  # more cannot be in the signed 64-bit range
# Elements whose boundaries separate words (HTML's block-level and line-breaking ones).
_BLOCK = frozenset((
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "details", "dialog",
    "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3",
    "h4", "h5", "h6", "header", "hgroup", "hr", "legend", "li", "main", "menu", "nav", "ol",
    "optgroup", "option", "p", "pre", "section", "summary", "table", "tbody", "td", "tfoot",
    "th", "thead", "tr", "ul",
))  # fmt: skip
_NO_TEXT = frozenset({"script", "style", "template", "noscript"})  # inside the element read
_UNUSUAL = re.compile(r"[\\\t\r\n]")  # urlsplit drops tabs and newlines; "\\" stays as is
_VALUE_OVERHEAD = 8  # characters counted per value and key beyond their own (quotes, commas)


class SelectionError(Exception):
    """The schema gave no value for this page (``code`` the FormatError code, ``reason``
    its message). Plain arguments, so it crosses a process boundary."""

    code = "selection_failed"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TooLarge(SelectionError):
    """The JSON would pass ``MAX_SELECTED_BYTES``."""

    code = "too_large"


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    selector: str
    source: int
    attribute: str  # lowercase
    type: int
    all: bool
    fields: tuple[_Field, ...]


@dataclass(frozen=True, slots=True)
class _Plan:
    base: str
    fields: tuple[_Field, ...]


_PLANS: dict[bytes, _Plan] = {}
_MAX_PLANS = 64
_PLANNED_BYTES = 64 << 10


def _plan(schema: bytes) -> _Plan:
    """The parsed schema (cached per worker by its bytes: at most ``_MAX_PLANS`` schemas
    of at most ``_PLANNED_BYTES`` each)."""
    got = _PLANS.get(schema)
    if got is None:
        msg = jobs_pb2.SelectorSchema.FromString(schema)
        got = _Plan(msg.base_selector, _compile(msg.fields))
        if len(schema) <= _PLANNED_BYTES:  # a bigger one is parsed per page, not kept
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[schema] = got
    return got


def _compile(fields: Any) -> tuple[_Field, ...]:
    return tuple(
        _Field(
            f.name,
            f.selector,
            f.source or _TEXT,
            f.attribute.lower(),
            f.type or jobs_pb2.VALUE_TYPE_STRING,
            f.all,
            _compile(f.fields),
        )
        for f in fields
    )


class _Budget:
    """Characters of output left; ``spend`` raises ``TooLarge`` past the end."""

    __slots__ = ("left",)

    def __init__(self, chars: int) -> None:
        self.left = chars

    def spend(self, n: int) -> None:
        self.left -= n + _VALUE_OVERHEAD
        if self.left < 0:
            raise TooLarge(
                f"the selected JSON passes {MAX_SELECTED_BYTES} bytes (MAX_SELECTED_BYTES)"
            )


def select(tree: LexborHTMLParser, base_url: str, schema: bytes) -> str:
    """``schema`` (a serialized ``SelectorSchema``) over ``tree`` as JSON text;
    ``base_url`` is what ``href``/``src`` resolve against. Raises ``TooLarge`` (and
    ``SelectionError`` for a selector lexbor refuses, which validation rules out)."""
    plan = _plan(schema)
    budget = _Budget(MAX_SELECTED_BYTES)
    base = _Base(base_url)
    value: object
    if plan.base:
        items = _matches(tree, None, plan.base)[:MAX_ITEMS]
        value = [_object(tree, item, plan.fields, base, budget) for item in items]
    elif tree.root is not None:
        value = _object(tree, None, plan.fields, base, budget)
    else:  # no document at all: every field as when nothing matched
        value = {f.name: [] if f.all else None for f in plan.fields}
    out = json.dumps(value, ensure_ascii=False, sort_keys=False, allow_nan=False)
    if len(out.encode()) > MAX_SELECTED_BYTES:
        raise TooLarge(f"the selected JSON passes {MAX_SELECTED_BYTES} bytes (MAX_SELECTED_BYTES)")
    return out


def _matches(tree: LexborHTMLParser, item: LexborNode | None, selector: str) -> list[LexborNode]:
    """Every match of ``selector`` under ``item`` (the item excluded; lexbor's own
    ``css`` includes it), or in the whole ``tree`` when ``item`` is None."""
    try:
        if item is None:
            return list(tree.css(selector))
        found = item.css(selector)
    except Exception:  # validation parsed every selector: another selectolax build
        raise SelectionError(f"the selector {selector[:64]!r} cannot be parsed") from None
    if found and found[0].mem_id == item.mem_id:  # the item comes first in document order
        return list(found[1:])
    return list(found)


def _first(tree: LexborHTMLParser, item: LexborNode | None, selector: str) -> LexborNode | None:
    """The first match of ``selector`` under ``item`` (as ``_matches``), or None."""
    try:
        found = (tree if item is None else item).css_first(selector)
    except Exception:
        raise SelectionError(f"the selector {selector[:64]!r} cannot be parsed") from None
    if found is not None and item is not None and found.mem_id == item.mem_id:
        rest = _matches(tree, item, selector)
        return rest[0] if rest else None
    return found


def _object(
    tree: LexborHTMLParser,
    item: LexborNode | None,
    fields: tuple[_Field, ...],
    base: _Base,
    budget: _Budget,
) -> dict[str, object]:
    """The object of ``fields`` read under ``item`` (None: the whole page, whose own
    element is ``<html>``)."""
    itself = item if item is not None else tree.root
    out: dict[str, object] = {}
    for f in fields:
        budget.spend(len(f.name))
        if f.all:
            nodes = _matches(tree, item, f.selector)[:MAX_ITEMS] if f.selector else [itself]
            out[f.name] = [_value(tree, n, f, base, budget) for n in nodes if n is not None]
        else:
            node = _first(tree, item, f.selector) if f.selector else itself
            out[f.name] = None if node is None else _value(tree, node, f, base, budget)
    return out


def _value(
    tree: LexborHTMLParser, node: LexborNode, f: _Field, base: _Base, budget: _Budget
) -> object:
    if f.source == _NESTED:
        budget.spend(0)
        return _object(tree, node, f.fields, base, budget)
    if f.source == _HTML:
        html = node.html or ""
        budget.spend(len(html))
        return html
    raw: str | None
    if f.source == _ATTRIBUTE:
        raw = node.attrs.get(f.attribute)
        if raw is not None and f.attribute in _URL_ATTRIBUTES:
            raw = base.absolute(raw)
    else:
        raw = text(node)
    if raw is None:
        budget.spend(0)
        return None
    budget.spend(len(raw))
    return convert(raw, f.type)


class _Base:
    """The page's URL, for ``href``/``src``: ``absolute`` is ``urljoin``'s answer, found
    without it for the common spellings (absolute http(s), path-absolute, a relative path
    without dot segments), as ``htmllinks.links`` does."""

    __slots__ = ("dir", "joined", "origin", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.joined: dict[str, str] = {}  # urljoin's answers on this page (hrefs repeat)
        try:
            parts = urlsplit(url)
        except ValueError:
            parts = urlsplit("")
        self.origin = f"{parts.scheme}://{parts.netloc}" if parts.scheme else ""
        self.dir = self.origin + (parts.path[: parts.path.rfind("/") + 1] or "/")

    def absolute(self, value: str) -> str:
        href = value.strip()
        path = href.partition("?")[0].partition("#")[0]
        if (
            not self.origin
            or not href
            or "./" in path
            or path.endswith(".")
            or (_UNUSUAL.search(href) is not None)
        ):
            pass  # urljoin below: dot segments, an empty value, a character it treats
        elif href.startswith(("http://", "https://")):
            return href
        elif href[0] == "/" and not href.startswith("//"):
            return self.origin + href  # path-absolute
        elif href[0] not in "/?#" and ":" not in href.partition("/")[0]:
            return self.dir + href  # path-relative (RFC 3986 5.2.3 merge)
        got = self.joined.get(href)
        if got is None:
            try:
                got = urljoin(self.url, href)
            except ValueError:  # e.g. an unclosed IPv6 bracket: the value as the page wrote it
                got = value
            self.joined[href] = got
        return got


def text(node: LexborNode) -> str:
    """``node``'s text: whitespace collapsed to single spaces, block elements and
    ``<br>`` separating words, the insides of script/style/template/noscript elements
    under it left out (``node`` itself is read whatever it is: a selected
    ``<script type="application/ld+json">`` gives its JSON)."""
    child = node.child
    if child is None:
        return ""
    if child.is_text_node and child.next is None:  # a leaf: its one text node
        return " ".join((child.text_content or "").split())
    parts: list[str] = []
    stack: list[LexborNode | None] = list(reversed(list(node.iter(include_text=True))))
    while stack:
        n = stack.pop()
        if n is None:  # the end of a block element
            parts.append(" ")
            continue
        if n.is_text_node:
            parts.append(n.text_content or "")
            continue
        if not n.is_element_node:
            continue  # comments
        tag = n.tag or ""
        if tag in _NO_TEXT:
            continue
        if tag in _BLOCK:
            parts.append(" ")
            stack.append(None)
        children = list(n.iter(include_text=True))
        children.reverse()
        stack.extend(children)
    return " ".join("".join(parts).split())


def number(value: str) -> Decimal | None:
    """The first number in ``value`` (the module docstring's rule), or None."""
    m = _NUMBER.search(value)
    if m is None:
        return None
    sign = "-" if m.group("sign") in ("-", "\u2212") else ""
    return Decimal(sign + m.group("num").replace(",", ""))


def convert(raw: str, value_type: int) -> object:
    """``raw`` as ``value_type`` asks (the module docstring's rules)."""
    if value_type == jobs_pb2.VALUE_TYPE_STRING:
        return raw
    if value_type == jobs_pb2.VALUE_TYPE_BOOLEAN:
        return raw.strip().lower() not in _FALSE
    if value_type not in (jobs_pb2.VALUE_TYPE_NUMBER, jobs_pb2.VALUE_TYPE_INTEGER):
        return raw
    found = number(raw)
    if found is None:
        return None
    if value_type == jobs_pb2.VALUE_TYPE_INTEGER:
        if found.adjusted() >= _MAX_INTEGER_DIGITS:  # past 10**19: no int64, no big int made
            return None
        whole = int(found)  # truncates toward zero
        return whole if -_INT64 <= whole < _INT64 else None
    as_float = float(found)
    return as_float if math.isfinite(as_float) else None
