"""What a request asks of the model, checked at submission (``check``, ``permission``).

What it owns
------------
The submission rules of the model formats (``FORMAT_JSON``, ``FORMAT_SUMMARY``) and of
a crawl's ``prompt``: the server has a model endpoint (``model_url``), the account may
use it (``allow_model``), ``ScrapeOptions.json`` is present exactly when FORMAT_JSON
asks for it, its schema is a JSON object of at most ``MAX_SCHEMA_BYTES`` that the
reference validator accepts as a draft 2020-12 schema (``parse_schema``), and its
texts are bounded (``MAX_PROMPT_CHARS``).

Guarantee
---------
A request these rules accept never fails later for its own shape: the runner parses
the schema again with ``parse_schema`` and it cannot raise then. Each refusal is an
``InvalidArgument`` naming the field (``options.json.schema``, ``options.formats[2]``,
``prompt``) or a ``PermissionDenied`` for an account without ``allow_model``; nothing
here writes.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quota
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.validate import InvalidArgument, PermissionDenied
from pagesift.v1 import jobs_pb2

__all__ = [
    "MAX_PROMPT_CHARS",
    "MAX_SCHEMA_BYTES",
    "MODEL_FORMATS",
    "ModelUnanswered",
    "asks_model",
    "check",
    "check_prompt",
    "crawl_prompt",
    "parse_schema",
    "permission",
    "tokens_left",
]

MAX_SCHEMA_BYTES = 64 * 1024
MAX_PROMPT_CHARS = 10_000
MODEL_FORMATS = frozenset({jobs_pb2.FORMAT_JSON, jobs_pb2.FORMAT_SUMMARY})
_NO_ENDPOINT = "needs the server's model endpoint (model_url), and this server has none"


class ModelUnanswered(Exception):
    """The model gave no usable answer where the request needs one at once (a crawl's
    prompt, PreviewCrawlParams): ``code`` is model_unavailable or invalid_answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def asks_model(opts: jobs_pb2.ScrapeOptions) -> bool:
    return any(f in MODEL_FORMATS for f in opts.formats)


def parse_schema(text: str, field: str) -> dict[str, Any]:
    """The JSON schema ``text`` (empty: any object), or ``InvalidArgument`` on ``field``."""
    if not text:
        return {"type": "object"}
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise InvalidArgument(field, f"{len(text.encode())} bytes, at most {MAX_SCHEMA_BYTES}")
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(field, f"not JSON: {e}") from None
    if not isinstance(schema, dict):
        raise InvalidArgument(field, "a JSON schema must be a JSON object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path) or "(root)"
        raise InvalidArgument(field, f"not a valid JSON schema at {where}: {e.message}") from None
    except RecursionError:
        raise InvalidArgument(field, "nested too deeply to check") from None
    return schema


def check_prompt(text: str, field: str, *, required: bool = False) -> None:
    if required and not text.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidArgument(field, f"{len(text)} characters, at most {MAX_PROMPT_CHARS}")


def check(opts: jobs_pb2.ScrapeOptions, config: ServerConfig, field: str = "options") -> None:
    """The model formats' shape on this server (above)."""
    for i, f in enumerate(opts.formats):
        if f in MODEL_FORMATS and not config.model_url:
            raise InvalidArgument(
                f"{field}.formats[{i}]", f"{jobs_pb2.Format.Name(f)} {_NO_ENDPOINT}"
            )
    wants_json = jobs_pb2.FORMAT_JSON in opts.formats
    if wants_json and not opts.HasField("json"):
        raise InvalidArgument(
            f"{field}.json", "FORMAT_JSON needs json (a schema, a prompt or both)"
        )
    if opts.HasField("json") and not wants_json:
        raise InvalidArgument(f"{field}.json", "set only with FORMAT_JSON in formats")
    if opts.HasField("json"):
        json_options(opts.json, f"{field}.json")


def json_options(opts: jobs_pb2.JsonOptions, field: str) -> None:
    if not opts.schema and not opts.prompt.strip():
        raise InvalidArgument(field, "needs a schema, a prompt or both")
    parse_schema(opts.schema, f"{field}.schema")
    check_prompt(opts.prompt, f"{field}.prompt")
    check_prompt(opts.system_prompt, f"{field}.system_prompt")


def permission(opts: jobs_pb2.ScrapeOptions, account: Account, field: str = "options") -> None:
    """``PermissionDenied`` when ``account`` may not use the model formats it asks for."""
    for i, f in enumerate(opts.formats):
        if f in MODEL_FORMATS and not account.allow_model:
            raise PermissionDenied(
                f"{field}.formats[{i}]",
                f"account {account.name!r} may not use the model formats (allow_model)",
            )


def crawl_prompt(prompt: str, config: ServerConfig, account: Account) -> None:
    """A crawl's ``prompt``: bounded, the endpoint present, the account allowed."""
    check_prompt(prompt, "prompt")
    if prompt and not config.model_url:
        raise InvalidArgument("prompt", f"a crawl prompt {_NO_ENDPOINT}")
    if prompt and not account.allow_model:
        raise PermissionDenied(
            "prompt", f"account {account.name!r} may not use the model (allow_model)"
        )


def tokens_left(
    reader: quota.Reader, account: Account, opts: jobs_pb2.ScrapeOptions, now: float
) -> None:
    """At submission: ``quota.LimitExceeded`` (RESOURCE_EXHAUSTED) when the request asks
    the model and the account's day of model tokens is spent."""
    if asks_model(opts):
        hit = quota.token_limit_hit(reader, account, now)
        if hit is not None:
            raise hit
