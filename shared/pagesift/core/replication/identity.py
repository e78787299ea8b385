"""A node's replication identity: its history, its epoch, its role, and fencing.

What it owns
------------
``Identity`` holds, for one store, the history id the node's data belongs to, the
node's epoch, the history it was promoted from and the offset where it switched, the
highest epoch that fenced it, the role it last recorded, and whether it takes writes
now. It changes them only through ``open_for_writes`` (start-up of a primary),
``promote`` (standby -> primary), ``fence`` (a higher epoch was seen) and ``adopt``
(a standby follows a primary); the rules themselves are ``replproto``'s.

Storage layout (node-local keys: never replicated, never digested)
------------------------------------------------------------------
::

    _repl/epoch                -> u64                    this node's epoch
    _repl/history              -> utf-8                  history id ("" = never synced)
    _repl/prev_history         -> utf-8                  history we were promoted from
    _repl/switch               -> u64                    its last offset on this node
    _repl/fenced               -> u64                    higher epoch seen as primary
    _repl/role                 -> b"primary" | b"standby" | b"fenced"  (informative)
    _repl/restored             -> u64                    a backup's offset (until it runs)

The guarantees
--------------
* **Durable before it takes effect.** Every change is written in its own group and
  the WAL is synced (even with fsync off) before the in-memory state changes: a node
  never takes a write, or follows a primary, under an identity a crash could lose.
* **Writes only on a writable primary.** ``writable`` is true only after
  ``open_for_writes`` or ``promote``, and never while a higher epoch fences the node.
* **A deposed primary stays deposed.** ``fence`` records the higher epoch durably;
  ``open_for_writes`` then raises ``Fenced`` after any restart, until the node
  follows a primary of that epoch (``adopt``) and is promoted again.
* **A backup never extends its source's history.** A backup (``pagesift backup``)
  keeps its source's identity, so a standby seeded from it continues; it is marked
  ``restored`` at its offset, and started as a primary it branches off like a
  promotion there (epoch + 1, a new history, the source's as the previous one):
  a node holding more of the source's history then resyncs instead of continuing
  over a different tail. ``adopt`` and ``promote`` clear the mark.

Why it is safe
--------------
Every read-modify-write holds ``store.lock`` (the store's write section), so identity
changes are ordered with the writes whose entries carry the epoch; the lock is
reentrant, so a caller that already holds it (``Log.promote``) may call in.
"""

from __future__ import annotations

import logging
import struct
import uuid

from pagesift.core.ha import fencingrules
from pagesift.core.ha.roles import Role
from pagesift.core.replication import protocol
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.core.store.layout import local_key

logger = logging.getLogger(__name__)

_U64 = struct.Struct(">Q")
_EPOCH = local_key("repl/epoch")
_HISTORY = local_key("repl/history")
_PREV = local_key("repl/prev_history")
_SWITCH = local_key("repl/switch")
_FENCED = local_key("repl/fenced")
_ROLE = local_key("repl/role")
_RESTORED = local_key("repl/restored")


def _u64(raw: bytes | None) -> int:
    return int(_U64.unpack(raw)[0]) if raw else 0


class NotWritable(RuntimeError):
    """A write reached a node that is not a writable primary (standby or fenced)."""


class Fenced(NotWritable):
    """This node met a higher epoch; it takes no writes until it follows the new one."""


class Identity:
    """The replication identity of one store (see the module docstring).

    The attributes are for reading; only the methods below change them. Create it
    under ``store.lock``."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._writable = False
        get = store.get_local
        self.epoch: int = _u64(get(_EPOCH))
        self.history_id: str = (get(_HISTORY) or b"").decode()
        self.prev_history_id: str = (get(_PREV) or b"").decode()
        self.switch_offset: int = _u64(get(_SWITCH))
        self.fenced_epoch: int = _u64(get(_FENCED))
        raw_role = (get(_ROLE) or b"").decode()
        self.persisted_role: Role | None = Role(raw_role) if raw_role else None
        raw_restored = get(_RESTORED)
        self.restored: int | None = _u64(raw_restored) if raw_restored is not None else None

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def role(self) -> Role:
        """What the log accepts: writes (primary), none for good (fenced), or none
        (standby). The running node's role is its role machine's
        (``pagesift.core.ha.rolestate``); this view serves the log's own refusals and
        nodes without one."""
        if self._writable:
            return Role.PRIMARY
        if not fencingrules.may_accept_writes(self.epoch, self.fenced_epoch):
            return Role.FENCED
        return Role.STANDBY

    def _persist(self, values: dict[bytes, bytes | None]) -> None:
        def run(group: WriteGroup) -> None:
            for key, value in values.items():
                group.put_local(key, value)

        self._store.write(run)  # no ops: observers are not involved, only the batch
        # Identity changes are rare and must survive power loss even with fsync off.
        self._store.sync_wal()

    def open_for_writes(self) -> None:
        """Make this node the writable primary (start-up of a primary).

        A node with no history starts one (epoch 1). Raises ``Fenced`` when a higher
        epoch fenced this node: restarting must not resurrect a deposed primary.
        """
        with self._store.lock:
            if not fencingrules.may_accept_writes(self.epoch, self.fenced_epoch):
                raise Fenced(
                    f"fenced by epoch {self.fenced_epoch} (ours {self.epoch}): "
                    "rejoin as a standby of the new primary"
                )
            if self.restored is not None:  # a backup: branch off at its offset
                plan = self.promote(self.restored)
                logger.warning(
                    "started from a backup of history %s at offset %d: new history %s, "
                    "epoch %d (nodes holding more of the old history resync)",
                    plan.prev_history_id,
                    plan.switch_offset,
                    plan.history_id,
                    plan.epoch,
                )
                return
            if not self.history_id:
                self.history_id = uuid.uuid4().hex
                self.epoch = max(self.epoch, 1)
            self._persist(
                {
                    _HISTORY: self.history_id.encode(),
                    _EPOCH: _U64.pack(self.epoch),
                    _ROLE: b"primary",
                }
            )
            self.persisted_role = Role.PRIMARY
            self._writable = True

    def promote(
        self, applied_offset: int, new_history_id: str | None = None, *, epoch: int = 0
    ) -> protocol.Promotion:
        """Standby -> primary at ``applied_offset``: record epoch + 1 (at least
        ``epoch``: a witness's), a new history id and the switch offset durably (WAL
        synced), THEN accept writes. Idempotent on a primary."""
        with self._store.lock:
            if self._writable:
                return protocol.Promotion(
                    self.epoch, self.history_id, self.prev_history_id, self.switch_offset
                )
            plan = protocol.plan_promotion(
                epoch=max(self.epoch, self.fenced_epoch, epoch - 1),
                history_id=self.history_id,
                applied_offset=applied_offset,
                new_history_id=new_history_id or uuid.uuid4().hex,
            )
            self._persist(
                {
                    _EPOCH: _U64.pack(plan.epoch),
                    _HISTORY: plan.history_id.encode(),
                    _PREV: plan.prev_history_id.encode(),
                    _SWITCH: _U64.pack(plan.switch_offset),
                    _ROLE: b"primary",
                    _RESTORED: None,
                }
            )
            self.restored = None
            self.epoch, self.history_id = plan.epoch, plan.history_id
            self.prev_history_id, self.switch_offset = plan.prev_history_id, plan.switch_offset
            self.persisted_role = Role.PRIMARY
            self._writable = True
            return plan

    def fence(self, higher_epoch: int) -> bool:
        """Stop taking writes because a peer or entry of ``higher_epoch`` was seen.

        Durable: a restart keeps the node fenced until it follows a primary of that
        epoch. Returns True when this call fenced the node."""
        with self._store.lock:
            if not fencingrules.must_fence(self.epoch, higher_epoch):
                return False
            was_writable = self._writable
            self._writable = False
            if higher_epoch > self.fenced_epoch:
                self.fenced_epoch = higher_epoch
                self._persist({_FENCED: _U64.pack(higher_epoch), _ROLE: b"fenced"})
                self.persisted_role = Role.FENCED
            if was_writable:
                logger.error(
                    "fenced: met epoch %d > ours %d; this node takes no more writes",
                    higher_epoch,
                    self.epoch,
                )
            return was_writable

    def adopt(self, history_id: str, epoch: int) -> None:
        """A standby follows a primary of (``history_id``, ``epoch``): record it."""
        with self._store.lock:
            if self._writable:
                raise RuntimeError("a writable primary cannot follow another node")
            protocol.check_primary_epoch(self.epoch, epoch)
            if (history_id, epoch) == (self.history_id, self.epoch) and (
                self.persisted_role == Role.STANDBY and self.restored is None
            ):
                return
            self._persist(
                {
                    _HISTORY: history_id.encode(),
                    _EPOCH: _U64.pack(epoch),
                    _ROLE: b"standby",
                    _RESTORED: None,
                }
            )
            self.restored = None
            self.history_id, self.epoch, self.persisted_role = history_id, epoch, Role.STANDBY

    def stop_writes(self) -> None:
        """Take no more writes (the log is closing); nothing is recorded."""
        with self._store.lock:
            self._writable = False

    @staticmethod
    def standby_locals(history_id: str, epoch: int) -> dict[bytes, bytes | None]:
        """The identity keys of a store rebuilt by a full resync from a primary of
        (``history_id``, ``epoch``), to go into that resync's last group."""
        return {_HISTORY: history_id.encode(), _EPOCH: _U64.pack(epoch), _ROLE: b"standby"}

    @staticmethod
    def restored_locals(offset: int) -> dict[bytes, bytes | None]:
        """The mark of a backup taken at ``offset`` (written into the copy only)."""
        return {_RESTORED: _U64.pack(offset)}
