"""Structured data on the command line: the flags of the selector and model formats, and
the ``extract`` and ``crawl-preview`` subcommands.

Owns:

- ``add_structured_flags`` / ``apply_structured_flags``: ``--selectors FILE`` (a
  ``SelectorSchema`` in protobuf's JSON mapping: ``baseSelector``, ``fields``,
  ``source``, ... read with ``json_format``), ``--json-schema FILE`` (a JSON Schema,
  sent as its text), ``--json-prompt TEXT`` and ``--json-system-prompt TEXT`` into
  ``ScrapeOptions.selectors`` / ``ScrapeOptions.json`` (``scrape``, ``batch`` and
  ``crawl`` take them with ``--format selectors|json|summary``). A file that cannot be
  read or parsed is a usage error (exit 2) naming it, before any call; the schemas'
  rules are the server's (INVALID_ARGUMENT naming the field, exit 3).
- ``add_structured_commands``: ``extract URL...`` (StartExtract, then GetExtract polled
  until the job ends: its merged object on stdout; ``--no-wait`` prints the id) and
  ``crawl-preview URL --prompt TEXT`` (PreviewCrawlParams: the StartCrawl request the
  words describe, as JSON). ``pagesift.cli.jobs`` registers them with its own flag
  parents and its ``scrape_options`` (handed in: this module imports nothing of
  ``jobs``, which imports it).

The calls go through ``JobClient.call`` with the client's retry classification
(``pagesift.client.retry.is_retryable``); an extract without ``--idempotency-key`` gets
a fresh one, so a retried StartExtract registers one job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from pagesift.cli.args import nonneg_int
from pagesift.cli.common import EXIT_JOB_NOT_COMPLETED, EXIT_OK, dump, fail
from pagesift.cli.jobview import state_name
from pagesift.client import JobClient
from pagesift.client.retry import is_retryable
from pagesift.v1 import jobs_pb2

__all__ = [
    "add_structured_commands",
    "add_structured_flags",
    "apply_structured_flags",
    "extract_request",
    "read_json_schema",
    "read_selector_schema",
]

_ENDED = frozenset({jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED,
                    jobs_pb2.JOB_STATE_CANCELLED, jobs_pb2.JOB_STATE_PAUSED})  # fmt: skip
_POLL_FIRST, _POLL_MAX = 0.25, 2.0  # seconds between GetExtract calls, doubling


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read the {what} {path}: {e}") from None


def read_selector_schema(path: str) -> jobs_pb2.SelectorSchema:
    """``--selectors FILE``: the file's ``SelectorSchema`` (protobuf's JSON mapping)."""
    schema = jobs_pb2.SelectorSchema()
    try:
        json_format.Parse(_read(path, "selector schema"), schema)
    except json_format.ParseError as e:
        raise argparse.ArgumentTypeError(f"{path} is not a selector schema: {e}") from None
    return schema


def read_json_schema(path: str) -> str:
    """``--json-schema FILE``: the file's text, once it is seen to be a JSON object."""
    text = _read(path, "JSON schema")
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{path} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{path} holds no JSON object (a JSON Schema is one)")
    return text


def _json_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json-schema",
        type=read_json_schema,
        metavar="FILE",
        help="a JSON Schema the model's answer must follow (format json; extract)",
    )
    parser.add_argument(
        "--json-prompt", default="", metavar="TEXT", help="what to extract, in words"
    )
    parser.add_argument(
        "--json-system-prompt", default="", metavar="TEXT", help="replaces the server's"
    )


def add_structured_flags(parent: argparse.ArgumentParser) -> None:
    """``--selectors FILE`` and the model formats' flags, on the scrape options' parent."""
    parent.add_argument(
        "--selectors",
        type=read_selector_schema,
        metavar="FILE",
        help="with --format selectors: a selector schema (JSON: baseSelector, fields)",
    )
    _json_flags(parent)


def _json_options(args: argparse.Namespace) -> jobs_pb2.JsonOptions | None:
    if args.json_schema is None and not args.json_prompt and not args.json_system_prompt:
        return None
    return jobs_pb2.JsonOptions(
        schema=args.json_schema or "",
        prompt=args.json_prompt,
        system_prompt=args.json_system_prompt,
    )


def apply_structured_flags(options: jobs_pb2.ScrapeOptions, args: argparse.Namespace) -> None:
    """The flags into ``options``: ``selectors`` and ``json`` when given (unset ones
    leave the fields unset, so the server's pairing rules see what was asked)."""
    if args.selectors is not None:
        options.selectors.CopyFrom(args.selectors)
    asked = _json_options(args)
    if asked is not None:
        options.json.CopyFrom(asked)


# ---------------------------------------------------------------- extract


def extract_request(
    args: argparse.Namespace, options: jobs_pb2.ScrapeOptions
) -> jobs_pb2.StartExtractRequest:
    """``extract``'s request: its URLs, the model options as ``json``, ``options`` (how
    each page is fetched) without formats of its own, and an idempotency key."""
    fetch = jobs_pb2.ScrapeOptions()
    fetch.CopyFrom(options)
    fetch.ClearField("json")
    return jobs_pb2.StartExtractRequest(
        urls=args.urls,
        json=_json_options(args) or jobs_pb2.JsonOptions(),
        options=fetch,
        limit=args.limit,
        idempotency_key=args.idempotency_key or str(uuid.uuid4()),
        ignore_invalid_urls=args.ignore_invalid,
    )


def extract_json(resp: jobs_pb2.GetExtractResponse) -> dict[str, Any]:
    """GetExtract as one JSON object: its fields by proto name, ``data`` parsed."""
    out: dict[str, Any] = json_format.MessageToDict(
        resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    try:
        out["data"] = json.loads(resp.data or "{}")
    except ValueError:
        out["data"] = resp.data  # as the server sent it
    out["state"] = state_name(resp.state)
    return out


async def _poll_extract(client: JobClient, job_id: str, quiet: bool) -> jobs_pb2.GetExtractResponse:
    """GetExtract until the job ends (or is paused); a line on stderr as it moves."""
    req = jobs_pb2.GetExtractRequest(id=job_id)
    delay, shown = _POLL_FIRST, (-1, -1)
    while True:
        resp: jobs_pb2.GetExtractResponse = await client.call(
            lambda s: s.GetExtract(req, timeout=client.timeout),
            retryable=is_retryable("GetExtract"),
        )
        if not quiet and (resp.completed + resp.failed, resp.total) != shown:
            shown = (resp.completed + resp.failed, resp.total)
            print(f"{job_id}: {shown[0]}/{shown[1]} pages", file=sys.stderr)
        if resp.state in _ENDED:
            return resp
        await asyncio.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)


async def _cmd_extract(args: argparse.Namespace, client: JobClient) -> int:
    if args.format or args.selectors is not None:
        return fail("extract sets the formats itself (json): no --format or --selectors")
    req = extract_request(args, args.build_options(args))
    if not req.json.schema and not req.json.prompt:
        return fail("extract needs --json-schema FILE or --json-prompt TEXT (or both)")
    started: jobs_pb2.StartExtractResponse = await client.call(
        lambda s: s.StartExtract(req, timeout=client.timeout),
        retryable=is_retryable("StartExtract", req.idempotency_key),
    )
    invalid = list(started.invalid_urls)
    if not args.json:
        print(started.id, file=sys.stdout if args.no_wait else sys.stderr)
        for url in invalid:
            print(f"skipped invalid URL: {url}", file=sys.stderr)
    if args.no_wait:
        if args.json:
            dump({"id": started.id, "urls": list(started.urls), "invalid_urls": invalid})
        return EXIT_OK
    resp = await _poll_extract(client, started.id, quiet=args.json)
    ok = resp.state == jobs_pb2.JOB_STATE_COMPLETED
    if args.json:
        dump({**extract_json(resp), "invalid_urls": invalid})
    else:
        print(resp.data or "{}")
        if not ok:
            note = f": {resp.note}" if resp.note else ""
            print(f"{started.id} {state_name(resp.state)}{note}", file=sys.stderr)
    return EXIT_OK if ok else EXIT_JOB_NOT_COMPLETED


# ---------------------------------------------------------------- crawl-preview


async def _cmd_crawl_preview(args: argparse.Namespace, client: JobClient) -> int:
    req = jobs_pb2.PreviewCrawlParamsRequest(url=args.url, prompt=args.prompt)
    resp: jobs_pb2.PreviewCrawlParamsResponse = await client.call(
        lambda s: s.PreviewCrawlParams(req, timeout=client.scrape_timeout),
        retryable=is_retryable("PreviewCrawlParams"),
    )
    request = json_format.MessageToDict(resp.request, preserving_proto_field_name=True)
    if args.json:
        usage = json_format.MessageToDict(
            resp.model_usage,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        dump({"request": request, "model_usage": usage})
    else:
        print(json.dumps(request, ensure_ascii=False, indent=2))
    return EXIT_OK


def add_structured_commands(
    sub: Any,
    client: argparse.ArgumentParser,
    options: argparse.ArgumentParser,
    build_options: Callable[[argparse.Namespace], jobs_pb2.ScrapeOptions],
) -> None:
    """``extract`` (with the scrape options' flags, ``options``) and ``crawl-preview``;
    ``client`` is the ``--server`` parent, ``build_options`` turns the flags into a
    ``ScrapeOptions`` (``jobs.scrape_options``)."""
    p = sub.add_parser(
        "extract",
        parents=[client, options],
        help="extract one object from pages with the server's model (StartExtract)",
    )
    p.add_argument("urls", nargs="+", metavar="URL", help='a URL ending in "/*": its site under it')
    p.add_argument("--limit", type=nonneg_int, default=0, metavar="N", help="pages in all (0: 100)")
    p.add_argument("--ignore-invalid", action="store_true", help="skip invalid URLs")
    p.add_argument("--idempotency-key", metavar="KEY", help="default: a fresh uuid4")
    p.add_argument("--no-wait", action="store_true", help="print the job's id and return")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_extract, uses_client=True, build_options=build_options)

    p = sub.add_parser(
        "crawl-preview",
        parents=[client],
        help="the crawl options words describe (PreviewCrawlParams; nothing starts)",
    )
    p.add_argument("url")
    p.add_argument("--prompt", required=True, metavar="TEXT", help="what to crawl, in words")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_crawl_preview, uses_client=True)
