"""The ``pagesift`` command line: client subcommands over JobClient, and ``serve``.

This module owns argument parsing, the text and JSON output of every client
subcommand, and the mapping from ``serve`` flags to ``ServerConfig``. It
guarantees:

- ``main(argv)`` returns the exit status and never raises for a user error:
  0 success; 1 a waited/watched job ended failed or cancelled; 2 bad usage, a
  bad config, or a gRPC error (printed to stderr as ``error: <CODE>: <details>``);
  130 interrupted; 141 stdout closed early (``| head``).
- With ``--json`` a command prints exactly one JSON object on stdout (built by
  the ``*_json`` functions below, which tests pin down) and nothing else there;
  progress bars and hints go to stderr.
- Client subcommands take ``--server HOST:PORT`` (repeatable or comma-separated;
  default 127.0.0.1:50051) and fail over as JobClient does.
- Admin subcommands (the replication feature): ``role`` prints each ``--server``'s
  AdminService.Role; ``promote`` promotes exactly one node; ``verify --primary P
  --standby S`` compares both stores' digests at one offset and exits 1 when they
  differ (0 equal, 2 when no common offset could be reached).
- ``token new FILE`` writes a new replication token (mode 600) and never replaces one.

Client handlers are ``async def (args, client) -> int`` (the admin commands
too: ``JobClient`` holds their AdminService channels); ``serve`` is a plain
``def (args) -> int``. Each subparser sets ``handler`` and
``uses_client``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from pagesift.shared import tls
from pagesift.shared.client import (
    DEFAULT_ADDRESS,
    ClientError,
    JobClient,
    choose_primary,
    parse_addresses,
)
from pagesift.shared.config import ServerConfig
from pagesift.v1 import jobs_pb2, replication_pb2

__all__ = [
    "EXIT_ERROR",
    "EXIT_JOB_NOT_COMPLETED",
    "EXIT_OK",
    "JobProgress",
    "amain",
    "build_parser",
    "document_json",
    "errors_json",
    "format_rpc_error",
    "job_json",
    "jobs_json",
    "main",
    "promote_json",
    "role_json",
    "verify_json",
]

EXIT_OK = 0
EXIT_JOB_NOT_COMPLETED = 1
EXIT_DIGESTS_DIFFER = 1  # verify: both digests taken at one offset, and they differ
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports it

FORMATS: dict[str, jobs_pb2.Format.ValueType] = {
    "markdown": jobs_pb2.FORMAT_MARKDOWN,
    "html": jobs_pb2.FORMAT_HTML,
    "raw_html": jobs_pb2.FORMAT_RAW_HTML,
    "links": jobs_pb2.FORMAT_LINKS,
}
SITEMAP_MODES: dict[str, jobs_pb2.SitemapMode.ValueType] = {
    "include": jobs_pb2.SITEMAP_MODE_INCLUDE,
    "skip": jobs_pb2.SITEMAP_MODE_SKIP,
    "only": jobs_pb2.SITEMAP_MODE_ONLY,
}
TERMINAL_STATES = frozenset(
    {jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}
)

ClientHandler = Callable[[argparse.Namespace, JobClient], Awaitable[int]]
SyncHandler = Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------- names and JSON shapes


def state_name(state: jobs_pb2.JobState.ValueType) -> str:
    """``JOB_STATE_COMPLETED`` -> ``"completed"`` (``"unspecified"`` for 0 or unknown)."""
    try:
        name = jobs_pb2.JobState.Name(state)
    except ValueError:
        return "unspecified"
    return name.removeprefix("JOB_STATE_").lower()


def kind_name(kind: jobs_pb2.JobKind.ValueType) -> str:
    """``JOB_KIND_BATCH_SCRAPE`` -> ``"batch_scrape"``, ``JOB_KIND_CRAWL`` -> ``"crawl"``."""
    try:
        name = jobs_pb2.JobKind.Name(kind)
    except ValueError:
        return "unspecified"
    return name.removeprefix("JOB_KIND_").lower()


def timestamp_json(ts: timestamp_pb2.Timestamp, present: bool = True) -> str | None:
    """RFC 3339 UTC (``2026-01-02T03:04:05Z``), or None when the field is unset."""
    if not present or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToJsonString()


def document_json(doc: jobs_pb2.Document, *, full: bool = False) -> dict[str, Any]:
    """``{"url", "final_url", "title"}``; with ``full`` every non-empty field as well."""
    out: dict[str, Any] = {"url": doc.url, "final_url": doc.final_url, "title": doc.title}
    if full:
        out.update(
            status_code=doc.status_code,
            content_type=doc.content_type,
            description=doc.description,
            language=doc.language,
            fetched_at=timestamp_json(doc.fetched_at, doc.HasField("fetched_at")),
        )
        for name in ("markdown", "html", "raw_html"):
            if getattr(doc, name):
                out[name] = getattr(doc, name)
        if doc.links:
            out["links"] = list(doc.links)
    return out


def job_json(
    job: jobs_pb2.GetJobResponse,
    documents: Iterable[jobs_pb2.Document],
    *,
    next_skip: int | None = None,
) -> dict[str, Any]:
    """A job's fields, its documents (url, final_url, title) and where paging goes on."""
    return {
        "id": job.id,
        "kind": kind_name(job.kind),
        "state": state_name(job.state),
        "total": job.total,
        "completed": job.completed,
        "failed": job.failed,
        "created_at": timestamp_json(job.created_at, job.HasField("created_at")),
        "expires_at": timestamp_json(job.expires_at, job.HasField("expires_at")),
        "note": job.note,
        "documents": [document_json(d) for d in documents],
        "next_skip": next_skip,
    }


def errors_json(job_id: str, resp: jobs_pb2.GetJobErrorsResponse) -> dict[str, Any]:
    return {
        "id": job_id,
        "errors": [
            {
                "url": e.url,
                "code": e.code,
                "message": e.message,
                "time": timestamp_json(e.time, e.HasField("time")),
            }
            for e in resp.errors
        ],
        "robots_blocked": list(resp.robots_blocked),
    }


def jobs_json(jobs: Iterable[jobs_pb2.JobSummary]) -> dict[str, Any]:
    return {
        "jobs": [
            {
                "id": j.id,
                "kind": kind_name(j.kind),
                "state": state_name(j.state),
                "total": j.total,
                "completed": j.completed,
                "created_at": timestamp_json(j.created_at, j.HasField("created_at")),
            }
            for j in jobs
        ]
    }


def role_name(role: replication_pb2.NodeRole.ValueType) -> str:
    """``NODE_ROLE_STANDBY`` -> ``"standby"`` (``"unspecified"`` for 0 or unknown)."""
    try:
        name = replication_pb2.NodeRole.Name(role)
    except ValueError:
        return "unspecified"
    return name.removeprefix("NODE_ROLE_").lower()


def role_json(address: str, resp: replication_pb2.RoleResponse) -> dict[str, Any]:
    """One node's replication state, as ``pagesift role --json`` prints it."""
    return {
        "address": address,
        "node_id": resp.node_id,
        "role": role_name(resp.role),
        "epoch": resp.epoch,
        "history_id": resp.history_id,
        "applied_offset": resp.applied_offset,
        "primary_offset": resp.primary_offset,
        "lag_offsets": resp.lag_offsets,
        "lag_seconds": round(resp.lag_seconds, 3),
        "peer": resp.peer,
        "connected": resp.connected,
        "sync_degraded": resp.sync_degraded,
        "full_resyncs": resp.full_resyncs,
        "continues": resp.continues,
        "discarded": resp.discarded,
    }


def promote_json(address: str, resp: replication_pb2.PromoteResponse) -> dict[str, Any]:
    return {
        "address": address,
        "epoch": resp.epoch,
        "history_id": resp.history_id,
        "switch_offset": resp.switch_offset,
        "already_primary": resp.already_primary,
    }


def verify_json(
    primary: str,
    standby: str,
    *,
    equal: bool,
    offset: int,
    primary_digest: str,
    standby_digest: str,
) -> dict[str, Any]:
    return {
        "equal": equal,
        "offset": offset,
        "primary": {"address": primary, "digest": primary_digest},
        "standby": {"address": standby, "digest": standby_digest},
    }


def format_rpc_error(err: grpc.RpcError) -> str:
    """``error: NOT_FOUND: no job abc`` (the one line a gRPC failure prints)."""
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    return f"error: {name}: {details or ''}".rstrip()


def _dump(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, ensure_ascii=False, sort_keys=False))


# ---------------------------------------------------------------- progress of a job


@dataclass
class JobProgress:
    """A job's counters as WatchJob events (or a final GetJob) report them.

    ``done`` counts pages finished either way (documents + failures), which is
    what the progress bar fills against ``total``.
    """

    job_id: str
    state: jobs_pb2.JobState.ValueType = jobs_pb2.JOB_STATE_UNSPECIFIED
    total: int = 0
    completed: int = 0
    failed: int = 0
    documents_seen: int = 0
    started: float = field(default_factory=time.monotonic)

    def update(self, event: jobs_pb2.WatchJobResponse) -> None:
        kind = event.WhichOneof("event")
        if kind == "document":
            self.documents_seen += 1
            self.completed = max(self.completed, event.document.index + 1)
        elif kind == "state":
            st = event.state
            self.state = st.state
            self.total, self.completed, self.failed = st.total, st.completed, st.failed
        self.total = max(self.total, self.completed + self.failed)

    def update_from_job(self, job: jobs_pb2.GetJobResponse) -> None:
        self.state = job.state
        self.total, self.completed, self.failed = job.total, job.completed, job.failed

    @property
    def done(self) -> int:
        return self.completed + self.failed

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def rate(self, now: float | None = None) -> float:
        """Pages finished per second since the watch began."""
        elapsed = (time.monotonic() if now is None else now) - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.job_id,
            "state": state_name(self.state),
            "completed": self.completed,
            "total": self.total,
            "failed": self.failed,
        }

    def summary(self) -> str:
        return (
            f"{self.job_id}: {state_name(self.state)}, {self.completed} documents, "
            f"{self.failed} failed, {self.total} total"
        )

    def exit_code(self) -> int:
        return EXIT_OK if self.state == jobs_pb2.JOB_STATE_COMPLETED else EXIT_JOB_NOT_COMPLETED


def _progress_bar() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pages"),
        TextColumn("[red]{task.fields[failed]} errors"),
        TextColumn("{task.fields[rate]:.1f} pages/s"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


async def wait_for_job(client: JobClient, job_id: str, *, show_progress: bool) -> JobProgress:
    """Follow WatchJob to the job's terminal state (a live bar on stderr if asked)."""
    progress = JobProgress(job_id)
    try:
        if show_progress:
            with _progress_bar() as bar:
                task = bar.add_task(job_id[:8], total=None, failed=0, rate=0.0)
                async for event in client.watch(job_id):
                    progress.update(event)
                    bar.update(
                        task,
                        completed=progress.done,
                        total=progress.total or None,
                        failed=progress.failed,
                        rate=progress.rate(),
                    )
        else:
            async for event in client.watch(job_id):
                progress.update(event)
    except asyncio.CancelledError:
        print(
            f"interrupted; job {job_id} keeps running (pagesift cancel {job_id})", file=sys.stderr
        )
        raise
    if not progress.terminal:
        progress.update_from_job(await client.get_job(job_id, status_only=True))
    return progress


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
    return jobs_pb2.ScrapeOptions(
        formats=parse_formats(args.format),
        only_main_content=args.only_main_content,
        allow_non_html=args.allow_non_html,
    )


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
        sitemap=SITEMAP_MODES[args.sitemap],
        max_concurrency=args.concurrency,
        delay=args.delay,
        options=scrape_options(args),
        idempotency_key=args.idempotency_key or "",
    )


SERVE_FLAGS = (
    "role",
    "listen",
    "data",
    "primary",
    "allow_private_networks",
    "replication_mode",
    "log_format",
    "job_ttl_seconds",
    "fsync",
    "auto_promote_after",
    "accounts_file",
    "metrics_listen",
    "tls_cert",
    "tls_key",
    "replication_listen",
    "replication_ca",
    "replication_cert",
    "replication_key",
    "replication_token_file",
)


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ServerConfig`` fields the ``serve`` flags set (None: not given on the line)."""
    return {name: getattr(args, name) for name in SERVE_FLAGS}


# ---------------------------------------------------------------- argument types


def _host_port(value: str) -> str:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return value.strip()


def _server_list(value: str) -> list[str]:
    return [_host_port(v) for v in value.split(",") if v.strip()]


def _formats(value: str) -> str:
    parse_formats([value])  # validates
    return value


def _nonneg_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _nonneg_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return x


def server_addresses(args: argparse.Namespace) -> list[str]:
    """The ``--server`` values flattened (``[DEFAULT_ADDRESS]`` when none were given)."""
    groups: list[list[str]] = args.server or []
    return parse_addresses([a for group in groups for a in group])


# ---------------------------------------------------------------- client handlers


async def _cmd_scrape(args: argparse.Namespace, client: JobClient) -> int:
    doc = await client.scrape(args.url, scrape_options(args))
    if args.json:
        _dump(document_json(doc, full=True))
        return EXIT_OK
    formats = parse_formats(args.format) or [jobs_pb2.FORMAT_MARKDOWN]
    print(f"{doc.status_code} {doc.final_url or doc.url}  {doc.title}", file=sys.stderr)
    for fmt in formats:
        name = next(n for n, f in FORMATS.items() if f == fmt)
        if len(formats) > 1:
            print(f"==> {name} <==")
        if fmt == jobs_pb2.FORMAT_LINKS:
            print("\n".join(doc.links))
        else:
            print(getattr(doc, name))
    return EXIT_OK


async def _cmd_batch(args: argparse.Namespace, client: JobClient) -> int:
    resp = await client.start_batch(batch_request(args))
    invalid = list(resp.invalid_urls)
    if not args.json:
        print(resp.id)
        for url in invalid:
            print(f"skipped invalid URL: {url}", file=sys.stderr)
    if not args.wait:
        if args.json:
            _dump({"id": resp.id, "invalid_urls": invalid})
        return EXIT_OK
    progress = await wait_for_job(client, resp.id, show_progress=not args.json)
    if args.json:
        _dump({**progress.as_json(), "invalid_urls": invalid})
    else:
        print(progress.summary())
    return progress.exit_code()


async def _cmd_crawl(args: argparse.Namespace, client: JobClient) -> int:
    job_id = await client.start_crawl(crawl_request(args))
    if not args.wait:
        if args.json:
            _dump({"id": job_id})
        else:
            print(job_id)
        return EXIT_OK
    if not args.json:
        print(job_id)
    progress = await wait_for_job(client, job_id, show_progress=not args.json)
    if args.json:
        _dump(progress.as_json())
    else:
        print(progress.summary())
        if progress.state == jobs_pb2.JOB_STATE_FAILED:
            note = (await client.get_job(job_id, status_only=True)).note
            if note:
                print(f"note: {note}")
    return progress.exit_code()


async def _cmd_status(args: argparse.Namespace, client: JobClient) -> int:
    if args.all:
        job: jobs_pb2.GetJobResponse | None = None
        docs: list[jobs_pb2.Document] = []
        async for page in client.iter_pages(args.job):
            job = page
            docs.extend(page.documents)
        assert job is not None  # iter_pages yields at least one page
        next_skip = None
    else:
        job = await client.get_job(args.job)
        docs = list(job.documents)
        next_skip = job.next_skip if job.HasField("next_skip") else None
    if args.json:
        _dump(job_json(job, docs, next_skip=next_skip))
        return EXIT_OK
    print(f"id:        {job.id}")
    print(f"kind:      {kind_name(job.kind)}")
    print(f"state:     {state_name(job.state)}")
    print(f"progress:  {job.completed}/{job.total} done, {job.failed} failed")
    print(f"created:   {timestamp_json(job.created_at, job.HasField('created_at')) or '-'}")
    print(f"expires:   {timestamp_json(job.expires_at, job.HasField('expires_at')) or '-'}")
    if job.note:
        print(f"note:      {job.note}")
    if docs:
        print(f"documents: {len(docs)}{'' if next_skip is None else ' (more: use --all)'}")
        for doc in docs:
            final = f" -> {doc.final_url}" if doc.final_url and doc.final_url != doc.url else ""
            print(f"  {doc.status_code:3d} {doc.url}{final}  {doc.title}")
    return EXIT_OK


def _watch_line(event: jobs_pb2.WatchJobResponse) -> str:
    if event.WhichOneof("event") == "document":
        d = event.document.document
        final = f" -> {d.final_url}" if d.final_url and d.final_url != d.url else ""
        return f"[{event.document.index}] {d.status_code} {d.url}{final}  {d.title}"
    st = event.state
    return f"state: {state_name(st.state)} ({st.completed}/{st.total} done, {st.failed} failed)"


async def _cmd_watch(args: argparse.Namespace, client: JobClient) -> int:
    progress = JobProgress(args.job)
    async for event in client.watch(args.job, from_index=args.from_index):
        progress.update(event)
        print(_watch_line(event), flush=True)
    return progress.exit_code() if progress.terminal else EXIT_OK


async def _cmd_errors(args: argparse.Namespace, client: JobClient) -> int:
    resp = await client.errors(args.job)
    if args.json:
        _dump(errors_json(args.job, resp))
        return EXIT_OK
    for e in resp.errors:
        if e.url:
            print(f"{e.url}\t{e.code}\t{e.message}")
        else:
            print(f"note: {e.code}: {e.message}")
    if resp.robots_blocked:
        print(f"blocked by robots.txt ({len(resp.robots_blocked)}):")
        for url in resp.robots_blocked:
            print(f"  {url}")
    if not resp.errors and not resp.robots_blocked:
        print("no errors", file=sys.stderr)
    return EXIT_OK


async def _cmd_cancel(args: argparse.Namespace, client: JobClient) -> int:
    state = await client.cancel(args.job)
    print(f"{args.job}: {state_name(state)}")
    return EXIT_OK


async def _cmd_jobs(args: argparse.Namespace, client: JobClient) -> int:
    jobs = await client.list_jobs(active_only=args.active)
    if args.json:
        _dump(jobs_json(jobs))
        return EXIT_OK
    for j in jobs:
        created = timestamp_json(j.created_at, j.HasField("created_at")) or "-"
        print(
            f"{j.id}  {kind_name(j.kind):<12} {state_name(j.state):<10} "
            f"{j.completed}/{j.total}  {created}"
        )
    return EXIT_OK


# ---------------------------------------------------------------- serve


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = ServerConfig.load(args.config, serve_overrides(args))
    except (OSError, ValueError, TypeError) as err:
        print(f"error: config: {err}", file=sys.stderr)
        return EXIT_ERROR
    if config.role not in ("primary", "standby"):
        print(
            f"error: config: role must be primary or standby, not {config.role!r}", file=sys.stderr
        )
        return EXIT_ERROR
    if config.role == "standby" and not config.primary:
        print("error: config: a standby needs --primary HOST:PORT", file=sys.stderr)
        return EXIT_ERROR
    # imported here: the server pulls in the engine, the store and replication
    from pagesift.primary.server import serve

    code: int = serve(config)
    return code


def _cmd_token_new(args: argparse.Namespace) -> int:
    try:
        tls.write_new_token(args.file)
    except FileExistsError:
        print(f"error: {args.file} exists; a pair keeps its token", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:
        print(f"error: {args.file}: {err.strerror or err}", file=sys.stderr)
        return EXIT_ERROR
    print(
        f"wrote a new replication token to {args.file} (mode 600); give both nodes of the "
        f"pair the same file: --replication-token-file {args.file}"
    )
    return EXIT_OK


def _add_token_command(sub: Any) -> None:
    p = sub.add_parser("token", help="replication tokens")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="write a new random replication token to FILE")
    new.add_argument("file", type=Path, metavar="FILE")
    new.set_defaults(handler=_cmd_token_new, uses_client=False)


# ---------------------------------------------------------------- the parser


def _client_parent() -> argparse.ArgumentParser:
    parent = _credentials_parent()
    parent.add_argument(
        "--server",
        action="append",
        type=_server_list,
        metavar="HOST:PORT",
        help=f"server address; repeat or comma-separate for failover (default {DEFAULT_ADDRESS})",
    )
    return parent


def _credentials_parent() -> argparse.ArgumentParser:
    """Keys and TLS, for every command that talks to a server."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--api-key",
        default=os.environ.get("PAGESIFT_API_KEY", ""),
        help="account API key (default: $PAGESIFT_API_KEY)",
    )
    parent.add_argument(
        "--admin-key",
        default=os.environ.get("PAGESIFT_ADMIN_KEY", ""),
        help="admin key for role/promote/verify (default: $PAGESIFT_ADMIN_KEY)",
    )
    parent.add_argument(
        "--tls-ca", default="", metavar="PEM", help="use TLS, trusting this CA certificate"
    )
    return parent


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
    return parent


def _add_client_commands(sub: Any, client: argparse.ArgumentParser) -> None:
    opts = _scrape_options_parent()

    p = sub.add_parser("scrape", parents=[client, opts], help="scrape one page now")
    p.add_argument("url")
    p.add_argument("--json", action="store_true", help="print the document as JSON")
    p.set_defaults(handler=_cmd_scrape, uses_client=True)

    p = sub.add_parser("batch", parents=[client, opts], help="start a batch-scrape job")
    p.add_argument("urls", nargs="+", metavar="URL")
    p.add_argument("--concurrency", type=_nonneg_int, default=0, metavar="N")
    p.add_argument("--ignore-invalid", action="store_true", help="skip invalid URLs")
    p.add_argument("--idempotency-key", metavar="KEY", help="default: a fresh uuid4")
    p.add_argument("--wait", action="store_true", help="follow the job to its end")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_batch, uses_client=True)

    p = sub.add_parser("crawl", parents=[client, opts], help="start a crawl job")
    p.add_argument("url")
    p.add_argument("--limit", type=_nonneg_int, default=0, metavar="N")
    p.add_argument("--max-depth", type=_nonneg_int, default=0, metavar="D")
    p.add_argument("--include", action="append", default=[], metavar="RE")
    p.add_argument("--exclude", action="append", default=[], metavar="RE")
    p.add_argument("--allow-subdomains", action="store_true")
    p.add_argument("--allow-external", action="store_true")
    p.add_argument("--ignore-query", action="store_true")
    p.add_argument("--sitemap", choices=list(SITEMAP_MODES), default="include")
    p.add_argument("--concurrency", type=_nonneg_int, default=0, metavar="N")
    p.add_argument("--delay", type=_nonneg_float, default=0.0, metavar="S")
    p.add_argument("--idempotency-key", metavar="KEY", help="default: a fresh uuid4")
    p.add_argument("--wait", action="store_true", help="follow the job to its end")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_crawl, uses_client=True)

    p = sub.add_parser("status", parents=[client], help="a job's state and documents")
    p.add_argument("job")
    p.add_argument("--all", action="store_true", help="every page of documents")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_status, uses_client=True)

    p = sub.add_parser("watch", parents=[client], help="stream a job's documents live")
    p.add_argument("job")
    p.add_argument("--from", dest="from_index", type=_nonneg_int, default=0, metavar="N")
    p.set_defaults(handler=_cmd_watch, uses_client=True)

    p = sub.add_parser("errors", parents=[client], help="a job's page errors")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_errors, uses_client=True)

    p = sub.add_parser("cancel", parents=[client], help="cancel a running job")
    p.add_argument("job")
    p.set_defaults(handler=_cmd_cancel, uses_client=True)

    p = sub.add_parser("jobs", parents=[client], help="list jobs, newest first")
    p.add_argument("--active", action="store_true", help="only running jobs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_jobs, uses_client=True)


def _add_serve_command(sub: Any) -> None:
    p = sub.add_parser("serve", help="run a server (primary or standby)")
    # Every flag defaults to None so that --config FILE (then the defaults) decide.
    p.add_argument("--role", choices=["primary", "standby"])
    p.add_argument("--listen", type=_host_port, metavar="HOST:PORT")
    p.add_argument("--data", type=Path, metavar="DIR")
    p.add_argument("--primary", type=_host_port, metavar="HOST:PORT")
    p.add_argument("--allow-private-networks", action="store_true", default=None)
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file with a [server] table")
    p.add_argument("--replication-mode", choices=["async", "sync"])
    p.add_argument("--log-format", choices=["text", "json"])
    p.add_argument("--job-ttl", dest="job_ttl_seconds", type=_nonneg_float, metavar="SECONDS")
    p.add_argument("--fsync", action="store_true", default=None)
    p.add_argument(
        "--auto-promote-after",
        type=_nonneg_float,
        metavar="SECONDS",
        help="standby: promote itself after the primary is silent this long "
        "(UNSAFE without an outside witness)",
    )
    p.add_argument("--accounts", dest="accounts_file", metavar="FILE", help="accounts TOML")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="serve /metrics here")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate for the public port")
    p.add_argument("--tls-key", metavar="PEM", help="TLS private key for the public port")
    p.add_argument(
        "--replication-listen", metavar="HOST:PORT", help="primary: mTLS replication port"
    )
    p.add_argument("--replication-ca", metavar="PEM", help="CA for replication mTLS")
    p.add_argument("--replication-cert", metavar="PEM", help="standby: client certificate")
    p.add_argument("--replication-key", metavar="PEM", help="standby: client private key")
    p.add_argument(
        "--replication-token-file", metavar="FILE", help="shared replication token (both nodes)"
    )
    p.set_defaults(handler=_cmd_serve, uses_client=False)


# ---------------------------------------------------------------- admin (replication)


def _role_line(address: str, r: replication_pb2.RoleResponse) -> str:
    lag = f"lag {r.lag_offsets}" + (f" ({r.lag_seconds:.1f}s)" if r.lag_seconds else "")
    if r.role == replication_pb2.NODE_ROLE_PRIMARY:
        peer = f"standby {r.peer or '-'} {'connected' if r.connected else 'not connected'}"
        if r.sync_degraded:
            peer += ", sync DEGRADED to async"
    elif r.role == replication_pb2.NODE_ROLE_STANDBY:
        peer = f"primary {r.peer or '-'} {'connected' if r.connected else 'not connected'}"
    else:
        peer = "deposed by a higher epoch: restart it with --role standby --primary NEW"
    return (
        f"{address}  {role_name(r.role)}  epoch {r.epoch}  offset {r.applied_offset} "
        f"(primary {r.primary_offset}, {lag})  {peer}\n"
        f"  node {r.node_id or '-'}  history {r.history_id or '-'}  "
        f"sessions: {r.full_resyncs} full, {r.continues} continue"
        + (f"  discarded {r.discarded} unreplicated writes" if r.discarded else "")
    )


async def _cmd_role(args: argparse.Namespace, client: JobClient) -> int:
    addresses = server_addresses(args)
    if len(addresses) == 1:
        resp = await client.role(addresses[0])
        if args.json:
            _dump(role_json(addresses[0], resp))
        else:
            print(_role_line(addresses[0], resp))
        return EXIT_OK
    # Several nodes: each one's answer (or error), and which one is the primary.
    results = await asyncio.gather(*(client.role(a) for a in addresses), return_exceptions=True)
    nodes: list[dict[str, Any]] = []
    answers: list[tuple[str, replication_pb2.RoleResponse | None]] = []
    failed = False
    for address, res in zip(addresses, results, strict=True):
        if isinstance(res, replication_pb2.RoleResponse):
            answers.append((address, res))
            nodes.append(role_json(address, res))
            if not args.json:
                print(_role_line(address, res))
            continue
        if not isinstance(res, grpc.RpcError):
            raise res
        failed = True
        answers.append((address, None))
        nodes.append({"address": address, "error": format_rpc_error(res)})
        if not args.json:
            print(f"{address}  {format_rpc_error(res)}")
    primary = choose_primary(answers)
    if args.json:
        _dump({"primary": primary, "nodes": nodes})
    else:
        print(f"primary: {primary or 'none'}")
    return EXIT_ERROR if failed else EXIT_OK


async def _cmd_promote(args: argparse.Namespace, client: JobClient) -> int:
    addresses = server_addresses(args)
    if len(addresses) != 1:
        print("error: promote takes exactly one --server (the standby to promote)", file=sys.stderr)
        return EXIT_ERROR
    resp = await client.promote(addresses[0])
    if args.json:
        _dump(promote_json(addresses[0], resp))
    elif resp.already_primary:
        print(f"{addresses[0]} is already the primary (epoch {resp.epoch})")
    else:
        print(
            f"promoted {addresses[0]}: epoch {resp.epoch}, history {resp.history_id}, "
            f"took over at offset {resp.switch_offset}"
        )
    return EXIT_OK


async def _cmd_verify(args: argparse.Namespace, client: JobClient) -> int:
    # imported here: the standby package pulls in the store and replication code
    from pagesift.standby.admin import verify_digests

    try:
        res = await verify_digests(
            client.admin_stub(args.primary),
            client.admin_stub(args.standby),
            per_call_seconds=args.timeout,
        )
    except TimeoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        _dump(
            verify_json(
                args.primary,
                args.standby,
                equal=res.equal,
                offset=res.offset,
                primary_digest=res.primary_digest,
                standby_digest=res.standby_digest,
            )
        )
    else:
        print(f"offset   {res.offset}")
        print(f"primary  {res.primary_digest}  {args.primary}")
        print(f"standby  {res.standby_digest}  {args.standby}")
        print("equal" if res.equal else "DIFFERENT")
    return EXIT_OK if res.equal else EXIT_DIGESTS_DIFFER


def add_admin_commands(sub: Any, client: argparse.ArgumentParser) -> None:
    """Admin subcommands: ``role``, ``promote``, ``verify`` (the replication feature).

    All three are async client handlers: the ``JobClient`` is only their channel
    pool (``role``/``promote`` name their nodes with ``--server``; ``verify`` with
    ``--primary``/``--standby``), nothing is retried or sent to another node.
    """
    p = sub.add_parser(
        "role", parents=[client], help="a node's replication role, epoch, offsets and lag"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_role, uses_client=True)

    p = sub.add_parser("promote", parents=[client], help="promote a standby to primary")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_promote, uses_client=True)

    p = sub.add_parser(
        "verify",
        help="compare the digests of a primary and its standby at one offset",
        parents=[_credentials_parent()],
    )
    p.add_argument("--primary", type=_host_port, required=True, metavar="HOST:PORT")
    p.add_argument("--standby", type=_host_port, required=True, metavar="HOST:PORT")
    p.add_argument(
        "--timeout",
        type=_nonneg_float,
        default=5.0,
        metavar="S",
        help="seconds each digest may wait for its offset (default 5; six attempts at most)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_verify, uses_client=True, server=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagesift", description="Durable web-scraping jobs over gRPC."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    client = _client_parent()
    _add_client_commands(sub, client)
    _add_serve_command(sub)
    _add_token_command(sub)
    add_admin_commands(sub, client)
    return parser


# ---------------------------------------------------------------- entry points


def _parse(argv: Sequence[str] | None) -> argparse.Namespace | int:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR


async def _run_client(args: argparse.Namespace) -> int:
    handler: ClientHandler = args.handler
    async with JobClient(
        server_addresses(args),
        api_key=args.api_key,
        admin_key=args.admin_key,
        tls_ca=args.tls_ca,
    ) as client:
        return await handler(args, client)


def _report(err: BaseException) -> int:
    if isinstance(err, grpc.RpcError):
        print(format_rpc_error(err), file=sys.stderr)
    else:
        print(f"error: {err}", file=sys.stderr)
    return EXIT_ERROR


async def amain(argv: Sequence[str] | None = None) -> int:
    """``main`` for callers already inside an event loop (client subcommands only)."""
    args = _parse(argv)
    if isinstance(args, int):
        return args
    if not args.uses_client:
        print(f"error: {args.command} cannot run inside an event loop", file=sys.stderr)
        return EXIT_ERROR
    try:
        return await _run_client(args)
    except (grpc.RpcError, ClientError) as err:
        return _report(err)


def main(argv: list[str] | None = None) -> int:
    """The ``pagesift`` console script; returns the exit status (see the module docstring)."""
    try:
        args = _parse(argv)
        if isinstance(args, int):
            return args
        if args.uses_client:
            return asyncio.run(_run_client(args))
        handler: SyncHandler = args.handler
        return handler(args)
    except (grpc.RpcError, ClientError) as err:
        return _report(err)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `pagesift status JOB | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
