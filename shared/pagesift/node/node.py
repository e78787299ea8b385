"""``Node``: one running node of a pair, its role, and its role changes.

Roles (``Role``): ``primary`` (writable log, job runtime running), ``standby`` (a
follower applies the primary's log; reads only), ``fenced`` (a higher epoch deposed
this primary: job runtime stopped, reads only, until restarted as a standby).

Role changes, and what each one wires:

- start as primary: the log opens for writes (refused for a standby's or a deposed
  primary's data directory), then the job runtime (``pagesift.primary``) starts;
- start as standby: a follower and a promoter (``pagesift.standby``), and, with
  ``auto_promote_after``, a watchdog;
- promotion (standby -> primary): the job runtime starts, and fencing deposes the
  primary this node used to follow;
- fenced (primary -> fenced): the job runtime stops.

The gRPC server around it is ``pagesift.node.grpcserver``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc

from pagesift.node.replication import ReplicationParts
from pagesift.node.status import figures
from pagesift.primary import webhooks
from pagesift.primary.fetch import HttpEngine
from pagesift.primary.jobs import Jobs
from pagesift.primary.replication import ReplicationServicer
from pagesift.shared import tls
from pagesift.shared.accounts import Accounts
from pagesift.shared.config import ServerConfig
from pagesift.shared.events import JobEvents
from pagesift.shared.identity import Fenced
from pagesift.shared.jobservice import JobRuntime
from pagesift.shared.metrics import Metrics, ReplicationFigures
from pagesift.shared.roles import Role
from pagesift.shared.slot import open_slot
from pagesift.shared.store import Store
from pagesift.standby.follower import Follower
from pagesift.standby.promotion import Promoter

logger = logging.getLogger("pagesift.server")

#: The shortest replication token accepted (``secrets.token_urlsafe(32)`` gives 43).
MIN_TOKEN_CHARS = 16


class StartRefused(RuntimeError):
    """The data directory does not allow the role asked for (see ``Node.start``)."""


class Node:
    """The running node: its store slot, its role, and (as primary) its job runtime."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.node_id = _node_id(config.data)
        self.events = JobEvents()
        self.accounts = Accounts.load(Path(config.accounts_file) if config.accounts_file else None)
        for warning in self.accounts.warnings:
            logger.warning("%s", warning)
        self.replication_token = _read_token(config.replication_token_file)
        self.slot = open_slot(config.data, fsync=config.fsync, backlog_bytes=config.backlog_bytes)
        self.slot.store.add_observer(self.events)
        self.slot.add_listener(lambda store, _log: store.add_observer(self.events))
        self.metrics = Metrics()
        self.metrics.jobs_store = lambda: self.slot.store
        self.metrics.webhook_queue_depth = lambda: webhooks.queue_depth(self.slot.store)
        self.metrics.replication = self._replication_figures
        self.parts = ReplicationParts(
            self.slot,
            node_id=self.node_id,
            address=_advertised(config.listen),
            on_fenced=self._on_fenced,
            mode=config.replication_mode,
            sync_timeout=config.sync_timeout,
        )
        self.jobs: Jobs | None = None
        self.engine: HttpEngine | None = None
        self.role = Role(config.role)
        self._watchdog: asyncio.Task[None] | None = None
        self._fencer: asyncio.Task[str] | None = None
        self.deposed_by = ""  # fenced: where the node that deposed us serves, if it said
        # how this node reaches the primary it follows (reused to fence it after a promotion)
        self._peer_credentials: grpc.ChannelCredentials | None = None
        self._peer_metadata: tuple[tuple[str, str], ...] = (
            tls.token_metadata(self.replication_token) if self.replication_token else ()
        )

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

    def primary_hint(self) -> str:
        if self.role == Role.FENCED:
            where = self.deposed_by or "the promoted node"
            return f"{where} (this one was deposed by a higher epoch)"
        told = self.follower.primary_address if self.follower is not None else ""
        return self.config.primary_public or told or self.config.primary or "(unknown)"

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
        if not replication_credential(self.config):
            if self.role == Role.STANDBY:
                raise StartRefused(
                    "a standby needs a replication credential: replication_token_file "
                    "(the same file on both nodes) or replication_ca + replication_cert + "
                    "replication_key (mTLS)"
                )
            logger.warning(
                "no replication credential (replication_token_file or mTLS): this node "
                "serves its log to nobody, so no standby can follow it"
            )
        if self.role == Role.PRIMARY:
            if self.slot.log.persisted_role == Role.STANDBY:
                raise StartRefused(
                    "this data directory belongs to a standby: promote it (pagesift promote) "
                    "or start it with --role standby; starting it as a primary would fork "
                    "its primary's history"
                )
            try:
                self.slot.log.open_for_writes()
            except Fenced as e:
                raise StartRefused(f"refusing to start as a primary: {e}") from None
            await self._start_jobs()
        else:
            cfg = self.config
            if cfg.replication_ca or cfg.replication_cert:
                self._peer_credentials = tls.channel_credentials(
                    cfg.replication_ca or None,
                    cfg.replication_cert or None,
                    cfg.replication_key or None,
                )
            self.parts.enable_promotion(self._promoted)
            self.parts.follow(
                cfg.primary, credentials=self._peer_credentials, metadata=self._peer_metadata
            )
            if cfg.auto_promote_after > 0:
                self._watchdog = asyncio.create_task(self._auto_promote(cfg.auto_promote_after))

    async def _auto_promote(self, after: float) -> None:
        """``--auto-promote-after``: promote once the primary has been silent that long.

        UNSAFE without an outside witness: a primary that is alive but cut off from
        this standby keeps serving, and both accept writes until it is fenced.
        """
        silent_since: float | None = None
        while self.role == Role.STANDBY and self.follower is not None:
            await asyncio.sleep(min(0.5, after / 4))
            st = self.follower.status()
            if st.connected:
                silent_since = None
                continue
            now = time.monotonic()
            silent_since = silent_since or now
            if now - silent_since >= after and self.slot.log.history_id and self.promoter:
                logger.warning(
                    "the primary has been silent for %.1f s: auto-promoting (unsafe without "
                    "an outside witness)",
                    now - silent_since,
                )
                await self.promoter.promote()
                return

    async def _promoted(self) -> None:
        self.role = Role.PRIMARY
        await self._start_jobs()
        if self.config.primary:
            self._fencer = self.parts.fence_former_primary(
                self.config.primary,
                still_primary=lambda: self.role == Role.PRIMARY,
                credentials=self._peer_credentials,
                metadata=self._peer_metadata,
            )

    async def _start_jobs(self) -> None:
        cfg = self.config
        self.engine = HttpEngine(cfg, metrics=self.metrics)
        deliverer = webhooks.Deliverer(
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
        self.jobs = Jobs(
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
        """Sync mode: wait for the standby to apply ``offset`` (None: all so far)."""
        target = self.slot.log.last_offset if offset is None else offset
        return await self.replication.wait_replicated(target)

    def _replication_figures(self) -> ReplicationFigures:
        return figures(self.parts.status(self.role))

    async def _on_fenced(self, epoch: int, by: str) -> None:
        logger.warning(
            "fenced by epoch %d: this primary stops writing; restart it with --role standby "
            "--primary %s to rejoin",
            epoch,
            by or "<the promoted node>",
        )
        self.deposed_by = by
        self.role = Role.FENCED
        await self._stop_jobs()

    async def _stop_jobs(self) -> None:
        jobs, self.jobs = self.jobs, None
        engine, self.engine = self.engine, None
        if jobs is not None:
            await jobs.close()
        if engine is not None:
            await engine.close()

    async def close(self) -> None:
        for task in (self._watchdog, self._fencer):
            if task is not None:
                task.cancel()
        await self.parts.close()
        await self._stop_jobs()
        self.slot.close()


def replication_credential(config: ServerConfig) -> str:
    """What this node's replication stream trusts ("token", "mtls"), or "" for nothing."""
    if config.replication_token_file:
        return "token"
    if config.replication_listen or config.replication_ca or config.replication_cert:
        return "mtls"
    return ""


def _read_token(file: str) -> str:
    """The replication token in ``file`` ("" without one); refuses a short one."""
    if not file:
        return ""
    try:
        token = Path(file).read_text().strip()
    except OSError as e:
        raise StartRefused(f"replication_token_file {file}: {e.strerror or e}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise StartRefused(
            f"replication_token_file {file}: the token has {len(token)} characters, "
            f"fewer than {MIN_TOKEN_CHARS} (make one: pagesift token new FILE)"
        )
    return token


def _advertised(listen: str) -> str:
    """``listen`` as an address peers can hand to clients; "" for a wildcard host."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    return "" if host in ("", "0.0.0.0", "::") else listen


def _node_id(data: Path) -> str:
    """A stable id for this data directory (replication peers tell nodes apart by it)."""
    data.mkdir(parents=True, exist_ok=True)
    path = data / "NODE_ID"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(uuid.uuid4().hex[:16])
        tmp.replace(path)
    return path.read_text().strip()
