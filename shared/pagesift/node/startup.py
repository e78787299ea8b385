"""What a node opens and checks before it runs, each refusal a ``StartRefused``.

Owns the start-up reads of a node's data directory and credentials: its stable id
(``node_id``: replication peers tell nodes apart by it, so it is written once, by an
atomic rename), its store slot (``open_slot_or_refuse``: on a full volume the reserve
is released and the open tried once more), its replication token (``read_token``: a
short token is refused, not used), what its replication stream trusts
(``replication_credential``) and the address peers may hand to clients
(``advertised``). ``Node`` calls these in its constructor; a refusal names the key or
the directory and what to do, and the node starts nothing.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from pagesift.node.storage import release_reserve
from pagesift.shared.config.schema import ServerConfig
from pagesift.shared.replication.slot import StoreSlot, open_slot
from pagesift.shared.store.errors import NO_SPACE, storage_error

logger = logging.getLogger("pagesift.server")

#: The shortest replication token accepted (``secrets.token_urlsafe(32)`` gives 43).
MIN_TOKEN_CHARS = 16


class StartRefused(RuntimeError):
    """The node cannot start as configured: its data directory, the role asked for, a
    credential or the witness settings refuse it (the message says which, and what to do)."""


def open_slot_or_refuse(config: ServerConfig) -> StoreSlot:
    """The node's store slot. Opening replays the WAL into a table file, which needs
    room: on a full volume the reserve (``pagesift.node.storage``) is released and the
    open tried once more; a store that still cannot open refuses the start, saying so."""
    try:
        return open_slot(config.data, fsync=config.fsync, backlog_bytes=config.backlog_bytes)
    except Exception as e:
        err = storage_error(e)
        if err is None:
            raise
        failure: Exception = e
    released = release_reserve(config.data)
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
