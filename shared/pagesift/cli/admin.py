"""The admin subcommands (the replication feature): ``role``, ``promote``, ``verify``.

Owns their flags (``add_admin_commands``), their handlers, and their output: the
text lines and the ``role_json``/``promote_json``/``verify_json`` shapes ``--json``
prints. The handlers are async client handlers, but the ``JobClient`` is only their
channel pool: ``role``/``promote`` name their nodes with ``--server``, ``verify``
with ``--primary``/``--standby``, and nothing is retried or sent to another node.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import grpc

from pagesift.cli.args import (
    add_connect_timeout,
    client_parent,
    credentials_parent,
    host_port,
    nonneg_float,
    server_addresses,
)
from pagesift.cli.common import (
    EXIT_DIGESTS_DIFFER,
    EXIT_FAILED,
    EXIT_OK,
    dump,
    enum_name,
    exit_for_rpc,
    fail,
    format_rpc_error,
)
from pagesift.client import JobClient, choose_primary
from pagesift.core.replication.verify import verify_digests
from pagesift.v1 import replication_pb2

# ---------------------------------------------------------------- output


def role_name(role: replication_pb2.NodeRole.ValueType) -> str:
    """``NODE_ROLE_STANDBY`` -> ``"standby"`` (``"unspecified"`` for 0 or unknown)."""
    return enum_name(replication_pb2.NodeRole.DESCRIPTOR, role, "NODE_ROLE_")


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


def _role_line(address: str, r: replication_pb2.RoleResponse) -> str:
    lag = f"lag {r.lag_offsets}" + (f" ({r.lag_seconds:.1f}s)" if r.lag_seconds else "")
    link = f"{r.peer or '-'} {'connected' if r.connected else 'not connected'}"
    if r.role == replication_pb2.NODE_ROLE_PRIMARY:
        peer = f"standby {link}" + (", sync DEGRADED to async" if r.sync_degraded else "")
    elif r.role == replication_pb2.NODE_ROLE_STANDBY:
        peer = f"primary {link}"
    else:
        peer = "deposed by a higher epoch: restart it with --role standby --primary NEW"
    return (
        f"{address}  {role_name(r.role)}  epoch {r.epoch}  offset {r.applied_offset} "
        f"(primary {r.primary_offset}, {lag})  {peer}\n"
        f"  node {r.node_id or '-'}  history {r.history_id or '-'}  "
        f"sessions: {r.full_resyncs} full, {r.continues} continue"
        + (f"  discarded {r.discarded} unreplicated writes" if r.discarded else "")
    )


# ---------------------------------------------------------------- handlers


async def _cmd_role(args: argparse.Namespace, client: JobClient) -> int:
    addresses = server_addresses(args)
    if len(addresses) == 1:
        resp = await client.role(addresses[0])
        if args.json:
            dump(role_json(addresses[0], resp))
        else:
            print(_role_line(addresses[0], resp))
        return EXIT_OK
    # Several nodes: each one's answer (or error), and which one is the primary.
    results = await asyncio.gather(*(client.role(a) for a in addresses), return_exceptions=True)
    nodes: list[dict[str, Any]] = []
    answers: list[tuple[str, replication_pb2.RoleResponse | None]] = []
    status = EXIT_OK  # a node that did not answer: unreachable beats refused
    for address, res in zip(addresses, results, strict=True):
        if isinstance(res, replication_pb2.RoleResponse):
            answers.append((address, res))
            nodes.append(role_json(address, res))
            if not args.json:
                print(_role_line(address, res))
            continue
        if not isinstance(res, grpc.RpcError):
            raise res
        status = max(status, exit_for_rpc(res))
        answers.append((address, None))
        nodes.append({"address": address, "error": format_rpc_error(res)})
        if not args.json:
            print(f"{address}  {format_rpc_error(res)}")
    primary = choose_primary(answers)
    if args.json:
        dump({"primary": primary, "nodes": nodes})
    else:
        print(f"primary: {primary or 'none'}")
    return status


async def _cmd_promote(args: argparse.Namespace, client: JobClient) -> int:
    addresses = server_addresses(args)  # exactly one (single_server)
    resp = await client.promote(addresses[0])
    if args.json:
        dump(promote_json(addresses[0], resp))
    elif resp.already_primary:
        print(f"{addresses[0]} is already the primary (epoch {resp.epoch})")
    else:
        print(
            f"promoted {addresses[0]}: epoch {resp.epoch}, history {resp.history_id}, "
            f"took over at offset {resp.switch_offset}"
        )
    return EXIT_OK


async def _cmd_verify(args: argparse.Namespace, client: JobClient) -> int:
    try:
        res = await verify_digests(
            client.admin_stub(args.primary),
            client.admin_stub(args.standby),
            per_call_seconds=args.timeout,
        )
    except TimeoutError as err:
        return fail(str(err), exit=EXIT_FAILED)
    if args.json:
        dump(
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


# ---------------------------------------------------------------- flags


def add_admin_commands(sub: Any) -> None:
    """``role`` and ``promote`` (with ``--server``), ``verify`` (with its two nodes)."""
    client = client_parent(cluster=False)  # a node's own calls
    p = sub.add_parser(
        "role", parents=[client], help="a node's replication role, epoch, offsets and lag"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_role, uses_client=True)

    p = sub.add_parser("promote", parents=[client], help="promote a standby to primary")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_promote, uses_client=True, single_server="the standby to promote")

    p = sub.add_parser(
        "verify",
        help="compare the digests of a primary and its standby at one offset",
        parents=[credentials_parent()],
    )
    p.add_argument("--primary", type=host_port, required=True, metavar="HOST:PORT")
    p.add_argument("--standby", type=host_port, required=True, metavar="HOST:PORT")
    p.add_argument(
        "--timeout",
        type=nonneg_float,
        default=5.0,
        metavar="S",
        help="seconds each digest may wait for its offset (default 5; six attempts at most)",
    )
    add_connect_timeout(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(
        handler=_cmd_verify, uses_client=True, server=None, connect_all=("primary", "standby")
    )
