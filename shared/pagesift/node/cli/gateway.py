"""``pagesift gateway --listen HOST:PORT --server ADDR[,ADDR]``: the Firecrawl gateway.

Owns the ``gateway`` command: it runs ``pagesift.gateway.server.serve_forever`` (imported
lazily, like ``serve``'s node, so client commands never load aiohttp or pydantic) in
front of the ``--server`` addresses until SIGINT or SIGTERM. A port that cannot be
bound is exit 5.
"""

from __future__ import annotations

import argparse
from typing import Any

from pagesift.node.cli.args import host_port
from pagesift.node.cli.common import EXIT_FAILED, EXIT_OK, fail, server_extra_missing


def _servers(value: str) -> list[str]:
    return [host_port(v) for v in value.split(",") if v.strip()]


def _cmd_gateway(args: argparse.Namespace) -> int:
    missing = server_extra_missing("gateway")
    if missing:
        return fail(missing, exit=EXIT_FAILED)
    from pagesift.gateway.server import serve_forever

    addresses = [a for group in args.server or [["127.0.0.1:50051"]] for a in group]
    try:
        serve_forever(args.listen, list(dict.fromkeys(addresses)))
    except OSError as err:
        return fail(f"gateway: {args.listen}: {err.strerror or err}", exit=EXIT_FAILED)
    return EXIT_OK


def add_gateway_command(sub: Any) -> None:
    p = sub.add_parser("gateway", help="serve Firecrawl's v2 HTTP API in front of a pagesift pair")
    p.add_argument("--listen", type=host_port, default="127.0.0.1:3002", metavar="HOST:PORT")
    p.add_argument(
        "--server",
        type=_servers,
        action="append",
        metavar="ADDR[,ADDR]",
        help="the pair's gRPC addresses (repeatable; default 127.0.0.1:50051)",
    )
    p.set_defaults(handler=_cmd_gateway, uses_client=False)
