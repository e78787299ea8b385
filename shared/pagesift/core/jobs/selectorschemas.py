"""Selector schemas at submission: the bounds and shape of ``ScrapeOptions.selectors``.

What it owns: ``check(opts, field)``, the rules of a selector schema (FORMAT_SELECTORS,
``docs/selectors.md``) and of how it goes with the formats, and the bounds it enforces
(``MAX_FIELDS``, ``MAX_TOTAL_FIELDS``, ``MAX_DEPTH``, ``MAX_NAME``,
``MAX_SELECTOR_CHARS``, ``MAX_ATTRIBUTE``). The schema is walked depth first in field
order, so the first problem found is always the same one for the same request, named by
its path (``options.selectors.fields[2].fields[0].selector``).

The rules:

- FORMAT_SELECTORS needs ``selectors``; ``selectors`` without FORMAT_SELECTORS is refused
  (a schema nobody reads would still be stored and evaluated for nothing);
- ``base_selector`` and every field's ``selector``: at most ``MAX_SELECTOR_CHARS``
  characters, and one selectolax's lexbor engine (the extractor's) can parse; empty is allowed (the
  whole page, or the item itself);
- each object: 1..``MAX_FIELDS`` fields, names 1..``MAX_NAME`` characters and unique;
  ``MAX_TOTAL_FIELDS`` fields in the whole schema, at most ``MAX_DEPTH`` levels (the
  schema's own fields are level 1);
- ``source`` and ``type`` are known enum values; ``attribute`` is set (a name of at most
  ``MAX_ATTRIBUTE`` characters, no space or control character) exactly when the source
  is ATTRIBUTE; ``fields`` are set exactly when it is NESTED; ``type`` other than
  STRING goes with TEXT and ATTRIBUTE only (an HTML or NESTED value is never converted).

Why it is pure and safe: it reads the message and parses selectors against a fixed
one-element probe document, nothing else; the walk is bounded by ``MAX_TOTAL_FIELDS``
and ``MAX_DEPTH`` before any selector is parsed past them. It raises ``SchemaError``
(``field``, ``reason``); ``validate.options`` turns it into ``InvalidArgument`` with
the same field and reason (this module imports nothing of ``validate``, which imports
it, so the two stay free of a cycle).
"""

from __future__ import annotations

from collections.abc import Sequence

from selectolax.lexbor import LexborHTMLParser

from pagesift.v1 import jobs_pb2

__all__ = [
    "MAX_ATTRIBUTE",
    "MAX_DEPTH",
    "MAX_FIELDS",
    "MAX_NAME",
    "MAX_SELECTOR_CHARS",
    "MAX_TOTAL_FIELDS",
    "SchemaError",
    "check",
]

MAX_FIELDS = 100  # fields of one object
MAX_TOTAL_FIELDS = 1_000  # fields of the whole schema, every level counted
MAX_DEPTH = 5  # levels of objects: the schema's fields are level 1
MAX_NAME = 100  # characters of a field's name
MAX_SELECTOR_CHARS = 1024  # characters of a selector
MAX_ATTRIBUTE = 256  # characters of an attribute's name

_PROBE = LexborHTMLParser("<p></p>")
_CONVERTED = (jobs_pb2.SELECTOR_SOURCE_UNSPECIFIED, jobs_pb2.SELECTOR_SOURCE_TEXT,
              jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE)  # fmt: skip
_STRING = (jobs_pb2.VALUE_TYPE_UNSPECIFIED, jobs_pb2.VALUE_TYPE_STRING)


class SchemaError(ValueError):
    """A selector schema that cannot be accepted: ``field`` (its path) and ``reason``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def check(opts: jobs_pb2.ScrapeOptions, field: str = "options") -> None:
    """Raise ``SchemaError`` naming the first problem of ``opts``' selector schema (or
    of how it goes with ``opts.formats``); return when there is none."""
    asked = jobs_pb2.FORMAT_SELECTORS in opts.formats
    has = opts.HasField("selectors")
    where = f"{field}.selectors"
    if asked and not has:
        raise SchemaError(where, "FORMAT_SELECTORS needs a selector schema")
    if has and not asked:
        raise SchemaError(where, "a selector schema goes with FORMAT_SELECTORS in formats")
    if not has:
        return
    schema = opts.selectors
    _selector(schema.base_selector, f"{where}.base_selector")
    _fields(schema.fields, f"{where}.fields", 1, [0])


def _selector(selector: str, where: str) -> None:
    if len(selector) > MAX_SELECTOR_CHARS:
        raise SchemaError(where, f"{len(selector)} characters, at most {MAX_SELECTOR_CHARS}")
    if not selector:
        return
    try:
        _PROBE.css(selector)
    except Exception:  # selectolax raises SelectolaxError (a ValueError) today
        raise SchemaError(
            where, f"{selector[:64]!r} is not a CSS selector selectolax can parse"
        ) from None


def _fields(
    fields: Sequence[jobs_pb2.SelectorField], where: str, level: int, total: list[int]
) -> None:
    """One object's fields at ``level``; ``total`` counts the schema's fields so far."""
    if not fields:
        raise SchemaError(where, "an object needs at least one field")
    if len(fields) > MAX_FIELDS:
        raise SchemaError(where, f"{len(fields)} fields, at most {MAX_FIELDS}")
    total[0] += len(fields)
    if total[0] > MAX_TOTAL_FIELDS:
        raise SchemaError(where, f"the schema has over {MAX_TOTAL_FIELDS} fields in all")
    seen: set[str] = set()
    for i, f in enumerate(fields):
        at = f"{where}[{i}]"
        if not 0 < len(f.name) <= MAX_NAME:
            raise SchemaError(f"{at}.name", f"a name is 1..{MAX_NAME} characters")
        if f.name in seen:
            raise SchemaError(f"{at}.name", f"{f.name[:64]!r} is already a field of this object")
        seen.add(f.name)
        _selector(f.selector, f"{at}.selector")
        _field_shape(f, at, level, total)


def _field_shape(f: jobs_pb2.SelectorField, at: str, level: int, total: list[int]) -> None:
    """A field's source, attribute, type and nested fields."""
    if f.source not in jobs_pb2.SelectorSource.values():
        raise SchemaError(f"{at}.source", f"unknown selector source {f.source}")
    if f.type not in jobs_pb2.ValueType.values():
        raise SchemaError(f"{at}.type", f"unknown value type {f.type}")
    attribute = f.source == jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE
    if attribute and not f.attribute:
        raise SchemaError(f"{at}.attribute", "SELECTOR_SOURCE_ATTRIBUTE needs an attribute name")
    if f.attribute and not attribute:
        raise SchemaError(f"{at}.attribute", "an attribute goes with SELECTOR_SOURCE_ATTRIBUTE")
    if f.attribute and (
        len(f.attribute) > MAX_ATTRIBUTE
        or not f.attribute.isprintable()
        or any(c.isspace() for c in f.attribute)
    ):
        raise SchemaError(
            f"{at}.attribute",
            f"an attribute name is at most {MAX_ATTRIBUTE} characters, no space or control one",
        )
    if f.source not in _CONVERTED and f.type not in _STRING:
        raise SchemaError(f"{at}.type", "a value type goes with TEXT and ATTRIBUTE sources")
    nested = f.source == jobs_pb2.SELECTOR_SOURCE_NESTED
    if nested and not f.fields:
        raise SchemaError(f"{at}.fields", "SELECTOR_SOURCE_NESTED needs fields")
    if f.fields and not nested:
        raise SchemaError(f"{at}.fields", "fields go with SELECTOR_SOURCE_NESTED")
    if nested:
        if level >= MAX_DEPTH:
            raise SchemaError(f"{at}.fields", f"nested deeper than {MAX_DEPTH} levels")
        _fields(f.fields, f"{at}.fields", level + 1, total)
