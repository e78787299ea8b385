"""The cluster drill: every pair crawls, one pair's primary is SIGKILLed, each pair judged.

Owns ``ClusterDrillSettings`` and ``run_cluster_drill`` (``pagesift drill --local
--pairs N`` and ``pagesift drill --cluster etcd://…/NAME``). One run, with the
single-pair drill's pieces (``LocalPair``/``CommandPair``, ``Follower``, ``Prober``,
``final_job``) and a counted site per pair (``counting.CountedSite``):

1. local: one etcd, N sites on loopback hosts 127.0.0.1..N (the per-host slots key on
   the host), N pairs of two ``pagesift serve --witness … --pair P --cluster NAME``
   nodes whose names are picked so that pair k owns site k (rendezvous hashing is
   deterministic), ``per_host_concurrency`` set on every node. Remote (``--cluster``):
   the registry's pairs as they are, a site per pair on a host that pair owns
   (placement keys on the host: ``site_hosts`` of ``--callback-host``), and the
   operator's kill/start commands;
2. every pair up (a primary with a connected standby) and placeable in the registry;
   one crawl per site started through ``JobClient(cluster=…)`` (each lands on its
   owner: checked by the id's pair) and followed with WatchJob through that client;
3. once the victim pair's crawl (drawn from the seeded RNG) showed a random 10-70 % of
   its pages, SIGKILL that pair's primary; probe writes on its standby until one is
   accepted (the witness promotes it: the RTO), restart the killed node with its same
   command line and wait for it to rejoin as a standby (``discarded``);
4. wait for every crawl to end, read each in full through the cluster client, read each
   site's peak concurrency, and judge (``clusterverdict``) against the per-host limit the
   nodes publish in their registry records, read once every pair is up, before the
   crawls (``published_limits``; ``clusterverdict.choose_limit``: the strictest node's,
   or ``per_host_limit`` when the operator gave one).

Webhooks and digests are the single-pair drill's: not repeated here. Every wait is
bounded by ``timeout``; everything started is stopped and the working directory removed
on the way out (an ``AsyncExitStack``), exception or Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import secrets
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from pagesift.client import JobClient
from pagesift.client.registryview import ClusterUnavailable, ClusterView
from pagesift.core.cluster import ids, placement
from pagesift.core.cluster.registryrules import PairView, placeable
from pagesift.core.util.tasks import cancel_and_wait
from pagesift.demo.site import CALENDAR_EXCLUDE
from pagesift.drill.clusterverdict import (
    ClusterReport,
    LimitChoice,
    PairObservation,
    choose_limit,
    judge_cluster,
)
from pagesift.drill.counting import CountedSite
from pagesift.drill.fixture import (
    NODE_SETTINGS,
    DrillKeys,
    Etcd,
    LocalPair,
    SetupError,
    remove_workdir,
)
from pagesift.drill.observe import Follower, Prober, final_job, first_accepted, wait_for
from pagesift.drill.remote import CommandPair
from pagesift.drill.runner import PAIR_READY_S, REJOIN_S, Pair, _current_roles, _rejoined
from pagesift.drill.verdict import kill_point
from pagesift.v1 import jobs_pb2

__all__ = [
    "ClusterDrillSettings", "published_limits", "run_cluster_drill", "site_hosts",
    "spread_names",
]  # fmt: skip

LOOPBACK_HOSTS = 64  # 127.0.0.1..N: the hosts a loopback --callback-host stands for

Say = Callable[[str], None]
TERMINAL = (jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED)


@dataclass
class ClusterDrillSettings:
    """What ``pagesift drill --local --pairs N`` / ``--cluster URL`` was asked."""

    pairs: int = 3  # local: how many pairs
    cluster: str = ""  # remote: etcd://HOST:PORT/NAME
    mode: str = "async"
    seed: int = 0
    pages: int = 30  # articles per site
    timeout: float = 180.0
    pace: float = 0.03
    site_delay: float = 0.02  # seconds each site answer waits (so requests overlap)
    concurrency: int = 8
    per_host: int = 2  # local: the nodes' per_host_concurrency
    per_host_limit: int | None = None  # the limit judged by, over what the nodes publish
    page_retries: int | None = None
    witness_ttl: float = 3.0
    kill_cmd: str = ""
    start_cmd: str = ""
    command_timeout: float = 120.0
    keys: DrillKeys = field(default_factory=DrillKeys)
    tls_ca: str = ""
    callback_host: str = "127.0.0.1"
    keep: bool = False


def spread_names(hosts: list[str], pool: int = 64) -> list[str]:
    """Pair names such that name k owns hosts[k] among them."""
    for names in itertools.permutations([f"pair-{i}" for i in range(pool)], len(hosts)):
        if all(placement.owner(h, names) == n for h, n in zip(hosts, names, strict=True)):
            return list(names)
    raise SetupError(f"no {len(hosts)} pair names spread the sites one to a pair")


def site_hosts(callback_host: str) -> list[str]:
    """The hosts the remote drill may serve its sites on: ``--callback-host`` split at
    commas; a single loopback IPv4 address stands for 127.0.0.1..127.0.0.64 (every one
    of them is this machine), so that each pair finds a host it owns."""
    hosts = [h.strip() for h in callback_host.split(",") if h.strip()]
    if len(hosts) == 1 and hosts[0].startswith("127."):
        return [f"127.0.0.{i}" for i in range(1, LOOPBACK_HOSTS + 1)]
    return hosts


async def published_limits(url: str, pairs: Iterable[str]) -> dict[str, int]:
    """The ``per_host_concurrency`` each registered node of ``pairs`` publishes in its
    record (``"pair/node"`` -> value; 0: a node that publishes none); ``SetupError``
    when the registry cannot be read."""
    from pagesift.coord.etcd import EtcdUnavailable
    from pagesift.coord.registry import EtcdRegistry

    wanted = set(pairs)
    registry = EtcdRegistry(url, timeout=2.0)
    try:
        records = await registry.nodes()
    except EtcdUnavailable as e:
        raise SetupError(f"cannot read the nodes' records: {e}") from None
    finally:
        await registry.close()
    return {f"{r.pair}/{r.node}": r.per_host_concurrency for r in records if r.pair in wanted}


class _Drill:
    def __init__(self, s: ClusterDrillSettings, stack: contextlib.AsyncExitStack, say: Say):
        self.s, self.stack, self.say = s, stack, say
        self.deadline = time.monotonic() + s.timeout
        self.url = s.cluster
        self.names: list[str] = []  # names[k] owns sites[k]
        self.sites: list[CountedSite] = []
        self.pairs: dict[str, Pair] = {}
        self.clients: dict[str, JobClient] = {}

    def left(self, cap: float | None = None) -> float:
        rest = max(0.0, self.deadline - time.monotonic())
        return rest if cap is None else min(rest, cap)

    async def _site(self, host: str, seed: int) -> CountedSite:
        site = CountedSite(self.s.pages, host=host, delay=self.s.site_delay, seed=seed)
        await site.start()
        self.stack.push_async_callback(site.stop)
        return site

    async def setup_local(self, workdir: Path) -> None:
        s = self.s
        etcd = Etcd(workdir)
        self.stack.callback(etcd.child.stop, 10.0)
        await etcd.start()
        name = f"drill-{secrets.token_hex(3)}"
        self.url = f"{etcd.endpoint}/{name}"
        self.sites = [await self._site(f"127.0.0.{k + 1}", k + 1) for k in range(s.pairs)]
        self.names = spread_names([placement.host_of(x.root) for x in self.sites])
        table = {**NODE_SETTINGS, "per_host_concurrency": s.per_host}
        for pair in self.names:
            local = LocalPair(
                workdir / pair, s.keys, mode=s.mode, auto=True, witness_ttl=s.witness_ttl,
                settings=table, etcd=etcd, pair_name=pair, cluster=name,
            )  # fmt: skip
            self.stack.push_async_callback(local.close)
            await local.start()
            self.pairs[pair] = local

    async def _settled(self) -> dict[str, PairView]:
        """The registry's pairs once every one has a primary and a standby and two reads
        a second apart agree (nodes still starting settle first), within PAIR_READY_S."""
        view = ClusterView(self.url)
        last: list[tuple[str, str, tuple[str, ...]]] = []
        try:

            async def settled() -> dict[str, PairView] | None:
                nonlocal last
                try:
                    await view.reread()
                except ClusterUnavailable as e:
                    raise SetupError(str(e)) from None
                pairs = dict(view.pairs)
                now = sorted((p, v.primary, v.standbys) for p, v in pairs.items())
                ready = bool(now) and all(primary and stby for _, primary, stby in now)
                same, last = now == last, now
                return pairs if ready and same else None

            found = await wait_for(settled, self.left(PAIR_READY_S), interval=1.0)
        finally:
            await view.close()
        if found is None:
            raise SetupError(
                f"cluster {view.name}: its pairs did not all show a primary and a standby "
                f"within {PAIR_READY_S:g} s"
            )
        return found

    async def setup_remote(self, workdir: Path) -> None:
        s = self.s
        pairs = await self._settled()
        self.names = sorted(placeable(pairs.values()))
        if not self.names:
            raise SetupError(f"cluster {self.url}: no pair takes new work to drill")
        hosts = site_hosts(s.callback_host)
        for k, pair in enumerate(self.names):
            host = next((h for h in hosts if placement.owner(h, self.names) == pair), None)
            if host is None:
                raise SetupError(
                    f"pair {pair} owns none of the callback hosts {', '.join(hosts[:4])}"
                    f"{'...' if len(hosts) > 4 else ''}: placement keys on the host, so "
                    "give --callback-host one host (comma-separated) per pair"
                )
            self.sites.append(await self._site(host, k + 1))
            pv = pairs[pair]
            self.pairs[pair] = CommandPair(
                pv.primary, pv.standbys[0], kill_cmd=s.kill_cmd, start_cmd=s.start_cmd,
                auto=True, workdir=workdir, command_timeout=s.command_timeout,
            )  # fmt: skip

    async def pairs_up(self) -> None:
        s = self.s
        for pair, nodes in self.pairs.items():
            client = JobClient(
                nodes.addresses, api_key=s.keys.api_key, admin_key=s.keys.admin_key,
                tls_ca=s.tls_ca, timeout=30.0,
            )  # fmt: skip
            self.stack.push_async_callback(client.close)
            self.clients[pair] = client
        for pair, nodes in self.pairs.items():
            if await _current_roles(self.clients[pair], nodes, self.left(PAIR_READY_S)) is None:
                tails = "\n".join(nodes.log_tail(a, 8) for a in nodes.addresses)
                raise SetupError(f"pair {pair} did not come up:\n{tails}")
        view = ClusterView(self.url)
        try:

            async def all_placeable() -> bool | None:
                await view.reread()
                return True if set(self.names) <= set(placeable(view.pairs.values())) else None

            if await wait_for(all_placeable, self.left(30.0), interval=0.2) is None:
                raise SetupError("the pairs did not all register as placeable")
        finally:
            await view.close()

    def crawl(self, site: CountedSite) -> jobs_pb2.StartCrawlRequest:
        req = jobs_pb2.StartCrawlRequest(
            url=site.root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=self.s.concurrency,
            delay=self.s.pace, idempotency_key=f"drill-{uuid.uuid4()}",
        )  # fmt: skip
        if self.s.page_retries is not None:
            req.max_retries = self.s.page_retries
        return req

    async def limits(self) -> LimitChoice:
        """The per-host limit to judge by: the nodes' published ones, or the override."""
        published = await published_limits(self.url, self.names)
        choice = choose_limit(published, self.s.per_host_limit)
        for note in choice.notes:
            self.say(f"per-host limit: {note}")
        return choice

    async def run(self, rng: random.Random) -> ClusterReport:
        s = self.s
        limits = await self.limits()
        cc = JobClient(cluster=self.url, api_key=s.keys.api_key, tls_ca=s.tls_ca, timeout=30.0)
        self.stack.push_async_callback(cc.close)
        obs = [
            PairObservation(p, x.root, limits.limit)
            for p, x in zip(self.names, self.sites, strict=True)
        ]
        followers: list[Follower] = []
        tasks: list[asyncio.Task[None]] = []
        for o, site in zip(obs, self.sites, strict=True):
            o.required, o.optional = site.expected(), site.optional()
            o.job_id = await cc.start_crawl(self.crawl(site))
            if ids.pair_of(o.job_id) != o.pair:
                o.problems.append(f"the crawl was placed on {ids.pair_of(o.job_id)}")
            followers.append(Follower(cc, o.job_id))
            tasks.append(asyncio.create_task(followers[-1].run(), name=f"follow-{o.pair}"))
        try:
            victim = rng.randrange(len(obs))
            await self._kill(obs[victim], followers[victim], rng)
            for o in obs:
                await self._collect(cc, o)
        finally:
            for t in tasks:
                await cancel_and_wait(t)
        for o, f, site in zip(obs, followers, self.sites, strict=True):
            o.shown, o.peak = list(f.shown), site.counter.peak
        return judge_cluster(obs, s.mode, limits)

    async def _kill(self, o: PairObservation, follower: Follower, rng: random.Random) -> None:
        o.killed = True
        nodes, client = self.pairs[o.pair], self.clients[o.pair]
        total = len(o.required or ()) or self.s.pages
        after = kill_point(total, rng.random())
        if not await follower.wait_shown(after, self.left()):
            o.problems.append(f"the crawl showed only {len(follower.shown)} pages before the kill")
            return
        found = await _current_roles(client, nodes, self.left(10.0))
        if found is None:
            o.problems.append("no primary with a connected standby at the kill")
            return
        primary, standby = found
        self.say(f"pair {o.pair}: SIGKILL of its primary at {primary} after {after} pages")
        o.kill_at = time.monotonic()
        await nodes.kill(primary)
        site = self.sites[self.names.index(o.pair)]
        prober = Prober(client, [standby], site.root + "about.html")
        await prober.run(first_accepted, self.left(3 * self.s.witness_ttl + 20.0))
        o.probes = list(prober.probes)
        await nodes.restart(primary, role="standby", primary=standby)
        back = await wait_for(lambda: _rejoined(client, primary), self.left(REJOIN_S), 0.1)
        o.rejoined = back is not None
        o.discarded = back.discarded if back is not None else None

    async def _collect(self, cc: JobClient, o: PairObservation) -> None:
        async def ended() -> bool | None:
            job = await cc.get_job(o.job_id, status_only=True)
            return True if job.state in TERMINAL else None

        if await wait_for(ended, self.left(), interval=0.2) is None:
            o.problems.append("the crawl did not end in time")
        try:
            o.final = await final_job(cc, o.job_id)
        except grpc.aio.AioRpcError as err:  # written down as the pair's problem
            o.problems.append(f"could not read the job: {err}")


async def run_cluster_drill(s: ClusterDrillSettings, say: Say) -> ClusterReport:
    """The drill's report (see the module docstring); SetupError when it could not
    start or reach what it needs."""
    workdir = Path(tempfile.mkdtemp(prefix="pagesift-cluster-drill-"))
    async with contextlib.AsyncExitStack() as stack:
        if s.keep:
            say(f"working directory (kept): {workdir}")
        else:
            stack.callback(remove_workdir, workdir)
        drill = _Drill(s, stack, say)
        if s.cluster:
            await drill.setup_remote(workdir)
        else:
            await drill.setup_local(workdir)
        await drill.pairs_up()
        say(f"{len(drill.names)} pairs up in {drill.url}: {', '.join(drill.names)}; seed {s.seed}")
        return await drill.run(random.Random(s.seed))
    raise AssertionError("unreachable")  # pragma: no cover
