"""Argument types and the option groups shared by the ``pagesift`` subcommands.

Owns the argparse ``type=`` validators (``pair(":")`` reads ``NAME:VALUE``; a bad
value is a usage error, exit 2, before any handler runs), the ``--api-key``/
``--admin-key``/``--tls-ca``/``--tls-cert``/``--tls-key`` group every command that
talks to a server takes, the repeatable ``--server`` group of the client commands with
``--connect-timeout`` (``add_connect_timeout``), ``--cluster etcd://HOST:PORT[,...]/NAME``
in place of ``--server`` on the job commands (a client of a cluster of pairs,
``JobClient(cluster=...)``), and ``server_addresses`` (those flags flattened, the default
when none were given).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from pagesift.client import DEFAULT_ADDRESS, parse_addresses
from pagesift.core.cluster.registryrules import parse_cluster_url


def host_port(value: str) -> str:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return value.strip()


def cluster_url(value: str) -> str:
    """``etcd://HOST:PORT[,HOST:PORT...]/NAME``, checked."""
    try:
        parse_cluster_url(value.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value.strip()


def _server_list(value: str) -> list[str]:
    return [host_port(v) for v in value.split(",") if v.strip()]


def _int_at_least(value: str, low: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if n < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {n}")
    return n


def nonneg_int(value: str) -> int:
    return _int_at_least(value, 0)


def positive_int(value: str) -> int:
    return _int_at_least(value, 1)


def pair(sep: str) -> Callable[[str], tuple[str, str]]:
    """An argparse type: ``NAME<sep>VALUE`` as a pair (the server validates both)."""

    def parse(value: str) -> tuple[str, str]:
        name, found, rest = value.partition(sep)
        if not found or not name.strip():
            raise argparse.ArgumentTypeError(f"{value!r} is not NAME{sep}VALUE")
        return name.strip(), rest.strip()

    return parse


def nonneg_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return x


#: ``--connect-timeout``'s default, seconds
DEFAULT_CONNECT_TIMEOUT = 3.0


def add_connect_timeout(parser: argparse.ArgumentParser) -> None:
    """``--connect-timeout S``: how long a command waits for a server to be reachable
    (``JobClient.wait_connected``) before it fails with the unreachable exit status."""
    parser.add_argument(
        "--connect-timeout",
        type=nonneg_float,
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="S",
        help=f"seconds to wait for a server to be reachable (default {DEFAULT_CONNECT_TIMEOUT:g}; "
        "0: no wait, the client's ~10 s retries decide)",
    )


def credentials_parent() -> argparse.ArgumentParser:
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
    # pagesift's public port verifies no client certificate (only the replication port,
    # --replication-listen, does: mTLS); these are for a TLS proxy or mesh in front of
    # it that requires one
    parent.add_argument(
        "--tls-cert",
        default="",
        metavar="PEM",
        help="present this client certificate (mTLS; with --tls-key; TLS on, trusting "
        "the system roots without --tls-ca)",
    )
    parent.add_argument(
        "--tls-key", default="", metavar="PEM", help="the client certificate's private key"
    )
    return parent


def client_parent(*, cluster: bool = True) -> argparse.ArgumentParser:
    """``credentials_parent``, ``--server`` (repeatable or comma-separated) and
    ``--connect-timeout``; with ``cluster``, ``--cluster`` instead of ``--server`` (the
    commands about jobs; not those that name a node)."""
    parent = credentials_parent()
    add_connect_timeout(parent)
    where = parent.add_mutually_exclusive_group() if cluster else parent
    if cluster:
        where.add_argument(
            "--cluster",
            type=cluster_url,
            metavar="etcd://HOST:PORT/NAME",
            help="a cluster of pairs, by its registry in etcd (instead of --server): "
            "jobs are placed and found by their ids (needs aetcd: pagesift[cluster])",
        )
    where.add_argument(
        "--server",
        action="append",
        type=_server_list,
        metavar="HOST:PORT",
        help=f"server address; repeat or comma-separate for failover (default {DEFAULT_ADDRESS})",
    )
    return parent


def server_addresses(args: argparse.Namespace) -> list[str]:
    """The ``--server`` values flattened (``[DEFAULT_ADDRESS]`` when none were given)."""
    groups: list[list[str]] = args.server or []
    return parse_addresses([a for group in groups for a in group])
