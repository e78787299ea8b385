"""Part 6 of the replication bench: promoting a caught-up standby.

``measure_promote`` checks the standby refuses a write, calls ``AdminService.Promote`` with
the pair's replication token, then retries ``StartCrawl`` until one is accepted: the time of
the Promote call and of the first accepted write. Run after a crawl (``crawl``) and after a
full resync (``resync``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc

from bench.common import say
from bench.replication.procs import Node


async def measure_promote(n: Node, url: str, conf: Path) -> dict[str, Any]:
    """Promote a caught-up standby; time the call and until a StartCrawl is accepted.
    ``conf`` is the node's config from ``procs.server_config`` (its token file beside it)."""
    from pagesift.v1 import jobs_pb2
    from pagesift.v1 import replication_pb2 as pb

    req = jobs_pb2.StartCrawlRequest(url=url, limit=1, max_concurrency=1)
    before = await n.role()
    refused = ""
    try:
        await n.jobs.StartCrawl(req, timeout=5)
        refused = "accepted before the promotion!"
    except grpc.aio.AioRpcError as exc:
        refused = exc.code().name
    t0 = time.monotonic()
    token = (conf.parent / "replication.token").read_text().strip()
    promote_md = (("authorization", f"Bearer {token}"),)  # no [admin] key: the pair's token
    resp = await n.admin.Promote(pb.PromoteRequest(), metadata=promote_md, timeout=60)
    t1 = time.monotonic()
    attempts = 0
    last = ""
    accepted = False
    while attempts < 2000 and time.monotonic() - t0 < 30:
        attempts += 1
        try:
            await n.jobs.StartCrawl(req, timeout=5)
            accepted = True
            break
        except grpc.aio.AioRpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
            await asyncio.sleep(0.005)
    t2 = time.monotonic()
    after = await n.role()
    out = {
        "applied_offset": int(before.applied_offset),
        "epoch_before": int(before.epoch),
        "epoch_after": int(resp.epoch),
        "switch_offset": int(resp.switch_offset),
        "role_after": pb.NodeRole.Name(after.role),
        "write_before_promote": refused,
        "promote_rpc_ms": (t1 - t0) * 1000,
        "first_write_ms": (t2 - t0) * 1000 if accepted else None,
        "write_attempts": attempts,
        "last_error": last,
    }
    say(
        f"replication: promote {out['promote_rpc_ms']:.1f} ms, first write accepted after "
        f"{out['first_write_ms'] or float('nan'):.1f} ms ({attempts} attempt(s))"
    )
    return out
