"""The ``pagesift`` command line: client subcommands over JobClient, and ``serve``.

This package is the ``pagesift`` console script and ``python -m pagesift.node.cli``.
This entry module assembles the parser from the command modules and runs a command;
it guarantees, for every subcommand:

- ``main(argv)`` returns the exit status and never raises for a user error:
  0 success; 1 a waited/watched job ended failed or cancelled; 2 bad usage, a
  bad config, or a gRPC error (printed to stderr as ``error: <CODE>: <details>``);
  130 interrupted; 141 stdout closed early (``| head``).
- With ``--json`` a command prints exactly one JSON object on stdout (one of the
  ``*_json`` shapes, which tests pin down) and nothing else there; progress bars and
  hints go to stderr.
- Client subcommands take ``--server HOST:PORT`` (repeatable or comma-separated;
  default 127.0.0.1:50051) and fail over as JobClient does.
- Admin subcommands (the replication feature): ``role`` prints each ``--server``'s
  AdminService.Role; ``promote`` promotes exactly one node; ``verify --primary P
  --standby S`` compares both stores' digests at one offset and exits 1 when they
  differ (0 equal, 2 when no common offset could be reached).
- ``token new FILE`` writes a new replication token (mode 600) and never replaces one.

The modules, by concern:

- ``common``: exit statuses, handler signatures, the JSON line, error lines;
- ``args``: argument types and the key/TLS/``--server`` option groups;
- ``jobs``: scrape, batch, crawl, status, watch, errors, cancel, jobs (flags,
  requests, handlers); ``jobview``: their JSON shapes and text lines;
  ``progress``: following a job to its end (``JobProgress``, the bar);
- ``admin``: role, promote, verify, with their output;
- ``drill``: ``drill``, a failover rehearsal and its verdict (``pagesift.node.drill``);
- ``backup``: ``backup``, a consistent copy of a node's store as a new data directory;
- ``serve``: ``serve`` and its flag->ServerConfig mapping; ``tokens``: ``token new``.

It lives in the composition root (``pagesift.node``) because ``serve`` starts a node;
the client subcommands import no role (``serve`` imports the server lazily, so a
client command does not load the engine, the store or replication).

Client handlers are ``async def (args, client) -> int`` (the admin commands too:
``JobClient`` holds their AdminService channels); ``serve`` and ``token`` are plain
``def (args) -> int``. Each subparser sets ``handler`` and ``uses_client``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import grpc

from pagesift.node.cli.admin import add_admin_commands
from pagesift.node.cli.args import server_addresses
from pagesift.node.cli.backup import add_backup_command
from pagesift.node.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    ClientHandler,
    SyncHandler,
    fail,
    report,
)
from pagesift.node.cli.drill import add_drill_command
from pagesift.node.cli.jobs import add_job_commands
from pagesift.node.cli.serve import add_serve_command
from pagesift.node.cli.tokens import add_token_command
from pagesift.shared.client import ClientError, JobClient

__all__ = ["amain", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagesift", description="Durable web-scraping jobs over gRPC."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_job_commands(sub)
    add_serve_command(sub)
    add_token_command(sub)
    add_admin_commands(sub)
    add_drill_command(sub)
    add_backup_command(sub)
    return parser


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


async def amain(argv: Sequence[str] | None = None) -> int:
    """``main`` for callers already inside an event loop (client subcommands only)."""
    args = _parse(argv)
    if isinstance(args, int):
        return args
    if not args.uses_client:
        return fail(f"{args.command} cannot run inside an event loop")
    try:
        return await _run_client(args)
    except (grpc.RpcError, ClientError) as err:
        return report(err)


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
        return report(err)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `pagesift status JOB | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return EXIT_BROKEN_PIPE
