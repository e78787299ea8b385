"""The node's current store and its log, and the switch to a new one on a full resync.

What it owns
------------
``StoreSlot`` holds the store the node uses now and that store's ``Log``.
``open_slot`` opens the store the CURRENT file names (``db`` at first). A standby's
full resync builds a fresh store beside the current one (``fresh_store``) and
``install``s it once the snapshot is complete: the slot, and CURRENT, then name the
new store, and the old one is closed and deleted.

Layout
------
::

    {data_dir}/CURRENT         -> name of the store directory in use (e.g. "db")
    {data_dir}/db/             -> the first store
    {data_dir}/store-{12 hex}/ -> a store built by a full resync
    {data_dir}/backup-{12 hex}/ -> a checkpoint being streamed by ``AdminService.Backup``

The guarantees
--------------
* **The switch is atomic.** CURRENT is replaced by a rename (temp file fsynced, then
  the directory fsynced): after a crash it names either the old store or the new.
* **Only a complete store is ever current.** ``install`` syncs the new store's WAL
  (its data and its identity keys) before CURRENT names it; a store that never got
  there is deleted as a leftover at the next ``open_slot``.
* **Nobody keeps a stale store.** A switch replaces both the store and the log, so
  everyone reads ``slot.store`` / ``slot.log`` at use; listeners hear of each switch.

Why it is safe
--------------
The fresh store's last snapshot group writes its identity (``Log.snapshot_locals``):
until it commits, that store claims no history, so even if CURRENT named a half-built
store it could not pass for an in-sync one - and CURRENT is written only afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from pagesift.core.replication.backlog import DEFAULT_BACKLOG_BYTES
from pagesift.core.replication.log import Log
from pagesift.core.store.db import Store
from pagesift.core.util.fsync import fsync_dir

logger = logging.getLogger(__name__)

_CURRENT = "CURRENT"
_DEFAULT_DIR = "db"


def _write_current(data_dir: Path, name: str) -> None:
    """Point CURRENT at ``name`` atomically: write a temp file, fsync, rename, fsync
    the directory. A crash leaves CURRENT naming either the old or the new store."""
    tmp = data_dir / (_CURRENT + ".tmp")
    with tmp.open("w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, data_dir / _CURRENT)
    fsync_dir(data_dir)


class StoreSlot:
    """The node's current (store, log). A standby's full resync REPLACES both, so
    everyone reads ``slot.store`` / ``slot.log`` at use, never caches them."""

    def __init__(
        self, data_dir: Path, store: Store, log: Log, *, fsync: bool, backlog_bytes: int
    ) -> None:
        self.data_dir = data_dir
        self._store = store
        self._log = log
        self._fsync = fsync
        self._backlog_bytes = backlog_bytes
        self._listeners: list[Callable[[Store, Log], None]] = []

    @property
    def store(self) -> Store:
        return self._store

    @property
    def log(self) -> Log:
        return self._log

    def add_listener(self, fn: Callable[[Store, Log], None]) -> None:
        """``fn(new_store, new_log)`` runs after every switch (on the event loop
        thread when the follower switches)."""
        self._listeners.append(fn)

    def fresh_store(self) -> Store:
        """An empty store in a new directory beside the current one (for a resync)."""
        return Store(self.data_dir / f"store-{uuid.uuid4().hex[:12]}", fsync=self._fsync)

    def discard(self, store: Store) -> None:
        """Drop an unfinished fresh store."""
        store.close()
        shutil.rmtree(store.path, ignore_errors=True)

    def install(self, store: Store, *, delete_old: bool = True) -> Log:
        """Switch to a COMPLETE fresh store: its data and local keys are durable (WAL
        synced) before CURRENT names it, and CURRENT is replaced atomically; only
        then the old store is closed (and its directory deleted, unless the caller
        prefers to delete it off the event loop: ``delete_old=False``)."""
        store.sync_wal()
        log = Log(store, max_bytes=self._backlog_bytes)
        try:
            _write_current(self.data_dir, store.path.name)
        except BaseException:
            log.close()
            raise
        old_store, old_log = self._store, self._log
        self._store, self._log = store, log
        old_log.close()
        old_store.close()
        if delete_old:
            shutil.rmtree(old_store.path, ignore_errors=True)
        for fn in self._listeners:
            fn(store, log)
        return log

    def close(self) -> None:
        self._log.close()
        self._store.close()


def open_slot(
    data_dir: Path | str, *, fsync: bool = False, backlog_bytes: int = DEFAULT_BACKLOG_BYTES
) -> StoreSlot:
    """Open the store CURRENT names under ``data_dir`` (``db`` at first) with its log,
    and delete leftovers of resyncs that never completed (and of backups a crash cut
    short)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    current = data_dir / _CURRENT
    name = current.read_text().strip() if current.exists() else ""
    if not name:
        name = _DEFAULT_DIR
        _write_current(data_dir, name)
    for child in data_dir.iterdir():
        stale = child.name.startswith(("store-", "backup-")) or child.name == _DEFAULT_DIR
        if child.is_dir() and stale and child.name != name:
            logger.warning("removing %s: an unfinished or superseded resync", child)
            shutil.rmtree(child, ignore_errors=True)
    store = Store(data_dir / name, fsync=fsync)
    log = Log(store, max_bytes=backlog_bytes)
    return StoreSlot(data_dir, store, log, fsync=fsync, backlog_bytes=backlog_bytes)
