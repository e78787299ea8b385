"""``Node``: one running node of a pair, its role, and its role changes.

Roles (``Role``): ``primary`` (writable log, job runtime running), ``standby`` (a
follower applies the primary's log; reads only), ``fenced`` (a higher epoch deposed
this primary: job runtime stopped, reads only; without a witness until restarted as a
standby, with one until it follows the lease's holder or wins the lease).

Role changes, and what each one wires:

- start as primary: the log opens for writes (refused for a standby's or a deposed
  primary's data directory), then the job runtime (``pagesift.primary``) starts;
- start as standby: a follower and a promoter (``pagesift.standby``), and, with
  ``auto_promote_after``, a watchdog;
- promotion (standby -> primary): the job runtime starts, and fencing deposes the
  primary this node used to follow;
- fenced (primary -> fenced): the job runtime stops;
- with a witness (``--witness``): no role at start; the elector (``pagesift.node.elector``,
  built from the configuration by ``pagesift.node.electorwiring``) reports who holds the
  lease: this node follows the holder, or wins and is promoted with the lease's epoch,
  and its jobs run only while it holds the lease; the log's write deadline
  (``Log.set_write_deadline``) follows the lease, on every store a full resync installs
  too.

Who decides: ``pagesift.core.ha.rolestate``, a pure state machine that holds the role
(the one place it is kept: ``Node.role``, the metrics and the Role RPC read it) and
decides every change above. ``Node`` is its asyncio shell: it feeds it events (start,
the watchdog's looks at the follower, the elector's view of the lease, a promotion
done, a higher epoch seen, the fencer's end, close) with ``time.monotonic()`` and
carries out the actions it returns.
The durable identity (epoch, history, fenced epoch, role last recorded) stays in the
log (``pagesift.core.replication.identity``), written before it takes effect.

The node's storage watcher (``pagesift.core.api.storagewatch``) runs on every role from
``start`` to ``close``: it keeps the data volume's reserve, brings the store back
after a disk-full or I/O error, and ``store_writable`` (health, the store series)
says whether the store takes writes now.

The event-loop lag monitor (``pagesift.node.looplag``) runs on every role too, from
``start`` to ``close``.

The gRPC server around it is ``pagesift.node.grpcserver``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from pagesift.coord.registry import Registrar
from pagesift.core.api import tls
from pagesift.core.api.errortable import NO_PRIMARY_NOW
from pagesift.core.api.metrics import Metrics
from pagesift.core.api.metricsources import (
    BrowserFigures,
    ReplicationFigures,
    ScrapeSources,
    WitnessGauges,
)
from pagesift.core.api.ports import JobRuntime
from pagesift.core.api.storagewatch import StorageWatcher
from pagesift.core.config.schema import ServerConfig
from pagesift.core.ha import rolestate
from pagesift.core.ha.election import Candidate
from pagesift.core.ha.failsafe import StandbyPromise
from pagesift.core.ha.fencingrules import FencingVerdict
from pagesift.core.ha.roles import Role
from pagesift.core.ha.rolestate import (
    FencerDone,
    HigherEpochSeen,
    OpenForWrites,
    PrimaryHeard,
    PrimarySilent,
    Promote,
    Promoted,
    RefuseStart,
    RoleConfig,
    RoleState,
    Started,
    StartElection,
    StartFencer,
    StartFollower,
    StartJobs,
    StartWatchdog,
    StepDown,
    StopElection,
    StopFencer,
    StopFollower,
    StopJobs,
    Stopping,
    StopWatchdog,
    Tick,
)
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.jobs.events import JobEvents
from pagesift.core.replication import backlog
from pagesift.core.replication.identity import Fenced
from pagesift.core.store.db import Store
from pagesift.core.util.tasks import cancel_and_wait
from pagesift.node import clustering, electorwiring
from pagesift.node.elector import CLOSED, Elector, ElectorHost
from pagesift.node.looplag import LoopLagMonitor
from pagesift.node.replicationparts import ReplicationParts
from pagesift.node.startup import (
    StartRefused,
    advertised,
    lock_data_dir,
    node_id,
    open_slot_or_refuse,
    read_token,
    replication_credential,
)
from pagesift.node.status import RoleStatus, figures
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.interface import Engine
from pagesift.primary.engine.rendering import RenderingEngine, render_status
from pagesift.primary.jobs.runtime import Jobs
from pagesift.primary.replication import ReplicationServicer
from pagesift.primary.webhooks import delivery, outbox
from pagesift.standby.follower import Follower
from pagesift.standby.promotion import Promoter

logger = logging.getLogger("pagesift.server")


#: Builds the engine of the job runtime each time this node starts its jobs (as primary).
EngineFactory = Callable[[ServerConfig, Metrics], Engine]


def http_engine(config: ServerConfig, metrics: Metrics) -> Engine:
    """The engine a node runs: ``RenderingEngine`` (per request, HTTP through
    ``HttpEngine`` or a render), with the browser pool and its guard proxy when
    ``browser_executable`` is set (nothing is launched before the first render)."""
    http = HttpEngine(config, metrics=metrics)
    return RenderingEngine(http, render=bool(config.browser_executable))


class Node:
    """The running node: its store slot, its role, and (as primary) its job runtime."""

    def __init__(self, config: ServerConfig, engine_factory: EngineFactory = http_engine) -> None:
        """``engine_factory``: the job runtime's engine (tests hand in an in-process one,
        ``tests/fakeengine.py``, where the test is about job logic, not fetching).
        The data directory's lock first: no other step runs without it (``startup``)."""
        self._data_lock = lock_data_dir(config.data)
        try:
            self._build(config, engine_factory)
        except BaseException:  # a refused start gives the store, then the lock, back
            if (slot := self.__dict__.get("slot")) is not None:
                slot.close()
            self._data_lock.release()
            raise

    def _build(self, config: ServerConfig, engine_factory: EngineFactory) -> None:
        self.config = config
        self._engine_factory = engine_factory
        self.node_id = node_id(config.data)
        self.events = JobEvents()
        self.accounts = Accounts.load(Path(config.accounts_file) if config.accounts_file else None)
        for warning in self.accounts.warnings:
            logger.warning("%s", warning)
        self.replication_token = read_token(config.replication_token_file)
        self.slot = open_slot_or_refuse(config)
        self.slot.store.add_observer(self.events)
        self.slot.add_listener(lambda store, _log: store.add_observer(self.events))
        # with a witness, no write before a lease is won (the elector moves it); the
        # deadline carries over to the log of a store a full resync installs
        self._write_deadline: float | None = CLOSED if config.witness else None
        self.slot.log.set_write_deadline(self._write_deadline)
        self.slot.add_listener(lambda _store, log: log.set_write_deadline(self._write_deadline))
        self.storage = StorageWatcher(
            lambda: self.slot.store,
            config.data,
            reserve_bytes=config.storage_reserve_bytes,
            on_change=self.role_changed_set,
            consistent=self._store_matches_log,
        )
        # every scrape-time series reads the node's current store, log and engine
        self.metrics = Metrics(
            ScrapeSources(
                jobs_store=lambda: self.slot.store,
                webhook_queue_depth=lambda: outbox.queue_depth(self.slot.store),
                replication=self._replication_figures,
                witness=self._witness_gauges,
                storage=self.storage.figures,
                host_delays=self._host_delays,
                browser=self._browser_figures,
            )
        )
        #: "" when this node can render pages (a browser is installed), else why not;
        #: a standby checks it too: it renders once promoted (health, ``can_render``)
        self.render_problem = render_status(config)
        if self.render_problem:
            logger.warning("this node cannot render pages: %s", self.render_problem)
        # always on, whatever the role: how late the event loop runs what is due
        self.looplag = LoopLagMonitor(
            self.metrics, config.loop_lag_interval, config.loop_lag_warn_seconds
        )
        #: failsafe: this node's promise not to campaign, given by its followers (no
        #: promise before the elector sets ``own_ttl``)
        self.promise = StandbyPromise(own_ttl=0.0)
        self.parts = ReplicationParts(
            self.slot,
            node_id=self.node_id,
            address=advertised(config.listen),
            on_fenced=self._on_fenced,
            role=lambda: self.role,
            promise=self.promise,
            mode=config.replication_mode,
            sync_timeout=config.sync_timeout,
        )
        self.elector: Elector | None = None
        self._elector_task: asyncio.Task[None] | None = None
        self.jobs: Jobs | None = None
        self._stopped_jobs: Jobs | None = None  # its sync caps hold until a new role (visible)
        self.engine: Engine | None = None
        self._registration: tuple[Registrar, asyncio.Task[None]] | None = None
        # with ``cluster``: account limits held cluster-wide through etcd (ClusteredJobs)
        self.tenure = clustering.tenure_for(config)  # the hold on its pair's hosts
        self._make_jobs = clustering.jobs_factory(config, self.accounts, tenure=self.tenure)
        # the node's role, and what it runs: the one place it is kept (see ``rolestate``)
        self._state = RoleState.initial(
            RoleConfig(
                requested=Role(config.role),
                auto_promote_after=config.auto_promote_after,
                former_primary=config.primary,
                has_credential=bool(replication_credential(config)),
                witness=bool(config.witness),
                unsafe_auto_promote=config.unsafe_auto_promote,
            )
        )
        #: set whenever the role or ``takes_writes`` changes (the health publisher wakes)
        self.role_changed = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._fencer: asyncio.Task[FencingVerdict] | None = None
        # how this node reaches the primary it follows (reused to fence it after a promotion)
        self._peer_credentials: grpc.ChannelCredentials | None = None
        self._peer_metadata: tuple[tuple[str, str], ...] = (
            tls.token_metadata(self.replication_token) if self.replication_token else ()
        )

    @property
    def role(self) -> Role:
        """This node's role (``rolestate``: the one place it is kept)."""
        return self._state.role

    @property
    def takes_writes(self) -> bool:
        """The primary, holding its witness lease when it has a witness."""
        return rolestate.takes_writes(self._state)

    @property
    def store_writable(self) -> bool:
        """The store takes writes now (False while its volume is full or failed)."""
        return self.storage.writable

    def role_changed_set(self) -> None:
        self.role_changed.set()

    def _store_matches_log(self) -> str | None:
        """After a reopen: does the store end where the log's memory says? (A group
        whose commit raised yet turned out durable would not.)"""
        store, log = self.slot.store, self.slot.log
        ((key, _),) = backlog.tail_local(0, 0).items()
        raw = store.get_local(key)
        stored = int.from_bytes(raw[:8], "big") if raw else 0
        if stored != log.last_offset:
            return f"the store's log ends at {stored}, the log in memory at {log.last_offset}"
        return None

    @property
    def deposed_by(self) -> str:
        """Fenced: where the node that deposed us serves, if it said."""
        return self._state.deposed_by

    @property
    def replication(self) -> ReplicationServicer:
        """The ReplicationService this node serves (refusing while it is no primary)."""
        return self.parts.sender

    @property
    def follower(self) -> Follower | None:
        return self.parts.follower

    @property
    def promoter(self) -> Promoter | None:
        return self.parts.promoter

    def store(self) -> Store:
        return self.slot.store

    def runtime(self) -> JobRuntime | None:
        return self.jobs

    def visible(self, job_id: str) -> int | None:
        jobs = self.jobs if self.jobs is not None else self._stopped_jobs
        return jobs.visible(job_id) if jobs is not None else None

    def primary_hint(self) -> str:
        if self.role == Role.FENCED:
            where = self.deposed_by or "the promoted node"
            return f"{where} (this one was deposed by a higher epoch)"
        if self.role == Role.PRIMARY and self.elector is not None:  # lease lapsed: not itself
            return NO_PRIMARY_NOW
        told = self.follower.primary_address if self.follower is not None else ""
        named = self.elector.figures.leader if self.elector is not None else ""
        return self.config.primary_public or told or named or self.config.primary or "(unknown)"

    def read_metadata(self) -> Sequence[tuple[str, str]]:
        if self.follower is None or self.role != Role.STANDBY:
            return (("pagesift-role", self.role.value),)
        st = self.follower.status()
        return (
            ("pagesift-role", self.role.value),
            ("pagesift-applied-offset", str(st.applied_offset)),
            ("pagesift-lag-offsets", str(st.lag_offsets)),
            ("pagesift-lag-seconds", f"{st.lag_seconds:.3f}"),
        )

    async def start(self) -> None:
        self.looplag.start()
        await self.storage.start()
        self._registration = clustering.start_registrar(self)
        log = self.slot.log
        await self._carry_out(
            self._step(
                Started(
                    persisted_role=log.persisted_role,
                    epoch=log.epoch,
                    fenced_epoch=log.fenced_epoch,
                    synced=bool(log.history_id),
                )
            )
        )

    # --- the role machine's shell ----------------------------------------------------------
    def _step(self, event: rolestate.Event) -> list[rolestate.Action]:
        before = (self._state.role, self.takes_writes)
        self._state, actions = rolestate.step(self._state, event, time.monotonic())
        if (self._state.role, self.takes_writes) != before:
            self.role_changed.set()
        return actions

    async def _carry_out(self, actions: list[rolestate.Action]) -> None:
        for action in actions:
            match action:
                case RefuseStart(reason):
                    raise StartRefused(reason)
                case rolestate.LogLine(level, message):
                    logger.log(level, "%s", message)
                case OpenForWrites():
                    try:
                        self.slot.log.open_for_writes()
                    except Fenced as e:
                        raise StartRefused(f"refusing to start as a primary: {e}") from None
                case StartJobs():
                    await self._start_jobs()
                case StopJobs():
                    await self._stop_jobs()
                case StartFollower(target):
                    self._follow(target)
                case StopFollower():
                    await self.parts.close()
                case StartWatchdog(interval):
                    self._watchdog = asyncio.create_task(self._watch(interval))
                case StopWatchdog():
                    if self._watchdog is not None:
                        self._watchdog.cancel()
                case Promote(epoch):
                    promoter = self.promoter or self.parts.enable_promotion(self._promoted)
                    await promoter.promote(epoch=epoch)
                case StartFencer(former_primary):
                    self._start_fencer(former_primary)
                case StopFencer():
                    if self._fencer is not None:
                        self._fencer.cancel()
                case StartElection():
                    self._start_election()
                case StopElection():
                    await self._stop_election()
                case StepDown(epoch):
                    self.slot.log.step_down(epoch)

    def _follow(self, target: str) -> None:
        self._stopped_jobs = None  # the store follows the primary's from here
        cfg = self.config
        if cfg.replication_ca or cfg.replication_cert:
            self._peer_credentials = tls.channel_credentials(
                cfg.replication_ca or None,
                cfg.replication_cert or None,
                cfg.replication_key or None,
            )
        self.parts.enable_promotion(self._promoted)
        self.parts.follow(target, credentials=self._peer_credentials, metadata=self._peer_metadata)

    async def _watch(self, interval: float) -> None:
        """``--auto-promote-after``: tell the machine, every ``interval``, whether the
        primary is heard; it decides when to promote (see ``rolestate``)."""
        while self.role == Role.STANDBY and self.follower is not None:
            await asyncio.sleep(interval)
            synced = bool(self.slot.log.history_id)
            heard = self.follower.status().connected
            await self._carry_out(
                self._step(PrimaryHeard(synced) if heard else PrimarySilent(synced))
            )
            actions = self._step(Tick())
            await self._carry_out(actions)
            if any(isinstance(a, Promote) for a in actions):
                return

    async def _promoted(self) -> None:
        await self._carry_out(self._step(Promoted(self.slot.log.epoch)))

    def _start_fencer(self, former_primary: str) -> None:
        self._fencer = self.parts.fence_former_primary(
            former_primary,
            still_primary=lambda: self.role == Role.PRIMARY,
            credentials=self._peer_credentials,
            metadata=self._peer_metadata,
        )
        self._fencer.add_done_callback(self._fencer_done)

    def _fencer_done(self, task: asyncio.Task[FencingVerdict]) -> None:
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            logger.error("fencing the former primary failed", exc_info=exc)
            return
        actions = self._step(FencerDone(task.result()))
        assert not actions, actions  # the machine only records that the fencer ended

    async def _start_jobs(self) -> None:
        self._stopped_jobs = None  # the new runtime caps what it resumes
        cfg = self.config
        self.engine = self._engine_factory(cfg, self.metrics)
        self.engine.limit_renders(self._browser_pages_of)  # an engine without a browser: no-op
        deliverer = delivery.Deliverer(
            lambda: self.slot.store,
            None,
            secret_for=self.accounts.webhook_secret,
            allow_private_networks=cfg.allow_private_networks,
            max_attempts=cfg.webhook_max_attempts,
            base_delay=cfg.webhook_base_delay,
            max_delay=cfg.webhook_max_delay,
            timeout=cfg.webhook_timeout,
            metrics=self.metrics,
            # sync mode: POST an event only once the standby holds it, as GetJob shows pages
            wait_replicated=(lambda: self.wait_replicated(None))
            if cfg.replication_mode == "sync"
            else None,
        )
        sync = cfg.replication_mode == "sync"
        self.jobs = self._make_jobs(
            self.slot.store,
            self.engine,
            cfg,
            accounts=self.accounts,
            deliverer=deliverer,
            metrics=self.metrics,
            wait_replicated=self.wait_replicated if sync else None,
            on_visible=self.events.notify,
        )
        await self.jobs.start()

    async def wait_replicated(self, offset: int | None) -> bool:
        """Sync mode: wait for the standby to apply ``offset`` (None: all so far). With a
        witness, a write about to be acknowledged unconfirmed is first recorded there
        (``Elector.record_out_of_sync``), so that the standby does not take over."""
        target = self.slot.log.last_offset if offset is None else offset
        replicated = await self.replication.wait_replicated(target)
        if not replicated and self.elector is not None:
            await self.elector.record_out_of_sync()
        return replicated

    # --- the witness -----------------------------------------------------------------------
    def _start_election(self) -> None:
        cfg = self.config
        witness = electorwiring.witness_of(cfg)
        host = ElectorHost(
            me=electorwiring.holder_of(cfg, self.node_id),
            mode=cfg.replication_mode,
            candidate=self._candidate,
            pair_state=lambda epoch: electorwiring.pair_state(
                cfg, self.node_id, self.slot.log, self.replication, epoch
            ),
            set_write_deadline=self._set_write_deadline,
            feed=self._feed,
            is_primary=lambda: self.role == Role.PRIMARY,
            promise=self.promise if cfg.witness_failsafe else None,
        )
        self.elector = Elector(witness, host, ttl=cfg.witness_ttl, failsafe=cfg.witness_failsafe)
        if cfg.witness_failsafe:  # the standby's promise and the primary's request: one ttl
            self.promise.own_ttl = self.elector.ttl
            self.replication.enable_failsafe(self.elector.ttl, self.elector.grant_acked)
        self._elector_task = asyncio.create_task(self.elector.run())
        self._elector_task.add_done_callback(_log_failure)

    async def _stop_election(self) -> None:
        task, self._elector_task = self._elector_task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _feed(self, event: rolestate.Event) -> None:
        await self._carry_out(self._step(event))

    def _set_write_deadline(self, deadline: float) -> None:
        self._write_deadline = deadline
        self.slot.log.set_write_deadline(deadline)

    def _candidate(self) -> Candidate:
        log = self.slot.log
        return Candidate(self.node_id, log.history_id, log.last_offset, self.promise.until)

    def _host_delays(self) -> dict[str, float] | None:
        """The slowed hosts of the engine running now (None: no engine runs)."""
        engine = self.engine
        return engine.host_delays() if engine is not None else None

    @property
    def can_render(self) -> bool:
        """Whether this node renders pages (health's ``pagesift.render``)."""
        return not self.render_problem

    def _browser_pages_of(self, owner: str) -> int | None:
        """An account's cap on its pages rendering at once (None: the pool's only)."""
        account = self.accounts.get(owner)
        return account.max_browser_pages if account is not None else None

    def _browser_figures(self) -> BrowserFigures:
        """The browser series: the running engine's pool, else whether it could render."""
        engine = self.engine
        figures = engine.browser_figures() if engine is not None else None
        return figures if figures is not None else BrowserFigures(self.can_render, 0, 0, 0, 0, 0)

    def _witness_gauges(self) -> WitnessGauges | None:
        return electorwiring.witness_gauges(self.elector, self.replication, self.promise)

    def role_status(self) -> RoleStatus:
        """This node's role and replication figures (``pagesift.node.status``)."""
        return self.parts.status()

    def _replication_figures(self) -> ReplicationFigures:
        return figures(self.role_status())

    async def _on_fenced(self, epoch: int, by: str) -> None:
        await self._carry_out(self._step(HigherEpochSeen(epoch, by)))

    async def _stop_jobs(self) -> None:
        jobs, self.jobs = self.jobs, None
        engine, self.engine = self.engine, None
        if jobs is not None:
            self._stopped_jobs = jobs  # reads stay capped where the standby confirmed
            await jobs.close()
        if engine is not None:
            await engine.close()

    async def close(self) -> None:
        registration, self._registration = self._registration, None
        if registration is not None:  # out of the cluster first: clients stop routing here
            await cancel_and_wait(registration[1])
            await registration[0].close()
        await self.looplag.stop()
        await self._carry_out(self._step(Stopping()))
        await self.storage.stop()
        self.slot.close()
        self._data_lock.release()  # last: the directory may be another process's from here


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.critical("the elector failed: this node takes no write", exc_info=exc)
