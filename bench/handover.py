"""Handover benchmark: one host's peak of requests in flight while its ownership moves.

What it runs (``python -m bench.run --section handover``): one etcd, one-node pairs of
``pagesift serve --cluster`` (``bench.cluster.Pairs``, ``per_host_concurrency``
``--handover-limit``, default 2), and one counted origin on 127.0.0.1
(``pagesift.drill.counting``: every request any node sends it, the peak in
flight), answered after ``--handover-delay`` seconds a page so requests overlap. Each
fault starts a crawl of the origin on the pair that owns it, waits for 10 pages, then:

- ``stall``: the owner is SIGSTOPped for ``--handover-freeze`` seconds (20); meanwhile
  the other pair reads it gone and a crawl of the origin is started on it (retried
  until it is accepted); then SIGCONT: the owner takes its origin back;
- ``join``: a third pair, named so that it owns the origin once listed, is started;
  once it is placeable a crawl of the origin is started on it (retried until it is
  accepted): the first crawl's pages left go to no one but the new owner's crawl;
- ``leave``: the owner is stopped (SIGTERM: it withdraws its records, then stops its
  jobs) and a crawl of the origin is started on the other pair (retried until it is
  accepted).

Figures per fault: the origin's peak against the limit (the invariant: never above),
the pages each crawl stored and how many it left to another pair
(``host_owned_elsewhere``), the wall time. Every wait is bounded by
``--handover-timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench.cluster import TERMINAL, Pairs
from bench.common import OUT_DIR, machine_facts, markdown_table, say, stop_serve
from pagesift.core.cluster import placement
from pagesift.demo.site import CALENDAR_EXCLUDE
from pagesift.drill.counting import CountedSite
from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

FAULTS = ("stall", "join", "leave")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("handover section")
    g.add_argument("--handover-limit", type=int, default=2, help="per_host_concurrency (2)")
    g.add_argument("--handover-pages", type=int, default=900, help="the origin's articles")
    g.add_argument("--handover-delay", type=float, default=0.05, help="seconds per page")
    g.add_argument("--handover-freeze", type=float, default=20.0, help="SIGSTOP seconds (20)")
    g.add_argument("--handover-timeout", type=float, default=240.0, help="seconds per wait")
    g.add_argument("--handover-faults", default=",".join(FAULTS), help="which (all)")


def _names(host: str, n: int) -> list[str]:
    """n pair names, the first owning ``host`` among the first two and the third (if
    any) owning it among all three."""
    key = placement.site_key(host)
    for k in range(1000):
        names = [f"h{k}-{c}" for c in "abc"[:n]]
        if placement.owner(key, names[:2]) != names[0]:
            continue
        if n == 3 and placement.owner(key, names) != names[2]:
            continue
        return names
    raise RuntimeError("no names")


async def _until(check: Callable[[], Awaitable[Any]], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got is not None:
            return got
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout:g} s")


class Node:
    """One pair's node, reached directly (a cluster client would place the crawl the
    same way: these starts are what it sends)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = jobs_pb2_grpc.JobServiceStub(self.channel)  # type: ignore[no-untyped-call]

    async def start(self, site: CountedSite) -> str | None:
        req = jobs_pb2.StartCrawlRequest(
            url=site.root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=8,
            sitemap=jobs_pb2.SITEMAP_MODE_SKIP, max_retries=0,
        )  # fmt: skip
        try:
            return str((await self.stub.StartCrawl(req)).id)
        except grpc.aio.AioRpcError:
            return None  # not primary yet, or the origin is another pair's

    async def pages(self, job_id: str) -> int:
        got = await self.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, status_only=True))
        return int(got.completed)

    async def outcome(self, job_id: str, timeout: float) -> dict[str, Any]:
        async def done() -> jobs_pb2.GetJobResponse | None:
            got = await self.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, status_only=True))
            return got if got.state in TERMINAL else None

        final = await _until(done, f"job {job_id} to end", timeout)
        errors = await self.stub.GetJobErrors(
            jobs_pb2.GetJobErrorsRequest(id=job_id, page_size=1000)
        )
        left = sum(1 for e in errors.errors if e.code == "host_owned_elsewhere")
        return {"pages": final.completed, "failed": final.failed, "left_to_owner": left}

    async def close(self) -> None:
        await self.channel.close(None)


async def _fault(fault: str, etcd: Etcd, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    site = CountedSite(args.handover_pages, host="127.0.0.1", delay=args.handover_delay)
    await site.start()
    names = _names("127.0.0.1", 3 if fault == "join" else 2)
    pairs = Pairs(etcd, work, f"handover-{fault}", names[:2], per_host=args.handover_limit)
    nodes: list[Node] = []
    t0 = time.monotonic()
    try:
        await pairs.wait_placeable(min(60.0, args.handover_timeout))
        first = Node(pairs.addresses[names[0]])
        nodes.append(first)
        a = await _until(lambda: first.start(site), "a crawl on the owner", 60)

        async def crawling(node: Node, job: str) -> bool | None:
            return True if await node.pages(job) >= 10 else None

        await _until(lambda: crawling(first, a), "the owner to crawl", 60)
        if fault == "stall":
            other = Node(pairs.addresses[names[1]])
            nodes.append(other)
            with pairs.by_pair[names[0]].frozen():
                frozen = time.monotonic()
                b = await _until(lambda: other.start(site), "the other pair to take it", 60)
                await asyncio.sleep(max(0.0, args.handover_freeze - (time.monotonic() - frozen)))
        elif fault == "leave":
            other = Node(pairs.addresses[names[1]])
            nodes.append(other)
            left_with = await first.pages(a)
            leaving = asyncio.create_task(asyncio.to_thread(stop_serve, pairs.by_pair[names[0]]))
            b = await _until(lambda: other.start(site), "the other pair to take it", 60)
            await leaving
        else:
            pairs.add(names[2])
            await pairs.wait_placeable(min(60.0, args.handover_timeout))
            other = Node(pairs.addresses[names[2]])
            nodes.append(other)
            b = await _until(lambda: other.start(site), "the new pair to take it", 60)
        first_out = (
            {"pages": left_with, "failed": 0, "left_to_owner": 0}  # stored when it left
            if fault == "leave"
            else await first.outcome(a, args.handover_timeout)
        )
        other_out = await other.outcome(b, args.handover_timeout)
    finally:
        for node in nodes:
            await node.close()
        pairs.stop()
        await site.stop()
    row = {
        "fault": fault,
        "limit": args.handover_limit,
        "peak": site.counter.peak,
        "held": site.counter.peak <= args.handover_limit,
        "owner_before": first_out,
        "owner_after": other_out,
        "requests": site.counter.requests,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    say(f"{fault}: peak {row['peak']} at limit {row['limit']}, {row['requests']} requests")
    return row


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pagesift-bench-handover-"))
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        etcd = Etcd(work)
        stack.callback(etcd.child.stop)
        await etcd.start()
        facts = machine_facts()
        wanted = [f for f in args.handover_faults.split(",") if f in FAULTS]
        rows = [await _fault(f, etcd, work, args) for f in wanted]
    settings = {k: v for k, v in vars(args).items() if k.startswith("handover_")}
    return {"machine": facts, "settings": settings, "faults": rows}


def run(args: argparse.Namespace) -> None:
    doc = asyncio.run(_run(args))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "handover.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        [r["fault"], r["peak"], r["limit"], "yes" if r["held"] else "NO",
         r["owner_before"]["pages"], r["owner_before"]["left_to_owner"],
         r["owner_after"]["pages"], r["owner_after"]["left_to_owner"], r["requests"],
         r["wall_s"]]
        for r in doc["faults"]
    ]  # fmt: skip
    table = markdown_table(
        ["fault", "peak in flight", "limit", "held", "first owner's pages", "left by it",
         "second owner's pages", "left by it", "origin requests", "wall s"],
        rows,
    )  # fmt: skip
    (OUT_DIR / "handover.md").write_text(table + "\n")
    print(table, flush=True)
