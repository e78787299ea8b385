"""``pagesift cluster status --cluster etcd://HOST:PORT[,…]/NAME [--json]``: every pair.

Owns the ``cluster`` command group. ``status`` reads the registry once
(``pagesift.coord.registry.EtcdRegistry``) and prints each pair: its primary and
standbys, epoch, standby lag, load (running jobs, queued pages, pages/s), capacity, and
what is unhealthy (``pagesift.shared.cluster.registry.problems``). ``--json`` prints one
object ``{"cluster", "pairs": [{...}], "placeable": [...]}``. Exit 0 when every pair is
healthy, 1 when some pair has a problem, 4 when etcd does not answer, 2 for a bad URL.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict
from typing import Any

from pagesift.node.cli.common import EXIT_NO, EXIT_OK, EXIT_UNREACHABLE, dump, fail
from pagesift.shared.cluster.registry import PairView, pair_views, placeable, problems

__all__ = ["add_cluster_command", "status_json"]


def status_json(cluster: str, views: dict[str, PairView], now: float) -> dict[str, Any]:
    pairs = [{**asdict(v), "problems": problems(v, now)} for v in views.values()]
    return {"cluster": cluster, "pairs": pairs, "placeable": placeable(views.values())}


def _line(p: dict[str, Any]) -> str:
    load = p["load"]
    who = f"primary {p['primary'] or '-'}, standby {','.join(p['standbys']) or '-'}"
    figures = (
        f"epoch {p['epoch']}, lag {p['lag']}, jobs {load['running_jobs']}, "
        f"queued {load['queued_pages']}, {load['pages_per_s']:.1f} pages/s, "
        f"capacity {p['capacity']}"
    )
    health = "; ".join(p["problems"]) or "healthy"
    return f"{p['pair']}: {who}; {figures}; {health}"


async def _status(url: str) -> dict[str, Any]:
    from pagesift.coord.registry import EtcdRegistry

    registry = EtcdRegistry(url, timeout=2.0)
    try:
        nodes = await registry.nodes()
    finally:
        await registry.close()
    return status_json(registry.cluster, pair_views(nodes), time.time())


def _cmd_status(args: argparse.Namespace) -> int:
    from pagesift.coord.etcd import EtcdUnavailable

    try:
        out = asyncio.run(_status(args.cluster))
    except ValueError as e:
        return fail(str(e))
    except EtcdUnavailable as e:
        return fail(f"cannot reach the cluster's etcd: {e}", exit=EXIT_UNREACHABLE)
    if args.json:
        dump(out)
    else:
        print(f"cluster {out['cluster']}: {len(out['pairs'])} pair(s), "
              f"placing new work on {', '.join(out['placeable']) or 'none'}")  # fmt: skip
        for p in out["pairs"]:
            print(_line(p))
    return EXIT_NO if any(p["problems"] for p in out["pairs"]) else EXIT_OK


def add_cluster_command(sub: Any) -> None:
    p = sub.add_parser("cluster", help="several pairs as one service (etcd registry)")
    inner = p.add_subparsers(dest="cluster_command", required=True)
    st = inner.add_parser("status", help="every pair of a cluster, and what is unhealthy")
    st.add_argument("--cluster", required=True, metavar="etcd://HOST:PORT[,...]/NAME")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.set_defaults(handler=_cmd_status, uses_client=False)
