"""Promotion: a standby becomes the primary, durably, before it takes a write.

What it owns
------------
``Promoter.promote()`` runs the three steps in an order that makes each one safe:

1. **Stop following.** ``stop_follower()`` returns only once no apply is in flight
   (the follower applies on the event loop, between its awaits). From here on the
   applied offset cannot move: it becomes the *switch offset*.
2. **Record the new identity durably.** ``Log.promote`` writes the next epoch
   (above every epoch this node has seen, and at least a witness's), a fresh
   history id, the previous history id and the switch offset as node-local keys in
   one WriteBatch, under the write section, and syncs the WAL. Only after that does
   the log accept writes. A crash before the sync leaves a standby (it never took a
   write); a crash after it leaves a primary of the new epoch (restart it as such:
   ``Log.persisted_role`` says "primary"). The previous history id and switch offset
   let the old primary rejoin with ``continue`` when its offset is within them.
3. **Start serving writes.** ``on_promoted()`` (the Node starts its job runtime,
   which resumes running jobs from their frontiers in the store, and starts
   ``pagesift.standby.fencing`` against the primary it used to follow).

Promoting twice is harmless: a node that already is the primary reports its state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pagesift.core.replication import protocol
from pagesift.core.replication.slot import StoreSlot

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromoteResult:
    promotion: protocol.Promotion
    already_primary: bool


class Promoter:
    """Turns this node's standby into the primary (see the module docstring)."""

    def __init__(
        self,
        slot: StoreSlot,
        *,
        stop_follower: Callable[[], Awaitable[None]] | None = None,
        on_promoted: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._slot = slot
        self._stop_follower = stop_follower
        self._on_promoted = on_promoted
        self._lock = asyncio.Lock()

    async def promote(self, *, epoch: int = 0) -> PromoteResult:
        """Promote (see the module docstring); ``epoch``: the lowest epoch to take (a
        witness's lease revision), 0 for the next one."""
        async with self._lock:
            log = self._slot.log
            if log.writable:
                return PromoteResult(
                    protocol.Promotion(
                        log.epoch, log.history_id, log.prev_history_id, log.switch_offset
                    ),
                    already_primary=True,
                )
            if self._stop_follower is not None:
                await self._stop_follower()
            log = self._slot.log  # the follower may have switched stores before stopping
            if not log.history_id:
                logger.warning("promoting a standby that never completed a sync: it is empty")
            promotion = log.promote(epoch=epoch)
            logger.warning(
                "promoted: epoch %d, history %s (previous %s up to offset %d)",
                promotion.epoch,
                promotion.history_id,
                promotion.prev_history_id or "-",
                promotion.switch_offset,
            )
            if self._on_promoted is not None:
                await self._on_promoted()
            return PromoteResult(promotion, already_primary=False)
