"""The gateway's bounds on what a caller sends: a body's JSON shape, and every integer.

What it owns
------------
``parse_json(raw)``: a request body's bytes -> its JSON value, or ``HttpError`` 400
naming the limit it passes: UTF-8 only (RFC 8259 section 8.1), nesting at most
``MAX_DEPTH`` arrays and objects deep, at most ``MAX_CONTAINERS`` arrays and objects and
``MAX_VALUES`` values in all, finite numbers only (no ``NaN``/``Infinity``, no
``1e999``), and strings that are Unicode text (no lone surrogate escape: no proto string
can carry one).

``proto_int(*fields, ...)`` and ``proto_millis(*fields, ...)``: the annotated ``int``
types of the request models' integer fields, bounded by the proto field(s) the value
lands in, as read off the generated descriptors (``StartCrawlRequest.limit`` is int32:
at most 2,147,483,647; a ``google.protobuf.Duration`` in milliseconds: at most its
315,576,000,000 seconds), and tighter where the model says so (Firecrawl's own bounds);
``gateway_int(low, high, why)`` for an integer no proto field carries (refused by name,
or used by the gateway itself). Each returns a ``Bound``, the metadata of
``Annotated[int, ...]`` that pydantic enforces and the bound's test reads back;
``int_range(field)`` is one proto field's range (the query parameters' bound).

Invariants
----------
- The shape check runs before ``json.loads`` and cannot recurse: one pass of C-level
  regex and ``bytes.translate`` over the body, then one loop over its first
  2 x ``MAX_CONTAINERS`` brackets (a body with more is refused). Only valid UTF-8 gets
  there, whose multi-byte sequences hold no ASCII byte, and strings are skipped as JSON
  tokenizes them (a quote, escapes, a quote), so over every prefix ``json.loads`` can
  parse the depth counted is the depth it reaches: nesting past the limit is a 400,
  never a RecursionError. Linear time: the string pattern matches at every opening
  quote (an unterminated string runs to the end), so no attempt is retried.
- Every integer field of every request model is a ``Bound`` (tests/test_gateway_input_bounds.py
  walks them all): a value its model accepts fits its proto field, so building the
  request never raises protobuf's range ValueError (a 500 before), and a value past it
  is a 400 naming the field by its body path.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import annotated_types as at
from google.protobuf import descriptor

from pagesift.gateway.httperrors import HttpError, bad_request, issue
from pagesift.v1 import jobs_pb2

__all__ = [
    "DURATION_MAX_MS",
    "INT32_MAX",
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_VALUES",
    "Bound",
    "gateway_int",
    "int_range",
    "parse_json",
    "proto_int",
    "proto_millis",
]

MAX_DEPTH = 64  # arrays and objects nested in one another (Firecrawl's bodies need < 10)
MAX_CONTAINERS = 100_000  # arrays and objects in one body
MAX_VALUES = 1_000_000  # values (array items and object members) in one body
INT32_MAX = 2**31 - 1
#: the longest ``google.protobuf.Duration`` (its documented range: +-315,576,000,000 s)
DURATION_MAX_MS = 315_576_000_000 * 1000

# ---------------------------------------------------------------- the JSON shape

#: a JSON string from its opening quote: escapes taken in pairs, up to the closing quote
#: or the end of the body (an unterminated string matches too, so no attempt is retried)
_STRING = re.compile(rb'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)')
_STRUCTURE = b"[]{},"
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _NotFinite(ValueError):
    pass


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _constant(text: str) -> Any:
    raise _NotFinite(text)


def _limit(message: str) -> HttpError:
    return bad_request(f"Bad Request: {message}", [issue("custom", [], message)])


def _check_shape(raw: bytes) -> None:
    """400 for a body past ``MAX_DEPTH``, ``MAX_CONTAINERS`` or ``MAX_VALUES`` (see the
    module docstring: no recursion, linear time)."""
    skeleton = _STRING.sub(b"", raw).translate(None, _NOT_STRUCTURE)
    brackets = skeleton.translate(None, b",")
    head = brackets[: 2 * MAX_CONTAINERS + 2]  # the loop's bound; more is refused below
    if max(accumulate(map(_STEP.__getitem__, head)), default=0) > MAX_DEPTH:
        raise _limit(f"the body nests arrays and objects deeper than {MAX_DEPTH} levels")
    opens = brackets.count(b"[") + brackets.count(b"{")
    if opens > MAX_CONTAINERS:
        raise _limit(f"the body has more than {MAX_CONTAINERS} arrays and objects")
    if opens + (len(skeleton) - len(brackets)) + 1 > MAX_VALUES:
        raise _limit(f"the body has more than {MAX_VALUES} values")


def _lone_surrogate(value: Any) -> str | None:
    """The path of the first string (or key) of ``value`` holding a lone surrogate
    (walked with a stack: the shape check bounds it), else None."""
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, v = todo.pop()
        items: Any = ()
        if isinstance(v, str) and not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(v, dict):
            items = v.items()
        elif isinstance(v, list):
            items = enumerate(v)
        for k, item in items:
            where = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and not k.isascii():
                todo.append((where, k))
            todo.append((where, item))
    return None


def parse_json(raw: bytes) -> Any:
    """The JSON value of ``raw`` within the gateway's bounds (400 naming the one passed)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("Bad Request: the body is not UTF-8 JSON") from None
    _check_shape(raw)
    try:
        value = json.loads(text, parse_float=_number, parse_constant=_constant)
    except _NotFinite as exc:
        raise _limit(f"numbers must be finite: {str(exc)[:40]} is not") from None
    except ValueError:
        raise bad_request("Bad Request: the body is not JSON") from None
    if _SURROGATE_ESCAPE.search(raw) and (path := _lone_surrogate(value)) is not None:
        message = "a string holds a lone surrogate escape (not Unicode text)"
        raise bad_request(
            f"Bad Request: {message} ({path})", [issue("invalid_format", path, message)]
        )
    return value


# ---------------------------------------------------------------- integers

_RANGES = {
    descriptor.FieldDescriptor.TYPE_INT32: (-(2**31), INT32_MAX),
    descriptor.FieldDescriptor.TYPE_SINT32: (-(2**31), INT32_MAX),
    descriptor.FieldDescriptor.TYPE_SFIXED32: (-(2**31), INT32_MAX),
    descriptor.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    descriptor.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    descriptor.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    descriptor.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_DURATION = "google.protobuf.Duration"


def _field(name: str) -> descriptor.FieldDescriptor:
    """``"StartCrawlRequest.limit"`` -> its descriptor in ``pagesift.v1`` (KeyError if none)."""
    message, _, field = name.partition(".")
    return jobs_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]


def int_range(name: str) -> tuple[int, int]:
    """The values the proto integer field ``name`` (``"GetJobRequest.skip"``) holds; a
    Duration field's in milliseconds."""
    f = _field(name)
    if f.message_type is not None and f.message_type.full_name == _DURATION:
        return -DURATION_MAX_MS, DURATION_MAX_MS
    if f.type not in _RANGES:
        raise TypeError(f"{name} is not an integer or a Duration field")
    return _RANGES[f.type]


@dataclass(frozen=True)
class Bound(at.GroupedMetadata):
    """The bound of an integer field, as ``Annotated[int, Bound(...)]`` metadata: the
    proto ``fields`` it lands in (``()``: none, the gateway's own, ``why``) and the
    ``[low, high]`` its model accepts (pydantic reads it as ``ge``/``le``)."""

    fields: tuple[str, ...]
    low: int
    high: int
    why: str = ""

    def __iter__(self) -> Iterator[at.BaseMetadata]:
        yield at.Ge(self.low)
        yield at.Le(self.high)


def _bounded(fields: tuple[str, ...], low: int, high: int | None, why: str = "") -> Bound:
    top = min(int_range(f)[1] for f in fields) if fields else None
    high = top if high is None else high
    if high is None:
        raise TypeError("an integer of the gateway's own needs a high bound")
    for f in fields:
        lo, hi = int_range(f)
        if not lo <= low <= high <= hi:
            raise TypeError(f"[{low}, {high}] does not fit {f} ([{lo}, {hi}])")
    return Bound(fields, low, high, why)


def proto_int(*fields: str, low: int = 0, high: int | None = None) -> Bound:
    """``Annotated[int, proto_int(...)]``: an ``int`` of ``[low, high]`` that lands in the
    proto integer ``fields`` (``high`` defaults to the narrowest field's most)."""
    return _bounded(fields, low, high)


def proto_millis(*fields: str, low: int = 0, high: int | None = None) -> Bound:
    """Milliseconds of ``[low, high]`` that land in the Duration ``fields``."""
    for f in fields:
        message = _field(f).message_type
        if message is None or message.full_name != _DURATION:
            raise TypeError(f"{f} is not a google.protobuf.Duration")
    return _bounded(fields, low, high)


def gateway_int(low: int, high: int, why: str) -> Bound:
    """An ``int`` of ``[low, high]`` that no proto field carries (``why``: what uses it)."""
    return _bounded((), low, high, why)
