"""``pagesift serve``: run a node (primary or standby) in this process.

Owns the ``serve`` flags and their mapping to ``ServerConfig`` (``serve_overrides``:
every flag defaults to None, so a flag not given leaves ``PAGESIFT_*`` variables, then
``--config FILE``, then the defaults, to decide; pagesift.core.config.settings). A bad config
is reported as one line, ``error: config: KEY (SOURCE): expected ...`` (exit 2), before
anything starts. The server is imported lazily, by the handler only, so the
client subcommands never load the engine, the store or replication.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pagesift.cli.args import host_port, nonneg_float
from pagesift.cli.common import EXIT_FAILED, fail, server_extra_missing
from pagesift.core.cluster.ids import check_pair_name
from pagesift.core.ha.election import MIN_TTL, parse_witness
from pagesift.core.ha.roles import Role

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
    "unsafe_auto_promote",
    "witness",
    "witness_ttl",
    "pair",
    "cluster",
    "witness_user",
    "witness_password_file",
    "advertise",
    "accounts_file",
    "metrics_listen",
    "http_listen",
    "http_trust_forwarded",
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


def _cmd_serve(args: argparse.Namespace) -> int:
    missing = server_extra_missing("serve")
    if missing:  # a client-only install (pip install pagesift): no node here
        return fail(missing, exit=EXIT_FAILED)
    # pydantic (the loader's) is imported here only: the client commands never load it
    from pagesift.core.config.settings import load_config

    try:
        config = load_config(args.config, serve_overrides(args))
    except (OSError, ValueError, TypeError) as err:
        return fail(f"config: {err}")
    if config.role not in (Role.PRIMARY, Role.STANDBY):
        return fail(f"config: role must be primary or standby, not {config.role!r}")
    if config.witness:
        if args.role is not None or args.primary is not None:
            return fail("config: with --witness the lease decides the role: drop --role/--primary")
        try:
            parse_witness(config.witness)
        except ValueError as err:
            return fail(f"config: {err}")
        if config.witness_ttl < MIN_TTL:
            return fail(f"config: witness_ttl must be at least {MIN_TTL} seconds")
        if bool(config.witness_user) != bool(config.witness_password_file):
            return fail("config: witness_user and witness_password_file go together")
        if config.cluster:
            try:
                check_pair_name(config.cluster)
                check_pair_name(config.pair)
            except ValueError as err:
                return fail(f"config: with --cluster: {err}")
    elif config.cluster:
        return fail("config: --cluster needs --witness (the cluster lives in the witness's etcd)")
    elif config.role == "standby" and not config.primary:
        return fail("config: a standby needs --primary HOST:PORT")
    # imported here: the server pulls in both roles, the store and replication, which
    # the client subcommands do without
    from pagesift.node.grpcserver import serve
    from pagesift.primary.engine.reqprofile import ProxyPool

    try:  # checked on a standby too: it may be promoted
        ProxyPool.from_config(config)
    except ValueError as err:
        return fail(f"config: {err}")
    code: int = serve(config)
    return code


def add_serve_command(sub: Any) -> None:
    p = sub.add_parser("serve", help="run a server (primary or standby)")
    # Every flag defaults to None so that --config FILE (then the defaults) decide.
    p.add_argument("--role", choices=[Role.PRIMARY.value, Role.STANDBY.value])
    p.add_argument("--listen", type=host_port, metavar="HOST:PORT")
    p.add_argument("--data", type=Path, metavar="DIR")
    p.add_argument("--primary", type=host_port, metavar="HOST:PORT")
    p.add_argument("--allow-private-networks", action="store_true", default=None)
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file with a [server] table")
    p.add_argument("--replication-mode", choices=["async", "sync"])
    p.add_argument("--log-format", choices=["text", "json"])
    p.add_argument("--job-ttl", dest="job_ttl_seconds", type=nonneg_float, metavar="SECONDS")
    p.add_argument("--fsync", action="store_true", default=None)
    p.add_argument(
        "--auto-promote-after",
        type=nonneg_float,
        metavar="SECONDS",
        help="standby: promote itself after the primary is silent this long "
        "(refused without --witness unless --unsafe-auto-promote)",
    )
    p.add_argument(
        "--unsafe-auto-promote",
        action="store_true",
        default=None,
        help="allow --auto-promote-after with no witness (a cut-off primary keeps writing)",
    )
    p.add_argument(
        "--witness",
        metavar="etcd://HOST:PORT[,HOST:PORT...]",
        help="elect the primary through this etcd (then --role is not needed)",
    )
    p.add_argument(
        "--witness-ttl",
        type=nonneg_float,
        metavar="SECONDS",
        help="the primary's lease in the witness (default 5)",
    )
    p.add_argument("--pair", metavar="NAME", help="this pair's key prefix in the witness")
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="join cluster NAME in the witness's etcd (pagesift cluster status lists it)",
    )
    p.add_argument("--witness-user", metavar="USER", help="etcd user (etcd auth)")
    p.add_argument(
        "--witness-password-file", metavar="FILE", help="that etcd user's password, in a file"
    )
    p.add_argument(
        "--advertise",
        type=host_port,
        metavar="HOST:PORT",
        help="where peers and clients reach this node (default: --listen)",
    )
    p.add_argument("--accounts", dest="accounts_file", metavar="FILE", help="accounts TOML")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="serve /metrics here")
    p.add_argument(
        "--http-listen",
        type=host_port,
        metavar="HOST:PORT",
        help="also serve the Firecrawl HTTP gateway here, in front of this node",
    )
    p.add_argument(
        "--http-trust-forwarded",
        action="store_true",
        default=None,
        help="that gateway reads a proxy's Forwarded headers for its absolute URLs",
    )
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
