"""``AdminService.Backup``, the server side: a consistent copy of the node's store,
taken while writes go on, streamed as a data directory.

What it owns
------------
``BackupSource`` takes the backups of one node, one at a time (``stream``); a second
one while the first runs gets ``BackupBusy`` (the RPC answers RESOURCE_EXHAUSTED).
The client side, which writes the stream into a directory, is
``pagesift.cli.backup``.

Protocol (one ``stream``)
-------------------------
1. **Checkpoint.** Inside the store's write section (``store.lock``), a RocksDB
   checkpoint of the current store into ``{data}/backup-{12 hex}/db``, and the log's
   offset, tail epoch, epoch, history id and recorded role read at the same instant.
   The temporary directory lies inside the data directory, so on one filesystem:
   the SST files are hard links, and the checkpoint costs a memtable flush and a few
   links, not a copy. That flush is all writers wait for (``checkpoint_seconds``).
2. **Mark.** The copy, opened as a store of its own outside the write section, gets
   ``Identity.restored_locals(offset)`` (its WAL synced): started as a primary, a
   restored backup branches off a new history at its offset instead of extending
   its source's (``pagesift.core.replication.identity``).
3. **Stream.** ``CURRENT`` (naming ``db``) and every file of the copy but RocksDB's
   ``LOCK`` and info ``LOG`` files, each in chunks of ``CHUNK_BYTES`` with the path
   and the offset in the file, hashed as they go; then the ``BackupManifest``: the
   offset, epochs, history, recorded role, the source's node id, and each file's
   size and SHA-256. The copy has no ``NODE_ID``: a node started on it is a new node.
4. **Clean up.** The temporary directory is removed in a ``finally``: after the
   manifest, on an error, and when the client cancels (gRPC cancels the handler,
   ``aclosing`` closes the stream). A crash leaves it for ``open_slot`` to remove at
   the next start (``backup-*`` is a leftover there).

The guarantee
-------------
The copy is the store exactly as it stood after entry ``offset``: every write group
is one WriteBatch that carries its own log entry, tail and identity keys, and the
checkpoint is taken while no group commits (the write section), so the data, the
backlog and the identity in the copy are one cut, the one the manifest names. A node
started on it resumes its jobs from there; a standby started on it says hello with
that offset and history, and continues from the primary's backlog.

Why it is safe
--------------
Nothing is written to the live store: the checkpoint only reads it (and flushes its
memtable, as RocksDB does by itself), and the mark goes into the copy. The write
section is held only for the checkpoint; hashing and streaming run outside it, off
the event loop for file reads. Files of a checkpoint never change once it is made,
so a file is streamed as it was hashed. The slot may switch stores (a standby's full
resync) at any time: under the store's lock the slot is checked to still name that
store, and otherwise the checkpoint is taken again from the new one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

from pagesift.core.ha.roles import Role
from pagesift.core.replication.identity import Identity
from pagesift.core.replication.slot import StoreSlot
from pagesift.core.store.db import Store
from pagesift.v1 import replication_pb2 as pb

logger = logging.getLogger("pagesift.backup")

#: Bytes of file data in one streamed message.
CHUNK_BYTES = 1024 * 1024
#: The store directory's name in a backup (``CURRENT`` names it).
STORE_DIR = "db"
#: RocksDB files of the copy that a data directory does not need.
_SKIPPED = ("LOCK", "LOG")
_PB_ROLES = {
    Role.PRIMARY: pb.NODE_ROLE_PRIMARY,
    Role.STANDBY: pb.NODE_ROLE_STANDBY,
    Role.FENCED: pb.NODE_ROLE_FENCED,
}


class BackupBusy(RuntimeError):
    """A backup of this node is already running (one at a time)."""


@dataclass(frozen=True)
class Cut:
    """Where the copy stands: read in the write section, with the checkpoint."""

    offset: int
    tail_epoch: int
    epoch: int
    history_id: str
    role: Role | None
    taken_at_ms: int
    checkpoint_seconds: float


def _checkpoint(slot: StoreSlot, into: Path) -> Cut:
    """Checkpoint the slot's current store into ``into`` (a new directory), in the
    write section; the slot's store may switch meanwhile (a resync): try again."""
    for _ in range(3):
        store, log = slot.store, slot.log
        started = time.monotonic()
        with store.lock:
            if slot.store is not store:  # switched before we held its lock: it may be closed
                continue
            store.checkpoint(into)
            cut = Cut(
                offset=log.last_offset,
                tail_epoch=log.tail_epoch,
                epoch=log.epoch,
                history_id=log.history_id,
                role=log.persisted_role,
                taken_at_ms=int(time.time() * 1000),
                checkpoint_seconds=time.monotonic() - started,
            )
        _mark(into, cut.offset)
        return cut
    raise RuntimeError("the store kept switching (a full resync?): try the backup again")


def _mark(path: Path, offset: int) -> None:
    """Write the ``restored`` mark into the copy (never into the live store)."""
    copy = Store(path, fsync=True)
    try:
        copy.apply([], local=Identity.restored_locals(offset))
        copy.sync_wal()
    finally:
        copy.close()


def _files(root: Path) -> list[Path]:
    """The files a data directory needs, in a stable order (``CURRENT`` first)."""
    out = [root / "CURRENT"]
    for path in sorted((root / STORE_DIR).rglob("*")):
        if path.is_file() and not path.name.startswith(_SKIPPED):
            out.append(path)
    return out


class BackupSource:
    """The backups of the node whose store slot is ``slot`` (one at a time)."""

    def __init__(self, slot: StoreSlot, node_id: str, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._slot = slot
        self._node_id = node_id
        self._chunk_bytes = chunk_bytes
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    async def stream(self) -> AsyncGenerator[pb.BackupResponse, None]:
        """The backup as messages: file chunks, then the manifest (see the module
        docstring). ``BackupBusy`` before the first message when one is running."""
        if self._running:
            raise BackupBusy(
                "a backup of this node is already running (one at a time): retry once it ends"
            )
        self._running = True
        tmp = self._slot.data_dir / f"backup-{uuid.uuid4().hex[:12]}"
        started = time.monotonic()
        finished = False
        try:
            tmp.mkdir()
            (tmp / "CURRENT").write_text(STORE_DIR + "\n")
            cut = await asyncio.to_thread(_checkpoint, self._slot, tmp / STORE_DIR)
            files: list[pb.BackupFile] = []
            for path in await asyncio.to_thread(_files, tmp):
                name = path.relative_to(tmp).as_posix()
                digest = hashlib.sha256()
                size = 0
                with path.open("rb") as fh:
                    while True:
                        data = await asyncio.to_thread(fh.read, self._chunk_bytes)
                        if data or size == 0:
                            chunk = pb.BackupChunk(path=name, offset=size, data=data)
                            yield pb.BackupResponse(chunk=chunk)
                        if not data:
                            break
                        digest.update(data)
                        size += len(data)
                files.append(pb.BackupFile(path=name, size=size, sha256=digest.hexdigest()))
            total = sum(f.size for f in files)
            manifest = pb.BackupManifest(
                offset=cut.offset,
                tail_epoch=cut.tail_epoch,
                epoch=cut.epoch,
                history_id=cut.history_id,
                role=_PB_ROLES[cut.role] if cut.role is not None else pb.NODE_ROLE_UNSPECIFIED,
                node_id=self._node_id,
                files=files,
                total_bytes=total,
                taken_at_ms=cut.taken_at_ms,
                checkpoint_seconds=cut.checkpoint_seconds,
            )
            finished = True
            logger.info(
                "backup at offset %d (epoch %d, history %s): %d files, %d bytes in %.2f s; "
                "writes waited %.3f s for the checkpoint",
                cut.offset,
                cut.epoch,
                cut.history_id,
                len(files),
                total,
                time.monotonic() - started,
                cut.checkpoint_seconds,
            )
            yield pb.BackupResponse(manifest=manifest)
        finally:
            if not finished:
                logger.warning("backup abandoned (client gone or an error): removing %s", tmp)
            # synchronous on purpose: it must run even while the handler is cancelled
            shutil.rmtree(tmp, ignore_errors=True)
            self._running = False
