"""The drill's runs: start what it needs, then kill, recover, rejoin and collect, N times.

Owns ``DrillSettings`` and ``run_drill``. One run (``_Run``), on a pair that is up
(one primary, its standby connected):

1. start a crawl (of the demo site, or ``--site``) with a webhook to the drill's
   receiver, and follow it (``observe.Follower``);
2. once the watcher was shown a random number of documents (``verdict.kill_point``:
   10-70 % of the crawl, drawn from the seeded RNG), read the primary's lag
   (``Role``) and SIGKILL the chosen node (or etcd), then probe writes on the survivor
   every 50 ms (``observe.Prober``) until one is accepted;
3. recover as the runbook says: without ``--auto``, confirm the killed primary is
   gone, ``Promote`` the standby and restart the old primary as ``--role standby
   --primary <new>`` (a killed standby just restarts as a standby); with ``--auto``,
   wait for the witness to make the survivor primary and restart the killed node with
   its same command line; a killed witness is restarted once the primary refuses
   writes (the local pair of a witness kill runs with ``witness_failsafe = false``, so
   its lease runs out as a pair without failsafe's would; a remote pair must be
   configured so for ``--kill witness``);
4. wait for the killed node to rejoin (its ``Role``: standby, connected, and how its
   session began: ``continue`` or ``full`` resync; ``discarded``), for the crawl to
   end and for the receiver to hold every event the final job implies, then compare
   both nodes' digests at one offset (``pagesift.core.replication.verify.verify_digests``, the
   function ``pagesift verify`` uses);
5. hand the observation to ``verdict.judge``.

Runs repeat on the same pair (the roles alternate when the primary is killed). Every
wait is bounded by the run's ``timeout`` (and tighter bounds of its own); a wait that
runs out is written down as a problem of the run, which then fails, and the drill
stops repeating. Whatever the drill started is stopped and its working directory
removed on the way out, exception or Ctrl-C included (an ``AsyncExitStack``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from pagesift.client import JobClient
from pagesift.core.replication.verify import verify_digests
from pagesift.core.util.tasks import cancel_and_wait
from pagesift.drill.fixture import (
    NODE_SETTINGS,
    WITNESS,
    DemoSite,
    DrillKeys,
    LocalPair,
    SetupError,
    remove_workdir,
)
from pagesift.drill.observe import (
    Follower,
    Prober,
    final_job,
    first_accepted,
    refused_then_accepted,
    role_of,
    roles,
    wait_for,
)
from pagesift.drill.receiver import Receiver
from pagesift.drill.remote import CommandPair
from pagesift.drill.verdict import Observation, RunReport, judge, kill_point, webhook_tally
from pagesift.v1 import jobs_pb2
from pagesift.v1 import replication_pb2 as rpb

PAIR_READY_S = 60.0  # nodes starting, a standby's first sync
DOWN_S = 15.0  # a kill command's node stops answering
REJOIN_S = 60.0  # a restarted node connects and syncs
WEBHOOKS_S = 30.0  # after the job ended, its last events arrive


class Pair(Protocol):
    """The two nodes (and the witness) a run kills and restarts."""

    @property
    def addresses(self) -> list[str]: ...
    def label(self, address: str) -> str: ...
    async def start(self) -> None: ...
    async def kill(self, target: str) -> None: ...
    async def restart(self, target: str, *, role: str, primary: str) -> None: ...
    def check_alive(self) -> None: ...
    def log_tail(self, address: str, lines: int = 20) -> str: ...
    async def close(self) -> None: ...


@dataclass
class DrillSettings:
    """What ``pagesift drill`` was asked (see its ``--help``)."""

    kill: str = "primary"
    auto: bool = False
    repeat: int = 1
    mode: str = "async"
    seed: int = 0
    pages: int = 100
    timeout: float = 180.0
    site: str = ""
    pace: float = 0.03
    page_retries: int | None = None  # the crawl's max_retries (None: the server's default)
    concurrency: int = 8
    witness_ttl: float = 5.0
    primary: str = ""  # remote: the deployment's nodes and commands
    standby: str = ""
    kill_cmd: str = ""
    start_cmd: str = ""
    command_timeout: float = 120.0
    keys: DrillKeys = field(default_factory=DrillKeys)
    tls_ca: str = ""
    callback_host: str = "127.0.0.1"
    keep: bool = False

    @property
    def local(self) -> bool:
        return not self.primary


Say = Callable[[str], None]


class _Broken(Exception):
    """The pair is no longer fit for another run (the current one is reported failed)."""


async def _current_roles(client: JobClient, pair: Pair, timeout: float) -> tuple[str, str] | None:
    """(primary, standby) once one node is primary and the other a connected standby."""

    async def check() -> tuple[str, str] | None:
        pair.check_alive()
        got = await roles(client, pair.addresses)
        prim = [a for a, r in got.items() if r is not None and r.role == rpb.NODE_ROLE_PRIMARY]
        stby = [
            a
            for a, r in got.items()
            if r is not None and r.role == rpb.NODE_ROLE_STANDBY and r.connected
        ]
        return (prim[0], stby[0]) if len(prim) == 1 and len(stby) == 1 else None

    return await wait_for(check, timeout, interval=0.2)


class _Run:
    """One run; see the module docstring. ``observe`` never raises for what the pair
    does (that goes into the observation); SetupError for what the drill cannot do."""

    def __init__(
        self,
        n: int,
        settings: DrillSettings,
        client: JobClient,
        pair: Pair,
        receiver: Receiver,
        hook_url: str,
        site: DemoSite | None,
        rng: random.Random,
        say: Say,
    ) -> None:
        self.n, self.s, self.client, self.pair = n, settings, client, pair
        self.receiver, self.hook_url, self.site, self.rng, self.say = (
            receiver, hook_url, site, rng, say,
        )  # fmt: skip
        self.deadline = time.monotonic() + settings.timeout
        self.discarded_before: dict[str, int] = {}  # per node, just before the kill

    def left(self, cap: float | None = None) -> float:
        rest = max(0.0, self.deadline - time.monotonic())
        return rest if cap is None else min(rest, cap)

    def _crawl_request(self) -> jobs_pb2.StartCrawlRequest:
        root = self.site.root if self.site is not None else self.s.site
        req = jobs_pb2.StartCrawlRequest(
            url=root,
            exclude_paths=self.site.exclude if self.site is not None else [],
            limit=0 if self.site is not None else self.s.pages,
            max_concurrency=self.s.concurrency,
            delay=self.s.pace,
            webhook=jobs_pb2.Webhook(url=self.hook_url),
            idempotency_key=f"drill-{uuid.uuid4()}",
        )
        if self.s.page_retries is not None:
            req.max_retries = self.s.page_retries
        return req

    async def observe(self) -> tuple[Observation, bool]:
        """The run's observation, and whether the pair is fit for another run."""
        found = await _current_roles(self.client, self.pair, self.left(PAIR_READY_S))
        if found is None:
            raise SetupError("the pair is not up (one primary and a connected standby)")
        primary, standby = found
        s = self.s
        victim = {"primary": primary, "standby": standby, "witness": WITNESS}[s.kill]
        survivor = standby if s.kill == "primary" else primary
        obs = Observation(
            run=self.n, mode=s.mode, auto=s.auto, kill=s.kill, killed=victim,
            survivor=survivor, kill_after_pages=0,
            witness_ttl=s.witness_ttl if s.auto else None,
        )  # fmt: skip
        if self.site is not None:
            obs.required_urls = self.site.required()
            obs.optional_urls = self.site.optional()
        total = len(obs.required_urls) if obs.required_urls is not None else s.pages
        obs.kill_after_pages = kill_point(total, self.rng.random())

        obs.job_id = await self.client.start_crawl(self._crawl_request())
        self.say(
            f"run {self.n}: crawl {obs.job_id} on {self.pair.label(primary)}; "
            f"the {s.kill} ({self.pair.label(victim) if victim != WITNESS else 'etcd'}) dies after "
            f"{obs.kill_after_pages} of ~{total} pages"
        )
        follower = Follower(self.client, obs.job_id)
        following = asyncio.create_task(follower.run(), name="drill-follower")
        healthy = True
        try:
            if not await follower.wait_shown(obs.kill_after_pages, self.left()):
                raise SetupError(
                    f"the crawl showed only {len(follower.shown)} of "
                    f"{obs.kill_after_pages} pages before it ended or the time ran out "
                    "(a larger site, --pages, or a slower --pace)"
                )
            try:
                await self._kill_and_recover(obs, primary, standby, victim, survivor)
            except _Broken as why:
                obs.problems.append(str(why))
                healthy = False
            await self._collect(obs, follower)
        finally:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await cancel_and_wait(following)
        obs.shown = list(follower.shown)
        return obs, healthy

    async def _kill_and_recover(
        self, obs: Observation, primary: str, standby: str, victim: str, survivor: str
    ) -> None:
        s, client, pair = self.s, self.client, self.pair
        seen = await roles(client, pair.addresses)
        self.discarded_before = {a: r.discarded for a, r in seen.items() if r is not None}
        before = seen.get(primary)
        if before is not None:
            obs.lag_offsets, obs.lag_seconds = before.lag_offsets, before.lag_seconds
            obs.sync_degraded = before.sync_degraded
        obs.kill_at = time.monotonic()
        await pair.kill(victim)
        targets = pair.addresses if s.kill == "witness" else [survivor]
        prober = Prober(client, targets, self._probe_url())
        done = refused_then_accepted if s.kill == "witness" else first_accepted
        probing = asyncio.create_task(prober.run(done, self.left()), name="drill-prober")
        try:
            if s.kill == "witness":
                await self._witness_outage(prober)
            else:
                await self._node_failover(obs, primary, standby, victim, survivor)
            if not await asyncio.wait_for(asyncio.shield(probing), self.left() + 1.0):
                raise _Broken("no write was accepted after the kill")
        except TimeoutError:
            raise _Broken("no write was accepted after the kill") from None
        finally:
            await cancel_and_wait(probing)
            obs.probes = list(prober.probes)

    def _probe_url(self) -> str:
        return self.site.probe_url if self.site is not None else self.s.site

    async def _node_failover(
        self, obs: Observation, primary: str, standby: str, victim: str, survivor: str
    ) -> None:
        s, client, pair = self.s, self.client, self.pair
        gone = await wait_for(
            lambda: _none_if_answers(client, victim), self.left(DOWN_S), interval=0.1
        )
        if gone is None:
            raise SetupError(f"{pair.label(victim)} still answers after the kill")
        new_primary = primary
        if s.kill == "primary":
            new_primary = survivor
            if s.auto:
                won = await wait_for(
                    lambda: _is_primary(client, survivor),
                    self.left(3 * s.witness_ttl + 15.0),
                    interval=0.05,
                )
                if won is None:
                    raise _Broken(f"the witness did not make {pair.label(survivor)} primary")
            else:
                promoted = await client.promote(survivor)
                self.say(
                    f"run {self.n}: promoted {pair.label(survivor)} "
                    f"(epoch {promoted.epoch}, switch offset {promoted.switch_offset})"
                )
        await pair.restart(victim, role="standby", primary=new_primary)
        rejoined = await wait_for(
            lambda: _rejoined(client, victim), self.left(REJOIN_S), interval=0.1
        )
        obs.rejoined = victim
        if rejoined is None:
            tail = pair.log_tail(victim)
            raise _Broken(
                f"{pair.label(victim)} did not rejoin as a standby"
                + (f"; its log ends:\n{tail}" if tail else "")
            )
        obs.resync = "full" if rejoined.full_resyncs else "continue"
        obs.discarded = rejoined.discarded

    async def _witness_outage(self, prober: Prober) -> None:
        """etcd is down: wait for the primary to refuse a write, then restart etcd."""
        ttl = self.s.witness_ttl
        refused = await wait_for(
            lambda: _true_if(any(not p.accepted for p in prober.probes)),
            self.left(2 * ttl + 5.0),
        )
        await self.pair.restart(WITNESS, role="", primary="")
        if refused is None:  # the probe would wait for a refusal to the drill's end
            raise _Broken(
                f"writes still accepted {2 * ttl + 5:g} s after etcd died (a witness kill "
                "needs nodes with witness_failsafe = false)"
            )

    async def _collect(self, obs: Observation, follower: Follower) -> None:
        client = self.client

        async def ended() -> bool | None:
            job = await client.get_job(obs.job_id, status_only=True)
            terminal = (
                jobs_pb2.JOB_STATE_COMPLETED,
                jobs_pb2.JOB_STATE_FAILED,
                jobs_pb2.JOB_STATE_CANCELLED,
            )
            return True if job.state in terminal else None

        if await wait_for(ended, self.left(), interval=0.2) is None:
            obs.problems.append("the crawl did not end in time")
        try:
            obs.final = await final_job(client, obs.job_id)
        except grpc.aio.AioRpcError as err:
            obs.problems.append(f"could not read the job: {err.code().name}")
            return
        final = obs.final
        await self.receiver.wait_for(
            lambda: webhook_tally(final, self.receiver.of(obs.job_id)).lost == 0,
            self.left(WEBHOOKS_S),
        )
        await asyncio.sleep(0.3)  # a late re-send would come now, before anything else
        obs.deliveries = self.receiver.of(obs.job_id)
        await self._digests(obs)

    async def _digests(self, obs: Observation) -> None:
        found = await _current_roles(self.client, self.pair, self.left(REJOIN_S))
        if found is None:
            obs.problems.append("no primary with a connected standby to compare")
            return
        primary, standby = found
        if obs.kill == WITNESS:
            await self._after_witness(obs, standby)
        try:
            res = await verify_digests(
                self.client.admin_stub(primary),
                self.client.admin_stub(standby),
                per_call_seconds=5.0,
            )
        except (TimeoutError, grpc.aio.AioRpcError) as err:
            obs.problems.append(f"digests: {err}")
            return
        obs.digests_equal, obs.digest_offset = res.equal, res.offset

    async def _after_witness(self, obs: Observation, standby: str) -> None:
        """No node was restarted; but if the election moved the primary, the old one
        now follows the new one: how it resynced, and what it dropped in this run."""
        r = await role_of(self.client, standby)
        if r is None:
            return
        obs.discarded = r.discarded - self.discarded_before.get(standby, 0)
        if standby == obs.survivor:  # the primary before the kill is the standby now
            obs.rejoined = standby
            obs.resync = "full" if r.full_resyncs else "continue"
        else:
            obs.resync = "none"


async def _none_if_answers(client: JobClient, address: str) -> bool | None:
    return None if await role_of(client, address, timeout=0.5) is not None else True


async def _is_primary(client: JobClient, address: str) -> bool | None:
    r = await role_of(client, address, timeout=1.0)
    return True if r is not None and r.role == rpb.NODE_ROLE_PRIMARY else None


async def _rejoined(client: JobClient, address: str) -> rpb.RoleResponse | None:
    r = await role_of(client, address, timeout=1.0)
    if r is None or r.role != rpb.NODE_ROLE_STANDBY or not r.connected:
        return None
    return r if r.full_resyncs + r.continues > 0 else None


async def _true_if(cond: bool) -> bool | None:
    return True if cond else None


async def run_drill(s: DrillSettings, say: Say) -> list[RunReport]:
    """Every run's report (see the module docstring); SetupError when the drill could
    not start what it needs or was given."""
    workdir = Path(tempfile.mkdtemp(prefix="pagesift-drill-"))
    reports: list[RunReport] = []
    rng = random.Random(s.seed)
    async with contextlib.AsyncExitStack() as stack:
        if s.keep:
            say(f"working directory (kept): {workdir}")
        else:
            stack.callback(remove_workdir, workdir)
        site: DemoSite | None = None
        if not s.site:
            site = DemoSite(s.pages, seed=1, host=s.callback_host)
            stack.push_async_callback(site.stop)
            await site.start()
        receiver = Receiver(s.keys.webhook_secret, host=s.callback_host)
        stack.push_async_callback(receiver.stop)
        hook_url = await receiver.start()
        pair: Pair
        if s.local:
            # a witness kill rehearses the lease running out, which failsafe (on by
            # default) would ride through while the standby vouches: those nodes run
            # without it (tests/test_failsafe_faults.py proves the failsafe side)
            settings = {**NODE_SETTINGS, "witness_failsafe": s.kill != WITNESS}
            pair = LocalPair(
                workdir, s.keys, mode=s.mode, auto=s.auto, witness_ttl=s.witness_ttl,
                settings=settings,
            )  # fmt: skip
        else:
            pair = CommandPair(
                s.primary, s.standby, kill_cmd=s.kill_cmd, start_cmd=s.start_cmd,
                auto=s.auto, workdir=workdir, command_timeout=s.command_timeout,
            )  # fmt: skip
        stack.push_async_callback(pair.close)
        await pair.start()
        client = JobClient(
            pair.addresses,
            api_key=s.keys.api_key,
            admin_key=s.keys.admin_key,
            tls_ca=s.tls_ca,
            timeout=30.0,
        )
        stack.push_async_callback(client.close)
        if await _current_roles(client, pair, PAIR_READY_S) is None:
            tails = "\n".join(pair.log_tail(a, 8) for a in pair.addresses)
            raise SetupError(
                "the pair did not come up (one primary and a connected standby)"
                + (f":\n{tails}" if tails.strip() else "")
            )
        say(f"pair up: {', '.join(pair.label(a) for a in pair.addresses)}; seed {s.seed}")
        for n in range(1, s.repeat + 1):
            run = _Run(n, s, client, pair, receiver, hook_url, site, rng, say)
            obs, healthy = await run.observe()
            reports.append(judge(obs))
            if not healthy:
                break
    return reports
