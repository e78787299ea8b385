"""``pagesift gateway --listen HOST:PORT --server ADDR[,ADDR]``: the Firecrawl gateway.

Owns the ``gateway`` command: it runs ``pagesift.gateway.server.serve_forever`` (imported
lazily, like ``serve``'s node, so client commands never load aiohttp or pydantic) in
front of the ``--server`` addresses until SIGINT or SIGTERM. Its port takes TLS with
``serve``'s flags (``--tls-cert``/``--tls-key``); the pair is reached as the client
commands reach it (``--tls-ca``; a client certificate, for a pair behind an mTLS proxy,
is ``--client-cert``/``--client-key``, since ``--tls-cert`` names the port's own).
``--trust-forwarded`` reads a proxy's ``Forwarded`` headers for the absolute URLs.
``--cluster etcd://HOST:PORT[,...]/NAME`` (instead of ``--server``) puts it in front of a
cluster of pairs: jobs placed by their sites, found by their ids (``JobClient(cluster=...)``).
``--header-timeout``, ``--idle-timeout``, ``--body-timeout``, ``--max-connections``,
``--max-requests-per-connection`` and ``--max-connections-per-client`` set the port's
connection discipline (``pagesift.core.util.listeners``; defaults: ``ListenerLimits``).
Flags that do not go together are exit 2; a port or a file that cannot be used, exit 5.
"""

from __future__ import annotations

import argparse
import ssl
from typing import Any

from pagesift.cli.args import cluster_url, host_port, nonneg_float, nonneg_int, positive_int
from pagesift.cli.common import EXIT_FAILED, EXIT_OK, fail, server_extra_missing
from pagesift.core.util.connlimits import ListenerLimits


def _servers(value: str) -> list[str]:
    return [host_port(v) for v in value.split(",") if v.strip()]


def _cmd_gateway(args: argparse.Namespace) -> int:
    if bool(args.tls_cert) != bool(args.tls_key):
        return fail("--tls-cert and --tls-key go together")
    if bool(args.client_cert) != bool(args.client_key):
        return fail("--client-cert and --client-key go together")
    missing = server_extra_missing("gateway")
    if missing:
        return fail(missing, exit=EXIT_FAILED)
    from pagesift.gateway.server import Options, serve_forever

    try:
        limits = ListenerLimits(
            header_timeout=args.header_timeout,
            idle_timeout=args.idle_timeout,
            body_timeout=args.body_timeout,
            max_requests=args.max_requests_per_connection,
            max_connections=args.max_connections,
            max_per_client=args.max_connections_per_client,
        )
    except ValueError as err:
        return fail(f"gateway: {err}")
    options = Options(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        client_cert=args.client_cert,
        client_key=args.client_key,
        trust_forwarded=args.trust_forwarded,
        cluster=args.cluster or "",
        cluster_members=args.cluster_members,
        cluster_user=args.cluster_user,
        cluster_password_file=args.cluster_password_file,
        limits=limits,
    )
    default = [] if args.cluster else [["127.0.0.1:50051"]]
    addresses = [a for group in args.server or default for a in group]
    try:
        serve_forever(args.listen, list(dict.fromkeys(addresses)), options)
    except ssl.SSLError as err:
        return fail(f"gateway: TLS: {err}", exit=EXIT_FAILED)
    except ValueError as err:  # a members file that does not parse names its field
        return fail(f"gateway: {err}", exit=EXIT_FAILED)
    except OSError as err:
        where = f"{err.filename}: " if err.filename else f"{args.listen}: "
        return fail(f"gateway: {where}{err.strerror or err}", exit=EXIT_FAILED)
    return EXIT_OK


def add_gateway_command(sub: Any) -> None:
    p = sub.add_parser("gateway", help="serve Firecrawl's v2 HTTP API in front of a pagesift pair")
    p.add_argument("--listen", type=host_port, default="127.0.0.1:3002", metavar="HOST:PORT")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--cluster",
        type=cluster_url,
        metavar="etcd://HOST:PORT/NAME",
        help="a cluster of pairs, by its registry in etcd (instead of --server)",
    )
    where.add_argument(
        "--server",
        type=_servers,
        action="append",
        metavar="ADDR[,ADDR]",
        help="the pair's gRPC addresses (repeatable; default 127.0.0.1:50051)",
    )
    p.add_argument(
        "--cluster-members",
        default="",
        metavar="TOML",
        help="with --cluster: the members file; a registry record that does not verify "
        "against it gets no call",
    )
    p.add_argument("--cluster-user", default="", help="with --cluster: the etcd user to read as")
    p.add_argument(
        "--cluster-password-file", default="", metavar="FILE", help="that etcd user's password"
    )
    p.add_argument("--tls-cert", default="", metavar="PEM", help="TLS certificate for this port")
    p.add_argument("--tls-key", default="", metavar="PEM", help="TLS private key for this port")
    p.add_argument(
        "--tls-ca", default="", metavar="PEM", help="reach the pair with TLS, trusting this CA"
    )
    p.add_argument(
        "--client-cert",
        default="",
        metavar="PEM",
        help="present this client certificate to the pair (mTLS; with --client-key)",
    )
    p.add_argument("--client-key", default="", metavar="PEM", help="its private key")
    p.add_argument(
        "--trust-forwarded",
        action="store_true",
        help="a proxy in front sets Forwarded / X-Forwarded-Proto / X-Forwarded-Host: "
        "use them for the absolute URLs of answers (else they are ignored)",
    )
    _add_limit_flags(p)
    p.set_defaults(handler=_cmd_gateway, uses_client=False)


def _add_limit_flags(p: Any) -> None:
    """The port's connection discipline (``pagesift.core.util.listeners``)."""
    d = ListenerLimits()
    flags: tuple[tuple[str, Any, Any, str], ...] = (
        ("--header-timeout", nonneg_float, d.header_timeout,
         "seconds a request line and headers may take (from connect or first byte)"),
        ("--idle-timeout", nonneg_float, d.idle_timeout,
         "seconds an idle keep-alive connection is kept"),
        ("--body-timeout", nonneg_float, d.body_timeout,
         "seconds a request body may take (408 past it)"),
        ("--max-requests-per-connection", nonneg_int, d.max_requests,
         "requests on one connection before it is closed (0: no limit)"),
        ("--max-connections", positive_int, d.max_connections,
         "open connections at most (cut to what RLIMIT_NOFILE leaves past the reserve)"),
        ("--max-connections-per-client", nonneg_int, d.max_per_client,
         "open connections per client address, IPv6 per /64 (0: no cap)"),
    )  # fmt: skip
    for flag, kind, default, text in flags:
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {default:g})")
