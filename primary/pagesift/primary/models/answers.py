"""Whether a model's answer is valid: parsed as JSON and checked against the schema (pure).

What it owns
------------
``judge(text, schema)``: the answer's object when it is one JSON object (or, for a
schema whose top level is not an object, a JSON value; raw control characters inside
strings are accepted, as llama.cpp's grammars let them through) valid under the request's
schema by the reference validator (``jsonschema``, draft 2020-12, format assertions
off), else ``Invalid`` with a one-line reason the retry quotes back (``prompts``).
Answers over ``MAX_ANSWER_CHARS`` are refused unparsed.

Why it is safe
--------------
A model is an untrusted peer: its text is parsed by the standard library's JSON
parser, bounded in size, and nothing of it is kept unless it validates. Validation is
the same function for a fresh answer and a retried one, so no invalid object is ever
stored as a page's ``json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

__all__ = ["MAX_ANSWER_CHARS", "Invalid", "judge"]

MAX_ANSWER_CHARS = 1_000_000


@dataclass(frozen=True)
class Invalid:
    reason: str


def _strip_fence(text: str) -> str:
    """A ```json fenced block's content (some servers wrap JSON mode answers)."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```"):
        body = body[3:-3]
        if body.startswith("json"):
            body = body[4:]
    return body.strip()


def judge(text: str, schema: Mapping[str, Any]) -> Any | Invalid:
    """The valid value of ``text`` under ``schema``, or why it is not one."""
    if len(text) > MAX_ANSWER_CHARS:
        return Invalid(f"the answer is {len(text)} characters, over {MAX_ANSWER_CHARS}")
    try:
        # strict=False: a grammar-constrained answer may hold raw control characters
        # (a newline) inside a string; the value is re-serialized before it is stored
        value = json.loads(_strip_fence(text), strict=False)
    except json.JSONDecodeError as e:
        return Invalid(f"not JSON ({e.msg} at character {e.pos})")
    except ValueError as e:  # e.g. a number too long to convert
        return Invalid(f"not JSON ({e})")
    except RecursionError:
        return Invalid("nested too deeply")
    try:
        error = best_match(Draft202012Validator(schema).iter_errors(value))
    except RecursionError:
        return Invalid("nested too deeply to check")
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return Invalid(f"at {where}: {error.message[:300]}")
    return value
