"""``pagesift cluster status --cluster etcd://HOST:PORT[,…]/NAME [--members F] [--json]``.

Owns the ``cluster`` command group. ``status`` reads the registry once
(``pagesift.coord.registry.EtcdRegistry``) and prints each pair: its primary and
standbys, epoch, standby lag, load (running jobs, queued pages, pages/s), capacity, and
what is unhealthy (``pagesift.core.cluster.registryrules.problems``: no primary, no
standby, draining, lagging, a primary's record older than three refreshes: stalled).
With ``--members`` (the cluster's members file, ``pagesift.core.cluster.members``)
it knows the pairs that should exist: a listed pair with no record is shown as
missing, and only records that verify against the file are believed, as clients
believe them. It also asks every etcd endpoint for its own status
(``coord.etcd.Etcd.health``): a member that does not answer, has no leader or raises
an alarm is a problem too. ``--json`` prints one object ``{"cluster", "etcd": [...],
"pairs": [{...}], "placeable": [...]}``. Exit 0 when every pair and etcd member is
healthy, 1 when something has a problem, 4 when etcd does not answer the registry
read, 2 for a bad URL or members file.

What it cannot show: whether a pair runs in failsafe. A primary writes on its
standby's grants exactly when it cannot reach etcd, so its record cannot say so (and
with etcd down this command exits 4); the node's ``pagesift role`` and the gauge
``pagesift_witness_failsafe`` (alert ``PagesiftFailsafe``) do.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from pagesift.cli.common import EXIT_NO, EXIT_OK, EXIT_UNREACHABLE, dump, fail
from pagesift.core.cluster.members import Members, load_members
from pagesift.core.cluster.registryrules import PairView, pair_views, placeable, problems

if TYPE_CHECKING:  # aetcd only where the command runs (coord is imported lazily)
    from pagesift.coord.etcd import EndpointHealth

__all__ = ["MISSING", "add_cluster_command", "etcd_problems", "status_json"]


MISSING = "missing: listed in the members file, no node of it registered (down or stalled)"


def etcd_problems(health: EndpointHealth) -> list[str]:
    """What is wrong with one etcd endpoint, in words (empty: nothing)."""
    if not health.ok:
        return [f"does not answer: {health.error}"]
    out = [] if health.leader_id else ["no raft leader"]
    return out + [f"alarm {a}" for a in health.alarms]


def status_json(
    cluster: str,
    views: dict[str, PairView],
    now: float,
    *,
    expected: Sequence[str] = (),
    etcd: Sequence[EndpointHealth] = (),
) -> dict[str, Any]:
    """The status object: every pair with its problems, a pair of ``expected`` (the
    members file's) with no record as missing, every etcd endpoint with its own."""
    pairs = [{**asdict(v), "problems": problems(v, now)} for v in views.values()]
    pairs += [{"pair": name, "problems": [MISSING]} for name in expected if name not in views]
    pairs.sort(key=lambda p: str(p["pair"]))
    members = [{**asdict(h), "problems": etcd_problems(h)} for h in etcd]
    return {
        "cluster": cluster,
        "etcd": members,
        "pairs": pairs,
        "placeable": placeable(views.values()),
    }


def _line(p: dict[str, Any]) -> str:
    if "load" not in p:  # missing: nothing but its name and why
        return f"{p['pair']}: {'; '.join(p['problems'])}"
    load = p["load"]
    who = f"primary {p['primary'] or '-'}, standby {','.join(p['standbys']) or '-'}"
    figures = (
        f"epoch {p['epoch']}, lag {p['lag']}, jobs {load['running_jobs']}, "
        f"queued {load['queued_pages']}, {load['pages_per_s']:.1f} pages/s, "
        f"capacity {p['capacity']}"
    )
    health = "; ".join(p["problems"]) or "healthy"
    return f"{p['pair']}: {who}; {figures}; {health}"


def _etcd_line(e: dict[str, Any]) -> str:
    role = "leader" if e["ok"] and e["member_id"] == e["leader_id"] else "member"
    health = "; ".join(e["problems"]) or f"healthy {role}, raft term {e['raft_term']}"
    return f"etcd {e['endpoint']}: {health}"


async def _status(url: str, members: Members | None) -> dict[str, Any]:
    from pagesift.coord.registry import EtcdRegistry

    registry = EtcdRegistry(url, timeout=2.0, members=members)
    try:
        nodes = await registry.nodes()
        health = await registry.etcd.health()
    finally:
        await registry.close()
    expected = members.names if members is not None else []
    return status_json(
        registry.cluster, pair_views(nodes), time.time(), expected=expected, etcd=health
    )


def _cmd_status(args: argparse.Namespace) -> int:
    from pagesift.coord.etcd import EtcdUnavailable

    try:
        members = load_members(args.members) if args.members else None
        out = asyncio.run(_status(args.cluster, members))
    except (ValueError, OSError) as e:
        return fail(str(e))
    except EtcdUnavailable as e:
        return fail(f"cannot reach the cluster's etcd: {e}", exit=EXIT_UNREACHABLE)
    if args.json:
        dump(out)
    else:
        print(f"cluster {out['cluster']}: {len(out['pairs'])} pair(s), "
              f"placing new work on {', '.join(out['placeable']) or 'none'}")  # fmt: skip
        for member in out["etcd"]:
            print(_etcd_line(member))
        for p in out["pairs"]:
            print(_line(p))
    unhealthy = any(x["problems"] for x in [*out["pairs"], *out["etcd"]])
    return EXIT_NO if unhealthy else EXIT_OK


def add_cluster_command(sub: Any) -> None:
    p = sub.add_parser("cluster", help="several pairs as one service (etcd registry)")
    inner = p.add_subparsers(dest="cluster_command", required=True)
    st = inner.add_parser("status", help="every pair of a cluster, and what is unhealthy")
    st.add_argument("--cluster", required=True, metavar="etcd://HOST:PORT[,...]/NAME")
    st.add_argument(
        "--members",
        metavar="FILE",
        help="the cluster's members file: a listed pair with no record is missing, and "
        "only records that verify are believed",
    )
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.set_defaults(handler=_cmd_status, uses_client=False)
