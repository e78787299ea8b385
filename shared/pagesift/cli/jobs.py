"""The job subcommands: ``scrape``, ``batch``, ``crawl``, ``status``, ``watch``,
``errors``, ``cancel``, ``resume``, ``jobs`` and ``map`` (and ``export``, from ``export``;
``extract`` and ``crawl-preview``, from ``structured``, with these scrape options).

Owns their flags (``add_job_commands``; the rendering ones are ``render``'s, which
also writes ``scrape --format screenshot --out FILE``; the selector and model formats'
are ``structured``'s), the requests built from those flags
(``scrape_options``, ``batch_request``, ``crawl_request``; ``--format`` is checked
while parsing), and their handlers. Each handler is ``async def (args, client) ->
int`` and sends its calls through the ``JobClient`` it is given (which fails over);
what it prints comes from ``jobview`` (and ``progress`` for ``--wait``).

A document printed whole (``scrape --json``, ``status``/``watch --json --full``,
``export``) is ``jobview.document_dict``: every field of the message. ``status
--all`` prints page by page as GetJob returns them (its ``--json`` object is written
as it goes), so it never holds the job's documents either.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagesift.cli.args import client_parent, nonneg_float, nonneg_int, pair
from pagesift.cli.common import EXIT_OK, dump, enum_name, fail
from pagesift.cli.export import (
    ExportTarget,
    add_export_command,
    add_export_flags,
    export_after_wait,
    export_requested,
)
from pagesift.cli.jobview import (
    document_json,
    document_line,
    errors_json,
    errors_lines,
    job_json,
    jobs_json,
    jobs_line,
    state_name,
    status_lines,
    watch_json,
    watch_line,
)
from pagesift.cli.progress import JobProgress, wait_for_job
from pagesift.cli.render import (
    add_render_flags,
    apply_render_flags,
    save_screenshot,
    screenshot_line,
)
from pagesift.cli.structured import (
    add_structured_commands,
    add_structured_flags,
    apply_structured_flags,
)
from pagesift.client import JobClient
from pagesift.v1 import jobs_pb2

FORMATS: dict[str, jobs_pb2.Format.ValueType] = {
    "markdown": jobs_pb2.FORMAT_MARKDOWN,
    "html": jobs_pb2.FORMAT_HTML,
    "raw_html": jobs_pb2.FORMAT_RAW_HTML,
    "links": jobs_pb2.FORMAT_LINKS,
    "images": jobs_pb2.FORMAT_IMAGES,
    "change_tracking": jobs_pb2.FORMAT_CHANGE_TRACKING,
    "screenshot": jobs_pb2.FORMAT_SCREENSHOT,
    "json": jobs_pb2.FORMAT_JSON,
    "summary": jobs_pb2.FORMAT_SUMMARY,
    "selectors": jobs_pb2.FORMAT_SELECTORS,
}
_DOC_FIELD = {"selectors": "selected"}  # the Document field a format prints, else its name
SITEMAP_MODES: dict[str, jobs_pb2.SitemapMode.ValueType] = {
    "include": jobs_pb2.SITEMAP_MODE_INCLUDE,
    "skip": jobs_pb2.SITEMAP_MODE_SKIP,
    "only": jobs_pb2.SITEMAP_MODE_ONLY,
}


# ---------------------------------------------------------------- request builders


def parse_formats(values: Sequence[str] | None) -> list[jobs_pb2.Format.ValueType]:
    """``["markdown,links", "html"]`` -> the Format enums, deduplicated, in order."""
    out: list[jobs_pb2.Format.ValueType] = []
    for value in values or []:
        for name in value.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in FORMATS:
                raise argparse.ArgumentTypeError(
                    f"invalid format {name!r} (choose from {', '.join(FORMATS)})"
                )
            if FORMATS[name] not in out:
                out.append(FORMATS[name])
    return out


def scrape_options(args: argparse.Namespace) -> jobs_pb2.ScrapeOptions:
    options = jobs_pb2.ScrapeOptions(
        formats=parse_formats(args.format),
        only_main_content=args.only_main_content,
        allow_non_html=args.allow_non_html,
        headers=dict(args.header),
        cookies=dict(args.cookie),
        user_agent=args.user_agent,
        skip_tls_verification=args.skip_tls_verification,
        proxy=args.proxy,
        proxy_url=args.proxy_url,
        ignore_robots_txt=args.ignore_robots_txt,
        include_tags=args.include_tag,
        exclude_tags=args.exclude_tag,
        remove_base64_images=args.remove_base64_images,
        change_tracking_diff=args.diff,
    )
    if args.timeout is not None:
        options.timeout.FromNanoseconds(int(args.timeout * 1e9))
    if args.max_age is not None:
        options.max_age.FromNanoseconds(int(args.max_age * 1e9))
    apply_render_flags(options, args)
    apply_structured_flags(options, args)
    return options


def batch_request(args: argparse.Namespace) -> jobs_pb2.StartBatchScrapeRequest:
    return jobs_pb2.StartBatchScrapeRequest(
        urls=args.urls,
        options=scrape_options(args),
        max_concurrency=args.concurrency,
        idempotency_key=args.idempotency_key or "",
        ignore_invalid_urls=args.ignore_invalid,
    )


def crawl_request(args: argparse.Namespace) -> jobs_pb2.StartCrawlRequest:
    return jobs_pb2.StartCrawlRequest(
        url=args.url,
        limit=args.limit,
        max_depth=args.max_depth,
        include_paths=args.include,
        exclude_paths=args.exclude,
        allow_subdomains=args.allow_subdomains,
        allow_external_links=args.allow_external,
        ignore_query_parameters=args.ignore_query,
        crawl_entire_domain=args.crawl_entire_domain,
        regex_on_full_url=args.regex_on_full_url,
        sitemap=SITEMAP_MODES[args.sitemap],
        max_concurrency=args.concurrency,
        delay=args.delay,
        options=scrape_options(args),
        idempotency_key=args.idempotency_key or "",
        prompt=args.prompt,
    )


# ---------------------------------------------------------------- handlers


async def _cmd_scrape(args: argparse.Namespace, client: JobClient) -> int:
    formats = parse_formats(args.format) or [jobs_pb2.FORMAT_MARKDOWN]
    if args.out is not None and jobs_pb2.FORMAT_SCREENSHOT not in formats:
        return fail("--out FILE (the image) goes with --format screenshot")
    doc = await client.scrape(args.url, scrape_options(args))
    if args.out is not None:
        save_screenshot(doc, args.out)
    if args.json:
        dump(document_json(doc, full=True))
        return EXIT_OK
    engine = enum_name(jobs_pb2.FetchEngine.DESCRIPTOR, doc.engine, "FETCH_ENGINE_")
    print(f"{doc.status_code} {doc.final_url or doc.url}  {doc.title}  [{engine}]", file=sys.stderr)
    for fmt in formats:
        name = next(n for n, f in FORMATS.items() if f == fmt)
        if fmt == jobs_pb2.FORMAT_SCREENSHOT:  # the bytes go to --out, never to a terminal
            where = f" -> {args.out}" if args.out is not None else " (--out FILE writes it)"
            print(screenshot_line(doc) + where, file=sys.stderr)
            continue
        if len(formats) > 1:
            print(f"==> {name} <==")
        if fmt == jobs_pb2.FORMAT_LINKS:
            print("\n".join(doc.links))
        elif fmt == jobs_pb2.FORMAT_IMAGES:
            print("\n".join(doc.images))
        elif fmt == jobs_pb2.FORMAT_CHANGE_TRACKING:
            print(enum_name(jobs_pb2.ChangeStatus.DESCRIPTOR, doc.change_status, "CHANGE_STATUS_"))
        else:
            print(getattr(doc, _DOC_FIELD.get(name, name)))
    return EXIT_OK


async def _follow_started(
    args: argparse.Namespace,
    client: JobClient,
    job_id: str,
    extra: dict[str, Any],
    target: ExportTarget | None,
    *,
    note_on_failure: bool = False,
) -> int:
    """What ``batch`` and ``crawl`` do once their job started (its id already printed
    in text mode): without ``--wait``, the JSON id; with it, follow the job and print
    its summary (or its JSON), ``extra`` added to either JSON object. With ``--export
    DIR`` / ``--jsonl`` (which imply ``--wait``), export the ended job's documents too
    (the JSON object gains ``"export"``)."""
    if not args.wait and target is None:
        if args.json:
            dump({"id": job_id, **extra})
        return EXIT_OK
    progress = await wait_for_job(client, job_id, show_progress=not args.json)
    if not args.json:
        summary_out = sys.stderr if target is not None and target.to_stdout else sys.stdout
        print(progress.summary(), file=summary_out)
        if note_on_failure and progress.state == jobs_pb2.JOB_STATE_FAILED:
            note = (await client.get_job(job_id, status_only=True)).note
            if note:
                print(f"note: {note}", file=summary_out)
    if target is not None:
        exported = await export_after_wait(args, client, job_id, target)
        if isinstance(exported, int):
            return exported
        extra = {**extra, "export": exported}
    if args.json:
        dump({**progress.as_json(), **extra})
    return progress.exit_code()


def _id_stream(args: argparse.Namespace) -> Any:
    """Where ``batch``/``crawl`` print the new job's id: stdout, unless the documents
    go there (``--jsonl`` without ``--out``)."""
    return sys.stderr if args.jsonl and args.out is None else sys.stdout


async def _cmd_batch(args: argparse.Namespace, client: JobClient) -> int:
    target = export_requested(args)  # checked before the job starts
    if isinstance(target, int):
        return target
    resp = await client.start_batch(batch_request(args))
    invalid = list(resp.invalid_urls)
    if not args.json:
        print(resp.id, file=_id_stream(args))
        for url in invalid:
            print(f"skipped invalid URL: {url}", file=sys.stderr)
    return await _follow_started(args, client, resp.id, {"invalid_urls": invalid}, target)


async def _cmd_crawl(args: argparse.Namespace, client: JobClient) -> int:
    target = export_requested(args)  # checked before the job starts
    if isinstance(target, int):
        return target
    job_id = await client.start_crawl(crawl_request(args))
    if not args.json:
        print(job_id, file=_id_stream(args))
    return await _follow_started(args, client, job_id, {}, target, note_on_failure=True)


async def _cmd_map(args: argparse.Namespace, client: JobClient) -> int:
    """``map URL``: one URL a line, or ``{"url", "count", "urls"}`` with ``--json``."""
    found = await client.map(
        args.url,
        limit=args.limit,
        search=args.search,
        sitemap=SITEMAP_MODES[args.sitemap],
        include_paths=args.include,
        exclude_paths=args.exclude,
        allow_subdomains=args.allow_subdomains,
        ignore_query_parameters=args.ignore_query,
    )
    if args.json:
        dump({"url": args.url, "count": len(found), "urls": found})
        return EXIT_OK
    if found:
        print("\n".join(found))
    else:
        print("no URLs found", file=sys.stderr)
    return EXIT_OK


async def _status_all(args: argparse.Namespace, client: JobClient) -> int:
    """``status --all``: the job from its first page, then every page's documents as
    they come (the ``--json`` object is written in pieces: the same object as
    ``job_json`` with every document and ``next_skip`` null)."""
    first = True
    count = 0
    async for page in client.iter_pages(args.job):
        if first:
            first = False
            head = job_json(page, [], full=args.full)
            del head["documents"], head["next_skip"]
            if args.json:
                text = json.dumps(head, ensure_ascii=False)
                sys.stdout.write(text[:-1] + ', "documents": [')
            else:
                for line in status_lines(page, [], None):
                    print(line)
                print(f"documents: {page.completed}")
        for doc in page.documents:
            if args.json:
                item = json.dumps(document_json(doc, full=args.full), ensure_ascii=False)
                sys.stdout.write((", " if count else "") + item)
            else:
                print(document_line(doc))
            count += 1
    if args.json:
        sys.stdout.write('], "next_skip": null}\n')
        sys.stdout.flush()
    return EXIT_OK


async def _cmd_status(args: argparse.Namespace, client: JobClient) -> int:
    if args.all:
        return await _status_all(args, client)
    job = await client.get_job(args.job)
    docs = list(job.documents)
    next_skip = job.next_skip if job.HasField("next_skip") else None
    if args.json:
        dump(job_json(job, docs, next_skip=next_skip, full=args.full))
        return EXIT_OK
    for line in status_lines(job, docs, next_skip):
        print(line)
    return EXIT_OK


async def _cmd_watch(args: argparse.Namespace, client: JobClient) -> int:
    progress = JobProgress(args.job)
    async for event in client.watch(args.job, from_index=args.from_index):
        progress.update(event)
        if args.json:
            dump(watch_json(event, full=args.full))
        else:
            print(watch_line(event), flush=True)
    return progress.exit_code() if progress.terminal else EXIT_OK


async def _cmd_errors(args: argparse.Namespace, client: JobClient) -> int:
    resp = await client.errors(args.job)
    if args.json:
        dump(errors_json(args.job, resp))
        return EXIT_OK
    for line in errors_lines(resp):
        print(line)
    if not resp.errors and not resp.robots_blocked:
        print("no errors", file=sys.stderr)
    return EXIT_OK


async def _cmd_cancel(args: argparse.Namespace, client: JobClient) -> int:
    state = await client.cancel(args.job)
    if args.json:
        dump({"id": args.job, "state": state_name(state)})
        return EXIT_OK
    print(f"{args.job}: {state_name(state)}")
    return EXIT_OK


async def _cmd_resume(args: argparse.Namespace, client: JobClient) -> int:
    """ResumeJob: a paused job runs again (its quarantine budget reset)."""
    state = await client.resume(args.job)
    if args.json:
        dump({"id": args.job, "state": state_name(state)})
        return EXIT_OK
    print(f"{args.job}: {state_name(state)}")
    return EXIT_OK


async def _cmd_jobs(args: argparse.Namespace, client: JobClient) -> int:
    """Every page of the caller's jobs; with --page-token only the page it names (the
    next page's token then goes to stderr, or into the JSON as next_page_token)."""
    next_token: str | None = None
    if args.page_token is not None:
        page = await client.list_jobs_page(
            active_only=args.active, page_size=args.page_size, page_token=args.page_token
        )
        jobs, next_token = list(page.jobs), page.next_page_token
    else:
        jobs = await client.list_jobs(active_only=args.active, page_size=args.page_size)
    if args.json:
        out = jobs_json(jobs)
        if next_token is not None:
            out["next_page_token"] = next_token
        dump(out)
        return EXIT_OK
    for j in jobs:
        print(jobs_line(j))
    if next_token:
        print(f"next page: --page-token {next_token}", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------- flags


def _formats(value: str) -> str:
    parse_formats([value])  # validates
    return value


def _scrape_options_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--format",
        action="append",
        type=_formats,
        metavar="|".join(FORMATS),
        help="output format; repeat or comma-separate (default markdown)",
    )
    parent.add_argument(
        "--only-main-content", action="store_true", help="drop nav, header, footer, aside"
    )
    parent.add_argument(
        "--allow-non-html", action="store_true", help="keep non-HTML bodies as raw text"
    )
    parent.add_argument(
        "--header",
        action="append",
        default=[],
        type=pair(":"),
        metavar="'NAME: VALUE'",
        help="send a header (repeat)",
    )
    parent.add_argument(
        "--cookie",
        action="append",
        default=[],
        type=pair("="),
        metavar="NAME=VALUE",
        help="send a cookie (repeat)",
    )
    parent.add_argument("--user-agent", default="", metavar="UA", help="the job's User-Agent")
    parent.add_argument(
        "--timeout", type=nonneg_float, default=None, metavar="S", help="per request, seconds"
    )
    parent.add_argument("--skip-tls-verification", action="store_true")
    parent.add_argument("--proxy", default="", metavar="NAME", help="a server proxy, or 'pool'")
    parent.add_argument("--proxy-url", default="", metavar="URL", help="your own proxy")
    parent.add_argument(
        "--ignore-robots-txt", action="store_true", help="needs the account's permission"
    )
    parent.add_argument(
        "--include-tag",
        action="append",
        default=[],
        metavar="SEL",
        help="keep only elements matching this CSS selector (repeat)",
    )
    parent.add_argument(
        "--exclude-tag",
        action="append",
        default=[],
        metavar="SEL",
        help="remove elements matching this CSS selector (repeat)",
    )
    parent.add_argument(
        "--remove-base64-images",
        action="store_true",
        help='drop <img src="data:..."> before conversion',
    )
    parent.add_argument(
        "--max-age", type=nonneg_float, default=None, metavar="S", help="a cached copy this fresh"
    )
    parent.add_argument(
        "--diff", action="store_true", help="with --format change_tracking: the markdown diff"
    )
    add_render_flags(parent)
    add_structured_flags(parent)
    return parent


def add_job_commands(sub: Any) -> None:
    """The job subcommands, each with the ``--server`` and key flags."""
    client = client_parent()
    opts = _scrape_options_parent()

    p = sub.add_parser("scrape", parents=[client, opts], help="scrape one page now")
    p.add_argument("url")
    p.add_argument(
        "--json", action="store_true", help="print the whole document as JSON (every field)"
    )
    p.add_argument(
        "--out", type=Path, metavar="FILE", help="with --format screenshot: write the image here"
    )
    p.set_defaults(handler=_cmd_scrape, uses_client=True)

    p = sub.add_parser("batch", parents=[client, opts], help="start a batch-scrape job")
    p.add_argument("urls", nargs="+", metavar="URL")
    p.add_argument("--concurrency", type=nonneg_int, default=0, metavar="N")
    p.add_argument("--ignore-invalid", action="store_true", help="skip invalid URLs")
    p.add_argument("--idempotency-key", metavar="KEY", help="default: a fresh uuid4")
    p.add_argument("--wait", action="store_true", help="follow the job to its end")
    add_export_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_batch, uses_client=True)

    p = sub.add_parser("crawl", parents=[client, opts], help="start a crawl job")
    p.add_argument("url")
    p.add_argument("--limit", type=nonneg_int, default=0, metavar="N")
    p.add_argument("--max-depth", type=nonneg_int, default=0, metavar="D")
    p.add_argument("--include", action="append", default=[], metavar="RE")
    p.add_argument("--exclude", action="append", default=[], metavar="RE")
    p.add_argument(
        "--regex-on-full-url",
        action="store_true",
        help="--include/--exclude match the whole URL, not its path",
    )
    p.add_argument(
        "--crawl-entire-domain",
        action="store_true",
        help="crawl the whole site (default: stay under the start URL's path)",
    )
    p.add_argument("--allow-subdomains", action="store_true")
    p.add_argument("--allow-external", action="store_true")
    p.add_argument("--ignore-query", action="store_true")
    p.add_argument("--sitemap", choices=list(SITEMAP_MODES), default="include")
    p.add_argument("--concurrency", type=nonneg_int, default=0, metavar="N")
    p.add_argument("--delay", type=nonneg_float, default=0.0, metavar="S")
    p.add_argument("--prompt", default="", metavar="TEXT", help="crawl options in words (model)")
    p.add_argument("--idempotency-key", metavar="KEY", help="default: a fresh uuid4")
    p.add_argument("--wait", action="store_true", help="follow the job to its end")
    add_export_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_crawl, uses_client=True)

    p = sub.add_parser("map", parents=[client], help="list a site's URLs (nothing stored)")
    p.add_argument("url")
    p.add_argument("--limit", type=nonneg_int, default=0, metavar="N", help="0 = server default")
    p.add_argument("--search", default="", metavar="S", help="URLs containing S come first")
    p.add_argument("--sitemap", choices=list(SITEMAP_MODES), default="include")
    p.add_argument("--include", action="append", default=[], metavar="RE")
    p.add_argument("--exclude", action="append", default=[], metavar="RE")
    p.add_argument("--allow-subdomains", action="store_true")
    p.add_argument("--ignore-query", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_map, uses_client=True)

    p = sub.add_parser("status", parents=[client], help="a job's state and documents")
    p.add_argument("job")
    p.add_argument("--all", action="store_true", help="every page of documents")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: the job's fields and its documents, each by default only "
        "url, final_url and title",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="with --json: each document whole, every field (markdown, html, links, "
        "metadata, ...; pagesift export writes a job to files)",
    )
    p.set_defaults(handler=_cmd_status, uses_client=True)

    p = sub.add_parser("watch", parents=[client], help="stream a job's documents live")
    p.add_argument("job")
    p.add_argument("--from", dest="from_index", type=nonneg_int, default=0, metavar="N")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per event (JSON Lines): {index, document} with the "
        "document's url, final_url and title by default, or {state, total, completed, failed}",
    )
    p.add_argument(
        "--full", action="store_true", help="with --json: each document whole, every field"
    )
    p.set_defaults(handler=_cmd_watch, uses_client=True)

    p = sub.add_parser("errors", parents=[client], help="a job's page errors")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_errors, uses_client=True)

    p = sub.add_parser("cancel", parents=[client], help="cancel a running or paused job")
    p.add_argument("job")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_cancel, uses_client=True)

    p = sub.add_parser("resume", parents=[client], help="resume a paused job")
    p.add_argument("job")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_resume, uses_client=True)

    p = sub.add_parser("jobs", parents=[client], help="list jobs, newest first")
    p.add_argument("--active", action="store_true", help="only running jobs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--page-size", type=nonneg_int, default=0, metavar="N", help="jobs per request")
    p.add_argument(
        "--page-token",
        default=None,
        metavar="TOKEN",
        help='print only this page ("" for the first); the next token goes to stderr',
    )
    p.set_defaults(handler=_cmd_jobs, uses_client=True)

    add_export_command(sub)
    add_structured_commands(sub, client, opts, scrape_options)
