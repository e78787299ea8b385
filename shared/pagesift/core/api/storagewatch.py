"""Disk full is a state, not an accident: the node's storage watcher and its reserve.

What it owns
------------
- ``StorageWatcher``: the one task that notices the store refusing writes
  (``Store.refusing``, set by the write path on any RocksDB I/O error: see
  ``pagesift.core.store.db``), brings it back, and lets it take writes again. While the
  store refuses, running jobs wait at their next write (``pagesift.primary.jobs.committing``),
  ``pagesift.primary`` health is NOT_SERVING (``Node.store_writable``), writes answer
  UNAVAILABLE / ``STORAGE_UNAVAILABLE`` (``StorageErrors``) and reads answer as usual.
- The reserve: a ballast file ``{data}/storage.reserve`` of ``storage_reserve_bytes``
  (fully allocated), made at start when the volume has room for it. It is the room
  the node keeps for itself: when the volume fills, the watcher deletes it (and so
  does a node whose store cannot open on a full volume, ``release_reserve``), so that
  RocksDB can reopen (a reopen after a failed WAL append replays the WAL into a table
  file: it needs about one write buffer of space, 64 MiB by default) and compact.
  The node takes writes again only once the volume has room for the reserve AND for
  as much again (``free >= 2 * reserve``): the reserve is made again first, so the
  next incident finds it there.
- ``StorageErrors``: a server interceptor answering every RPC whose handler let
  ``StorageUnavailable`` escape with UNAVAILABLE / ``STORAGE_UNAVAILABLE`` (metadata
  ``cause``: ``no_space`` | ``io_error``), with no filesystem path in the message,
  instead of gRPC's UNKNOWN carrying RocksDB's text.
- ``storage_figures``: the scrape-time series (free bytes on the data volume from
  ``os.statvfs``, the volume's size, the reserve present, 1 while writes are refused).

The recovery steps (``decide``, pure: it takes what the watcher sees and names the
next step):

1. RocksDB met the full volume (writes refused for ``no_space``, the instance
   failed) and the reserve is there: delete it (``RELEASE``);
2. the RocksDB instance failed (its error is sticky) or is the read-only stand-in:
   ``Store.reopen`` (``REOPEN``; retried with a capped backoff while it fails);
3. a reserve is configured and missing: wait until ``free >= 2 * reserve``
   (``WAIT_FOR_SPACE``), then make it (``RESTORE``);
4. ``Store.probe`` writes one node-local key (never replicated) through RocksDB; when
   it succeeds the store takes writes again (``RESUME``).

While the store takes writes, the watcher only looks every ``interval`` (an
attribute read, and a ``statvfs`` while the reserve is missing) and makes a missing
reserve once there is room for it.

Why it is safe
--------------
No durable state changes while writes fail: a paused job is a task waiting in
memory, and the page group whose commit failed simply did not commit (its caller
runs it again). The reserve is deleted only by this watcher and only when the volume
is full, so it is there for the next incident as soon as the volume allows it. A
probe writes a node-local key in a group of its own: no op, no log entry, nothing a
standby sees. After a reopen the store is checked against the replication log
(``consistent``): if a group the log never finished turned out durable, the store
keeps refusing writes (a restart reloads the log from the store).

Limits: the reopen runs on the event loop thread (so no reader there meets the swap)
and blocks it for the WAL's replay, once per incident. A filesystem that cannot
allocate ahead (copy-on-write: btrfs, ZFS) makes the reserve approximate.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pagesift.core.api import errortable
from pagesift.core.api.interceptors import Behavior, rewrap
from pagesift.core.api.metricsources import StorageFigures
from pagesift.core.api.tls import Handler, ServerInterceptor
from pagesift.core.store.db import Store
from pagesift.core.store.errors import IO_ERROR, NO_SPACE, StorageUnavailable
from pagesift.core.util.backoff import backoff_delay
from pagesift.core.util.tasks import cancel_and_wait

__all__ = [
    "RESERVE_FILE",
    "Look",
    "Step",
    "StorageErrors",
    "StorageWatcher",
    "decide",
    "release_reserve",
    "volume_bytes",
]

logger = logging.getLogger("pagesift.storage")

RESERVE_FILE = "storage.reserve"
_CHUNK = 1 << 20


class Step(enum.Enum):
    HEALTHY = "healthy"  # writes taken, nothing to do
    RELEASE = "release"  # delete the reserve: the volume is full
    REOPEN = "reopen"  # clear RocksDB's sticky error
    WAIT_FOR_SPACE = "wait_for_space"  # no room for the reserve yet
    RESTORE = "restore"  # make the reserve
    RESUME = "resume"  # probe, then take writes again


@dataclass(frozen=True)
class Look:
    """What the watcher sees: why writes are refused (None: they are not), whether
    the store needs a reopen, the reserve present and wanted, the volume's free bytes."""

    refusing: str | None
    needs_reopen: bool
    reserve_present: int
    reserve_wanted: int
    free: int


def decide(look: Look) -> Step:
    """The next step of recovery (module docstring), or ``HEALTHY`` / ``RESTORE``
    while writes are taken (a missing reserve is made once there is room)."""
    missing = look.reserve_wanted > 0 and look.reserve_present < look.reserve_wanted
    room = look.free >= 2 * look.reserve_wanted
    if look.refusing is None:
        return Step.RESTORE if missing and room else Step.HEALTHY
    if look.refusing == NO_SPACE and look.needs_reopen and look.reserve_present > 0:
        return Step.RELEASE  # RocksDB met the full volume: give it the room
    if look.needs_reopen:
        return Step.REOPEN
    if missing:
        return Step.RESTORE if room else Step.WAIT_FOR_SPACE
    return Step.RESUME


def release_reserve(data_dir: Path) -> int:
    """Delete the reserve file of ``data_dir`` (a node whose store cannot open on a
    full volume); returns the bytes it held (0: there was none)."""
    path = Path(data_dir) / RESERVE_FILE
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


def volume_bytes(path: Path) -> tuple[int, int]:
    """(free bytes an unprivileged writer may use, the volume's size) at ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


class StorageWatcher:
    """The node's storage watcher (module docstring). ``store`` is read at each use
    (a resync replaces the store); ``on_change`` runs when writes stop or resume."""

    def __init__(
        self,
        store: Callable[[], Store],
        data_dir: Path,
        *,
        reserve_bytes: int,
        on_change: Callable[[], None] = lambda: None,
        consistent: Callable[[], str | None] = lambda: None,
        interval: float = 0.25,
        base_delay: float = 0.05,
        max_delay: float = 1.0,
    ) -> None:
        self._store = store
        self.data_dir = Path(data_dir)
        self.reserve_path = self.data_dir / RESERVE_FILE
        self.reserve_bytes = reserve_bytes
        self._on_change = on_change
        self._consistent = consistent
        self._interval = interval
        self._base = base_delay
        self._cap = max_delay
        self._task: asyncio.Task[None] | None = None
        self._was_refusing = False
        self._fatal: str | None = None  # the store disagrees with the log: restart
        self.episodes = 0  # times the store started refusing writes (seen here)

    # figures ---------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        return self._store().refusing is None

    def reserve_present(self) -> int:
        try:
            return self.reserve_path.stat().st_size
        except FileNotFoundError:
            return 0

    def figures(self) -> StorageFigures:
        free, size = volume_bytes(self.data_dir)
        return StorageFigures(free, size, self.reserve_present(), not self.writable)

    def look(self) -> Look:
        store = self._store()
        refusing = store.refusing
        return Look(
            refusing=refusing.reason if refusing is not None else None,
            needs_reopen=store.needs_reopen,
            reserve_present=self.reserve_present(),
            reserve_wanted=self.reserve_bytes,
            free=volume_bytes(self.data_dir)[0],
        )

    # life cycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Make the reserve when there is room (a full volume is not refused: the
        node starts, and the watcher makes it later), then watch."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._remove_partial()
        if decide(self.look()) is Step.RESTORE:
            await self._restore()
        elif self.reserve_bytes and self.reserve_present() < self.reserve_bytes:
            logger.warning(
                "storage: no room for the %d-byte reserve on %s yet (needs twice that free)",
                self.reserve_bytes,
                self.data_dir,
            )
        self._task = asyncio.create_task(self._run(), name="storage-watcher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    # the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        attempt = 0
        while True:
            try:
                progressed = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or an odd filesystem: keep watching, say it
                logger.exception("storage watcher: a step failed")
                progressed = False
            self._notice()
            if self.writable:
                attempt = 0
                await asyncio.sleep(self._interval)
            elif progressed:
                attempt = 0  # the next step at once
            else:
                await asyncio.sleep(backoff_delay(attempt, base=self._base, cap=self._cap))
                attempt += 1

    def _notice(self) -> None:
        refusing = not self.writable
        if refusing != self._was_refusing:
            self._was_refusing = refusing
            if refusing:
                self.episodes += 1
                logger.warning("storage: the store refuses writes; jobs pause")
            else:
                logger.warning("storage: the store takes writes again; jobs resume")
            self._on_change()

    async def step(self) -> bool:
        """Take the next step (``decide``); True when it made progress."""
        if self._fatal is not None:
            return False
        look = self.look()
        step = decide(look)
        store = self._store()
        match step:
            case Step.HEALTHY:
                return False
            case Step.RELEASE:
                self._release()
                return True
            case Step.REOPEN:
                try:
                    store.reopen()  # on the loop thread: no reader sees the swap
                except StorageUnavailable:
                    return False
                problem = self._consistent()
                if problem is not None:
                    logger.critical("storage: after the reopen %s; restart the node", problem)
                    self._fatal = problem
                    store.refuse_writes(IO_ERROR)
                    return False
                return True
            case Step.WAIT_FOR_SPACE:
                return False
            case Step.RESTORE:
                return await self._restore()
            case Step.RESUME:
                try:
                    store.probe()
                except StorageUnavailable:
                    return False
                store.accept_writes()
                return True
        return False  # pragma: no cover - every Step is matched above

    # the reserve -----------------------------------------------------------------------
    def _release(self) -> None:
        size = release_reserve(self.data_dir)
        logger.warning("storage: the volume is full: released the %d-byte reserve", size)

    def _remove_partial(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.reserve_path.with_name(self.reserve_path.name + ".tmp").unlink()
        present = self.reserve_present()
        if present and present != self.reserve_bytes:
            self.reserve_path.unlink()  # a crash cut it short, or the setting changed

    async def _restore(self) -> bool:
        try:
            await asyncio.to_thread(_allocate, self.reserve_path, self.reserve_bytes)
        except OSError as e:
            with contextlib.suppress(FileNotFoundError):
                self.reserve_path.unlink()
            logger.warning("storage: cannot make the reserve: %s", e.strerror or e)
            return False
        logger.info("storage: reserve of %d bytes in place", self.reserve_bytes)
        return True


def _allocate(path: Path, size: int) -> None:
    """A file of ``size`` bytes whose blocks are allocated (``posix_fallocate``; zeros
    written where the filesystem cannot), made under a temporary name, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate: zeros
                raise
            zeros = bytes(_CHUNK)
            left = size
            while left > 0:
                left -= os.write(fd, zeros[: min(left, _CHUNK)])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    os.close(fd)
    tmp.replace(path)


# ------------------------------------------------------------------ the RPC side


class StorageErrors(ServerInterceptor):
    """UNAVAILABLE / ``STORAGE_UNAVAILABLE`` for any RPC whose handler let
    ``StorageUnavailable`` escape (its row of ``pagesift.core.api.errortable``; JobService
    handlers map it themselves, the same way)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler

        def wrap(behavior: Behavior) -> Behavior:
            if inspect.isasyncgenfunction(behavior):

                async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                    try:
                        async for item in behavior(request, context):
                            yield item
                    except StorageUnavailable as e:
                        await errortable.refuse(context, e)

                return stream

            async def unary(request: Any, context: Any) -> Any:
                try:
                    return await behavior(request, context)
                except StorageUnavailable as e:
                    await errortable.refuse(context, e)

            return unary

        return rewrap(handler, wrap)
