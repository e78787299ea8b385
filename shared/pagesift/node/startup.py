"""What a node opens and checks before it runs, each refusal a ``StartRefused``.

Owns the start-up reads of a node's data directory and credentials: the directory's
lock (``lock_data_dir``, taken before anything else touches the directory), its
stable id (``node_id``: replication peers tell nodes apart by it, so it is written
once, by an atomic rename), its store slot (``open_slot_or_refuse``: on a full volume
the reserve is released and the open tried once more), its replication token
(``read_token``: a short token is refused, not used), what its replication stream
trusts (``replication_credential``) and the address peers may hand to clients
(``advertised``). ``Node`` calls these in its constructor; a refusal names the key or
the directory and what to do, and the node starts nothing.

One process per data directory
------------------------------
``{data}/pagesift.lock`` is held with ``flock(LOCK_EX | LOCK_NB)`` for the node's
whole life, and taken FIRST: before ``NODE_ID``, CURRENT, the removal of leftover
``store-*``/``backup-*`` directories, RocksDB's own open (which rotates ``db/LOG``
before it meets RocksDB's LOCK) and the reserve. A second process on a live
directory is refused there, with the holder's pid, having changed nothing: opening
an existing file and failing to lock it writes nothing (issue 28, finding 7: a second
``serve`` took RocksDB's LOCK conflict for a failing disk and released the live
node's reserve, after deleting its backup checkpoint). Why a lock of our own rather
than RocksDB's: RocksDB's LOCK belongs to one store directory, which CURRENT names and
a full resync switches, and it is met only after steps that already write; the
directory lock covers the directory and everything in it. ``flock`` (not ``fcntl``
record locks) because it belongs to the open file, so two nodes of one process (the
tests' in-process nodes) exclude each other too, and it is never inherited by the
node's children (the descriptor is close-on-exec), so a lingering browser cannot
keep it; the kernel drops it when the process dies, even by SIGKILL, so a crash
leaves no stale lock to clear. The file holds the holder's pid (for the refusal's
message only). The reserve itself is released only on a volume with no space left
(``NO_SPACE``), never for another error.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from pathlib import Path

from pagesift.core.api.storagewatch import release_reserve
from pagesift.core.config.schema import ServerConfig
from pagesift.core.replication.slot import StoreSlot, open_slot
from pagesift.core.store.errors import NO_SPACE, storage_error

logger = logging.getLogger("pagesift.server")

#: The shortest replication token accepted (``secrets.token_urlsafe(32)`` gives 43).
MIN_TOKEN_CHARS = 16


#: The data directory's lock file (see "One process per data directory" above).
DATA_LOCK_FILE = "pagesift.lock"


class StartRefused(RuntimeError):
    """The node cannot start as configured: its data directory, the role asked for, a
    credential or the witness settings refuse it (the message says which, and what to do)."""


class DataLock:
    """This process's exclusive hold on a data directory; ``release`` gives it up (once)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # closing the one descriptor drops the flock


def lock_data_dir(data: Path) -> DataLock:
    """Hold ``data`` for this process, or ``StartRefused`` naming the process that
    holds it, with nothing in the directory changed. Creates the directory and the
    lock file when missing (then nobody uses it yet)."""
    data = Path(data)
    path = data / DATA_LOCK_FILE
    try:
        data.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StartRefused(
            f"the data directory {data} cannot be opened: {e.strerror or e}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "pid unknown"
        os.close(fd)
        if isinstance(e, BlockingIOError):
            raise StartRefused(
                f"the data directory {data} is in use by another pagesift process ({holder}): "
                "one process per data directory; stop that one first, or give this one its "
                "own --data"
            ) from None
        raise StartRefused(
            f"the data directory {data} cannot be locked: {e.strerror or e}"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    return DataLock(path, fd)


def open_slot_or_refuse(config: ServerConfig) -> StoreSlot:
    """The node's store slot. Opening replays the WAL into a table file, which needs
    room: on a full volume (``NO_SPACE``) the reserve (``pagesift.core.api.storagewatch``) is
    released and the open tried once more; a store that still cannot open refuses the
    start, saying so. Called with the data directory's lock held (``lock_data_dir``)."""
    try:
        return open_slot(config.data, fsync=config.fsync, backlog_bytes=config.backlog_bytes)
    except Exception as e:
        err = storage_error(e)
        if err is None:
            raise
        failure: Exception = e
    # only a full volume is what the reserve is for: any other failure (a failing disk,
    # a lock held by a process that is not a node) leaves it where it is
    released = release_reserve(config.data) if err.reason == NO_SPACE else 0
    if released:
        logger.warning(
            "the store did not open (%s): released the %d-byte reserve and tried again",
            err.reason,
            released,
        )
        try:
            return open_slot(config.data, fsync=config.fsync, backlog_bytes=config.backlog_bytes)
        except Exception as e:
            err = storage_error(e)
            if err is None:
                raise
            failure = e
    hint = "free space on its volume" if err.reason == NO_SPACE else "check its disk"
    raise StartRefused(f"the store in {config.data} cannot open ({failure}): {hint}, then start")


def replication_credential(config: ServerConfig) -> str:
    """What this node's replication stream trusts ("token", "mtls"), or "" for nothing."""
    if config.replication_token_file:
        return "token"
    if config.replication_listen or config.replication_ca or config.replication_cert:
        return "mtls"
    return ""


def read_token(file: str) -> str:
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


def advertised(listen: str) -> str:
    """``listen`` as an address peers can hand to clients; "" for a wildcard host."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    return "" if host in ("", "0.0.0.0", "::") else listen


def node_id(data: Path) -> str:
    """A stable id for this data directory (replication peers tell nodes apart by it)."""
    data.mkdir(parents=True, exist_ok=True)
    path = data / "NODE_ID"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(uuid.uuid4().hex[:16])
        tmp.replace(path)
    return path.read_text().strip()
