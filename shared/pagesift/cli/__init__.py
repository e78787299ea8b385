# PYTHON_ARGCOMPLETE_OK  (argcomplete's marker: this module completes its own command)
"""The ``pagesift`` command line: client subcommands over JobClient, and ``serve``.

This package is the ``pagesift`` console script and ``python -m pagesift.cli``.
This entry module assembles the parser from the command modules and runs a command;
it guarantees, for every subcommand:

- ``main(argv)`` returns the exit status and never raises for a user error. The
  statuses, by class (``common.EXIT_*``, docs/cli.md, "Exit codes"): 0 success; 1
  the command ran and said no (a waited/watched job ended failed or cancelled,
  ``verify`` unequal, a drill run failed); 2 bad usage (argparse, flags that do not
  go together, a bad ``serve`` config); 3 a server refused (any gRPC status but
  UNAVAILABLE/DEADLINE_EXCEEDED, printed to stderr as ``error: <CODE>: <details>``);
  4 unreachable (no server ready within ``--connect-timeout``, or UNAVAILABLE /
  DEADLINE_EXCEEDED); 5 failed otherwise (a local file, a broken stream); 130
  interrupted; 141 stdout closed early (``| head``).
- Every command takes ``--json``: it prints exactly one JSON object on stdout (one of
  the ``*_json`` shapes, which tests pin down; ``watch``: one per event) and nothing
  else there; progress bars and hints go to stderr. A failure then prints
  ``{"error": {"code", "message", "exit"}}`` on stdout instead of its error line
  (usage errors too, whose usage text still goes to stderr).
- ``pagesift --version``: the installed distribution's version, python's and grpcio's.
- Shell completion: ``argcomplete.autocomplete`` runs on the parser before parsing
  (``eval "$(register-python-argcomplete pagesift)"``).
- Client subcommands take ``--server HOST:PORT`` (repeatable or comma-separated;
  default 127.0.0.1:50051) and fail over as JobClient does; the job commands take
  ``--cluster etcd://HOST:PORT[,...]/NAME`` instead (a client of a cluster of pairs:
  the connect timeout then bounds the registry's first read); before the first call
  they wait at most ``--connect-timeout`` seconds (default 3) for one of them to be
  reachable (``verify``: both), else fail with ``cannot reach ADDR (connect timeout
  S s)`` and exit 4.
- Admin subcommands (the replication feature): ``role`` prints each ``--server``'s
  AdminService.Role; ``promote`` promotes exactly one node; ``verify --primary P
  --standby S`` compares both stores' digests at one offset and exits 1 when they
  differ (0 equal, 2 when no common offset could be reached).
- ``token new FILE`` writes a new replication token (mode 600) and never replaces one.
- ``keys new --name N`` / ``keys hash [KEY]``: an API key and its accounts-file
  snippet, or a key's sha256.

The modules, by concern:

- ``common``: exit statuses, handler signatures, the JSON line, error lines;
- ``args``: argument types and the key/TLS/``--server`` option groups;
- ``jobs``: scrape, batch, crawl, status, watch, errors, cancel, resume, jobs (flags,
  requests, handlers); ``jobview``: their JSON shapes and text lines;
  ``progress``: following a job to its end (``JobProgress``, the bar); ``render``:
  the rendering flags (engine, waits, ``--action``'s syntax) and the screenshot file;
  ``structured``: the selector and model formats' flags (``--selectors``,
  ``--json-schema``, ...) and ``extract``, ``crawl-preview`` (registered by ``jobs``);
- ``admin``: role, promote, verify, with their output;
- ``export``: ``export``, a job's documents as JSON Lines or one file per page;
  ``exportpaths``: the safe relative path of each page's file (pure);
- ``drill``: ``drill``, a failover rehearsal and its verdict (``pagesift.drill``);
- ``backup``: ``backup``, a consistent copy of a node's store as a new data directory;
- ``serve``: ``serve`` and its flag->ServerConfig mapping; ``tokens``: ``token new``;
  ``keys``: ``keys new``, ``keys hash``; ``gateway``: the Firecrawl HTTP gateway;
  ``cluster``: ``cluster status``, the pairs of a cluster (the etcd registry).

The client subcommands import no role: ``serve`` imports the server
(``pagesift.node``) lazily, so a client command does not load the engine, the store or
replication.

Client handlers are ``async def (args, client) -> int`` (the admin commands too:
``JobClient`` holds their AdminService channels); ``serve`` and ``token`` are plain
``def (args) -> int``. Each subparser sets ``handler`` and ``uses_client``; a
client command may set ``single_server`` (why it takes exactly one ``--server``) or
``connect_all`` (the argument names of the addresses that must all be reachable).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn

import argcomplete
import grpc

from pagesift.cli.admin import add_admin_commands
from pagesift.cli.args import server_addresses
from pagesift.cli.backup import add_backup_command
from pagesift.cli.cluster import add_cluster_command
from pagesift.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_USAGE,
    ClientHandler,
    SyncHandler,
    fail,
    json_errors,
    report,
)
from pagesift.cli.drill import add_drill_command
from pagesift.cli.gateway import add_gateway_command
from pagesift.cli.jobs import add_job_commands
from pagesift.cli.keys import add_keys_command
from pagesift.cli.serve import add_serve_command
from pagesift.cli.tokens import add_token_command
from pagesift.client import ClientError, JobClient, Unreachable
from pagesift.client.registryview import ClusterUnavailable

__all__ = ["amain", "build_parser", "main", "version_line"]

#: what a command can end with that ``report`` turns into its exit status
_REPORTED = (grpc.RpcError, ClientError, Unreachable, OSError, ClusterUnavailable)


def version_line() -> str:
    """``pagesift 0.1.0 (python 3.11.9, grpcio 1.85.3)``: the installed distribution's."""
    try:
        version = metadata.version("pagesift")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return f"pagesift {version} (python {platform.python_version()}, grpcio {grpc.__version__})"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors, under ``--json``, also print the JSON
    error object on stdout (the usage text still goes to stderr); exit 2 either way."""

    def error(self, message: str) -> NoReturn:
        if _argv_json:
            self.print_usage(sys.stderr)
            with json_errors(True):
                fail(f"{self.prog}: {message}")
            self.exit(EXIT_USAGE)
        super().error(message)


_argv_json = False  # "--json" is on the command line being parsed (for usage errors)


def _leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that run a command (a subcommand's own subcommands, recursively)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    choices: dict[str, argparse.ArgumentParser] = subs[0].choices
    return [leaf for child in choices.values() for leaf in _leaf_parsers(child)]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pagesift", description="Durable web-scraping jobs over gRPC.")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_job_commands(sub)
    add_serve_command(sub)
    add_token_command(sub)
    add_keys_command(sub)
    add_admin_commands(sub)
    add_drill_command(sub)
    add_backup_command(sub)
    add_gateway_command(sub)
    add_cluster_command(sub)
    for leaf in _leaf_parsers(parser):  # --json on every command (serve: its errors)
        if "--json" not in leaf._option_string_actions:
            leaf.add_argument("--json", action="store_true", help="errors as one JSON object")
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    global _argv_json
    _argv_json = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    finally:
        _argv_json = False


async def _run_client(args: argparse.Namespace) -> int:
    handler: ClientHandler = args.handler
    addresses = server_addresses(args)
    why_one: str | None = getattr(args, "single_server", None)
    if why_one and len(addresses) != 1:
        return fail(f"{args.command} takes exactly one --server ({why_one})")
    must_all: tuple[str, ...] | None = getattr(args, "connect_all", None)
    if bool(args.tls_cert) != bool(args.tls_key):
        return fail("--tls-cert and --tls-key go together")
    cluster: str | None = getattr(args, "cluster", None)
    async with JobClient(
        None if cluster else addresses,
        cluster=cluster,
        api_key=args.api_key,
        admin_key=args.admin_key,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    ) as client:
        if args.connect_timeout > 0:
            if must_all:
                targets = [getattr(args, name) for name in must_all]
                await client.wait_connected(args.connect_timeout, targets, every=True)
            else:
                await client.wait_connected(args.connect_timeout)
        return await handler(args, client)


async def amain(argv: Sequence[str] | None = None) -> int:
    """``main`` for callers already inside an event loop (client subcommands only)."""
    args = _parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    with json_errors(args.json):
        if not args.uses_client:
            return fail(f"{args.command} cannot run inside an event loop")
        try:
            return await _run_client(args)
        except _REPORTED as err:
            return report(err)


def main(argv: list[str] | None = None) -> int:
    """The ``pagesift`` console script; returns the exit status (see the module docstring)."""
    args: Any = None
    try:
        parser = build_parser()
        argcomplete.autocomplete(parser)  # only acts (and exits) when a shell completes
        args = _parse(parser, argv)
        if isinstance(args, int):
            return args
        with json_errors(args.json):
            try:
                if args.uses_client:
                    return asyncio.run(_run_client(args))
                handler: SyncHandler = args.handler
                return handler(args)
            except BrokenPipeError:
                raise
            except (*_REPORTED, KeyboardInterrupt) as err:
                return report(err)
    except KeyboardInterrupt as err:  # while parsing, before --json is known
        return report(err)
    except BrokenPipeError:  # e.g. `pagesift status JOB | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return EXIT_BROKEN_PIPE
