"""Cluster benchmark: 1, 2 and 3 pairs on one box, the same work, a slow site.

What it runs (``python -m bench.run --section cluster``):

- one etcd (Debian's, ``pagesift.drill.fixture.Etcd``) and, for each pair count
  n in ``--cluster-pairs`` (default 1,2,3), n ``pagesift serve --witness … --pair P
  --cluster NAME`` children, ONE node a pair (the witness makes it primary; a standby
  would add replication CPU and nothing to placement), under a fresh cluster name;
- ``--cluster-sites`` demo sites (default 6, ``--cluster-pages`` articles each, 150)
  on loopback hosts 127.0.0.1, .2, …, each page answered after ``--cluster-delay``
  seconds (default 0.2), counted at the server
  (``pagesift.drill.counting``), so a page costs the node little CPU and the
  throughput is bound by how many pages are in flight, not by the 2 cores;
- the work: ONE batch scrape of every page of every site, through
  ``JobClient(cluster=…)``, ``max_concurrency`` ``--cluster-concurrency`` (default 8).
  The client splits it by host, one part per pair, each part with that concurrency: a
  pair's concurrency is the bound, so n pairs fetch n times as many pages at once.
  The pair names are picked so that each pair owns the same number of sites (rendezvous
  hashing of 6 hosts onto 2 or 3 names is lumpy; this measures the mechanism, not the
  luck of a draw, and says so).

Figures: pages/s per pair count and the ratio to one pair; the routing cost per RPC
(``GetJob(status_only)`` of a finished part, ``--cluster-rpcs`` calls through the cluster
client and the same number through a plain ``JobClient([address])`` with the bare id:
the difference of the medians, microseconds); etcd writes per 1,000 pages (etcd's own
``/metrics``: ``etcd_mvcc_put_total + txn + delete``, and revisions, before and after the
batch) and per second while idle (the registry's refresh every 2 s per node, whatever
the pages). Every politeness peak is reported too (never above ``per_host_concurrency``).
Every wait is bounded by ``--cluster-timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import OUT_DIR, machine_facts, markdown_table, say, start_serve, stop_serve
from pagesift.client import JobClient
from pagesift.client.registryview import ClusterView
from pagesift.core.api.tls import write_new_token
from pagesift.core.cluster import ids, placement
from pagesift.core.cluster.registryrules import placeable
from pagesift.core.util.children import Child, free_port
from pagesift.drill.counting import CountedSite
from pagesift.drill.fixture import Etcd, write_server_toml
from pagesift.v1 import jobs_pb2

PER_HOST = 8  # per_host_concurrency of every node (the server's default)
WRITE_METRICS = ("etcd_mvcc_put_total", "etcd_mvcc_txn_total", "etcd_mvcc_delete_total")
REVISION = "etcd_debugging_mvcc_current_revision"
TERMINAL = {jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("cluster section")
    g.add_argument("--cluster-pairs", default="1,2,3", help="pair counts (default 1,2,3)")
    g.add_argument("--cluster-sites", type=int, default=6, help="sites (hosts), default 6")
    g.add_argument("--cluster-pages", type=int, default=150, help="articles per site (150)")
    g.add_argument("--cluster-delay", type=float, default=0.2, help="seconds per page (0.2)")
    g.add_argument("--cluster-concurrency", type=int, default=8, help="the batch's (8)")
    g.add_argument("--cluster-rpcs", type=int, default=1000, help="GetJob calls per client")
    g.add_argument("--cluster-timeout", type=float, default=300.0, help="seconds per wait")


def balanced_names(hosts: list[str], n: int) -> list[str]:
    """n pair names among which every name owns len(hosts)/n hosts (rounded). The
    names differ from one pair count to the next: the witness's election keys are per
    pair name, not per cluster, so a name reused in the same etcd meets the old pair's
    history and refuses to campaign."""
    want = {len(hosts) // n, -(-len(hosts) // n)}
    for names in itertools.combinations([f"n{n}-pair-{i}" for i in range(24)], n):
        owned = [placement.owner(o, names) for o in hosts]
        if {owned.count(p) for p in names} <= want:
            return list(names)
    raise RuntimeError(f"no {n} names share {len(hosts)} hosts evenly")


async def etcd_counters(http: aiohttp.ClientSession, etcd: Etcd) -> dict[str, float]:
    async with http.get(f"http://127.0.0.1:{etcd.client_port}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (*WRITE_METRICS, REVISION):
            out[name] = float(value)
    out["writes"] = sum(out.get(m, 0.0) for m in WRITE_METRICS)
    return out


def family(key: bytes) -> str:
    """A key's family: its first path parts, with names and ids left out
    (``/pagesift-cluster/NAME/nodes/P/N`` -> ``/pagesift-cluster/*/nodes``)."""
    parts = key.decode(errors="replace").split("/")
    if len(parts) > 3 and parts[1] == "pagesift-cluster":
        return f"/pagesift-cluster/*/{parts[3]}"
    return "/".join(parts[:2]) + "/*" if len(parts) > 2 else key.decode(errors="replace")


async def writes_by_family(etcd: Etcd, first: int, last: int) -> dict[str, int]:
    """The writes of revisions ``first..last`` (inclusive) by key family, read back
    from etcd's history with a watch from ``first`` (bounded)."""
    import aetcd

    out: dict[str, int] = {}
    if last < first:
        return out
    client = aetcd.Client(host="127.0.0.1", port=etcd.client_port, timeout=5.0)
    try:
        events = await client.watch(b"\0", range_end=b"\0", start_revision=first)

        async def take() -> None:
            async for ev in events:
                if ev.kv.mod_revision > last:
                    return
                fam = family(bytes(ev.kv.key))
                out[fam] = out.get(fam, 0) + 1
                if ev.kv.mod_revision == last:
                    return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(take(), 5.0)
    finally:
        await client.close()
    return out


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a.get(k, 0.0) for k in b}


class Pairs:
    """n one-node pairs of cluster ``name`` (``pagesift serve`` children)."""

    def __init__(
        self, etcd: Etcd, work: Path, name: str, pairs: list[str], *, per_host: int = PER_HOST
    ) -> None:
        token = work / "replication.token"
        if not token.exists():
            write_new_token(token)
        self.etcd, self.work, self.name = etcd, work, name
        self.url = f"{etcd.endpoint}/{name}"
        self.addresses: dict[str, str] = {}
        self.children: list[Child] = []
        self.by_pair: dict[str, Child] = {}
        self.table = {
            "allow_private_networks": True,
            "extract_processes": 1,
            "per_host_concurrency": per_host,
            "replication_token_file": str(token),
            "storage_reserve_bytes": 0,
        }
        for pair in pairs:
            self.add(pair)

    def add(self, pair: str) -> None:
        """Start pair ``pair``'s one node (it joins the cluster when it registers)."""
        name, work = self.name, self.work
        address = f"127.0.0.1:{free_port()}"
        config = write_server_toml(work / f"{name}-{pair}.toml", self.table)
        args = [
            "--witness", self.etcd.endpoint, "--pair", pair, "--cluster", name,
            "--listen", address, "--advertise", address,
            "--data", str(work / f"{name}-{pair}"), "--config", str(config),
        ]  # fmt: skip
        child = start_serve(pair, args, work / f"{name}-{pair}.log")
        self.children.append(child)
        self.by_pair[pair] = child
        self.addresses[pair] = address

    async def wait_placeable(self, timeout: float) -> None:
        view = ClusterView(self.url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for child in self.children:
                    if child.proc is not None and not child.alive:
                        raise RuntimeError(f"{child.name} exited:\n{child.tail()}")
                with contextlib.suppress(Exception):
                    await view.reread()
                    if sorted(placeable(view.pairs.values())) == sorted(self.addresses):
                        return
                await asyncio.sleep(0.2)
        finally:
            await view.close()
        raise TimeoutError(f"the {len(self.addresses)} pairs were not placeable in {timeout:g} s")

    def stop(self) -> None:
        for child in self.children:
            stop_serve(child)


async def _wait_job(client: JobClient, job_id: str, timeout: float) -> jobs_pb2.GetJobResponse:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = await client.get_job(job_id, status_only=True)
        if job.state in TERMINAL:
            return job
        await asyncio.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not end in {timeout:g} s")


async def routing_us(
    routed: JobClient, routed_id: str, direct: JobClient, direct_id: str, calls: int
) -> tuple[float, float]:
    """Median µs of ``GetJob(status_only)`` through each client, the calls alternated
    (one through each, ``calls`` times) so that the box's load drifts on both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for out, client, job_id in ((times[0], routed, routed_id), (times[1], direct, direct_id)):
            t0 = time.perf_counter()
            await client.get_job(job_id, status_only=True)
            out.append(time.perf_counter() - t0)
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


async def one_count(
    n: int, etcd: Etcd, sites: list[CountedSite], work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    hosts = [placement.host_of(s.root) for s in sites]
    names = balanced_names(hosts, n)
    pairs = Pairs(etcd, work, f"bench-{n}", names)
    try:
        await pairs.wait_placeable(min(60.0, args.cluster_timeout))
        for s in sites:
            s.counter.peak = 0
        urls = [u for s in sites for u in s.page_urls()]
        async with aiohttp.ClientSession() as http, JobClient(cluster=pairs.url) as client:
            idle0, t_idle = await etcd_counters(http, etcd), time.monotonic()
            await asyncio.sleep(6.0)
            idle1 = await etcd_counters(http, etcd)
            idle = _delta(idle0, idle1)
            idle_s = time.monotonic() - t_idle
            idle_families = await writes_by_family(
                etcd, int(idle0[REVISION]) + 1, int(idle1[REVISION])
            )
            before = await etcd_counters(http, etcd)
            t0 = time.monotonic()
            req = jobs_pb2.StartBatchScrapeRequest(
                urls=urls, max_concurrency=args.cluster_concurrency
            )
            job_id = (await client.start_batch(req)).id
            final = await _wait_job(client, job_id, args.cluster_timeout)
            wall = time.monotonic() - t0
            during = _delta(before, await etcd_counters(http, etcd))
            parts = ids.job_parts(job_id)
            pair, uid = parts[0]
            async with JobClient([pairs.addresses[str(pair)]]) as direct:
                routed, plain = await routing_us(
                    client, f"{pair}.{uid}", direct, uid, args.cluster_rpcs
                )
        pages = final.completed
        say(f"{n} pair(s): {pages} pages in {wall:.1f} s = {pages / wall:.1f} pages/s")
        return {
            "pairs": n,
            "names": names,
            "parts": len(parts),
            "urls": len(urls),
            "state": jobs_pb2.JobState.Name(final.state),
            "pages": pages,
            "failed": final.failed,
            "wall_s": round(wall, 2),
            "pages_per_s": round(pages / wall, 1),
            "etcd_writes_during": during["writes"],
            "etcd_revisions_during": during.get(REVISION, 0.0),
            "etcd_writes_per_1000_pages": round(1000 * during["writes"] / max(pages, 1), 1),
            "etcd_writes_per_s_idle": round(idle["writes"] / idle_s, 2),
            "etcd_idle_writes_by_family": idle_families,
            "etcd_idle_s": round(idle_s, 2),
            "getjob_us_cluster": round(routed, 1),
            "getjob_us_direct": round(plain, 1),
            "routing_us": round(routed - plain, 1),
            "peak_per_host": max(s.counter.peak for s in sites),
        }
    finally:
        pairs.stop()


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(x) for x in args.cluster_pairs.split(",") if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="pagesift-bench-cluster-"))
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        etcd = Etcd(work)
        stack.callback(etcd.child.stop)
        await etcd.start()
        sites = []
        for k in range(args.cluster_sites):
            site = CountedSite(
                args.cluster_pages, host=f"127.0.0.{k + 1}", delay=args.cluster_delay, seed=k + 1
            )
            await site.start()
            stack.push_async_callback(site.stop)
            sites.append(site)
        facts = machine_facts()
        runs = [await one_count(n, etcd, sites, work, args) for n in counts]
    base = runs[0]["pages_per_s"]
    for r in runs:
        r["scaling"] = round(r["pages_per_s"] / base, 2) if base else None
    return {"machine": facts, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "settings": {k: v for k, v in vars(args).items() if k.startswith("cluster_")},
            "runs": runs}  # fmt: skip


def run(args: argparse.Namespace) -> None:
    doc = asyncio.run(_run(args))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "cluster.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        [r["pairs"], r["pages"], r["wall_s"], r["pages_per_s"], r["scaling"], r["peak_per_host"],
         r["getjob_us_direct"], r["getjob_us_cluster"], r["routing_us"],
         r["etcd_writes_per_1000_pages"], r["etcd_writes_per_s_idle"]]
        for r in doc["runs"]
    ]  # fmt: skip
    table = markdown_table(
        ["pairs", "pages", "wall s", "pages/s", "x 1 pair", "peak/host", "GetJob µs direct",
         "GetJob µs cluster", "routing µs", "etcd writes/1k pages", "etcd writes/s idle"],
        rows,
    )  # fmt: skip
    (OUT_DIR / "cluster.md").write_text(table + "\n")
    print(table, flush=True)
