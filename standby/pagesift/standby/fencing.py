"""Deposing the former primary after a promotion.

What it owns
------------
``fence_former_primary`` runs on a freshly promoted node that knows the primary it
used to follow (its ``--primary``). Until that node has stepped down, it opens a
replication stream to it and says hello with the NEW epoch and history (and the
address where it serves clients). A primary that meets a higher epoch fences itself
durably before it answers (``pagesift.primary.replication``), so a deposed primary
that is still running (frozen, cut off, or simply never stopped) takes no more
writes from the moment it can hear us, and its write refusals name us.

Each answer is judged by ``fencingrules.fencing_verdict`` (pure), a ``FencingVerdict``:

- ``DONE``: FAILED_PRECONDITION: it stepped down, or it was no writable primary
  anyway.
- ``DEPOSED``: a decision of a higher epoch: it is the newer primary and we are the
  stale one: ``on_deposed(epoch)``.
- ``RETRY`` (unreachable, timed out, credentials refused) or ``CONFLICT`` (a primary
  of our own epoch, said as an error): ask again after a capped, jittered backoff,
  for as long as we are the primary; then ``STOPPED``.

Guarantee: it writes nothing anywhere; it only gives the former primary the chance
to fence itself. Writes a partitioned old primary takes before the partition heals
are still lost to the new history (two nodes and no witness: keep it down).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import grpc

from pagesift.core.ha import fencingrules
from pagesift.core.ha.fencingrules import FencingVerdict
from pagesift.core.util.backoff import backoff_delay
from pagesift.core.util.channels import open_channel
from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc

logger = logging.getLogger(__name__)


async def fence_former_primary(
    target: str,
    hello: Callable[[], pb.Hello],
    *,
    still_primary: Callable[[], bool],
    on_deposed: Callable[[int], Awaitable[None]],
    credentials: grpc.ChannelCredentials | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
    answer_timeout: float = 5.0,
    backoff_base: float = 0.2,
    backoff_cap: float = 5.0,
    rng: Callable[[], float] = random.random,
) -> FencingVerdict:
    """Say hello to ``target`` until it stepped down; returns the last verdict
    (``DONE``, ``DEPOSED``, or ``STOPPED`` once we are no primary any more)."""
    attempt = 0
    last_detail = ""
    while still_primary():
        h = hello()
        refused, decision_epoch, detail = await _ask(
            target, h, credentials, metadata, answer_timeout
        )
        verdict = fencingrules.fencing_verdict(
            h.epoch, refused=refused, decision_epoch=decision_epoch
        )
        if verdict is FencingVerdict.DONE:
            logger.info("former primary %s takes no writes (%s)", target, detail)
            return verdict
        if verdict is FencingVerdict.DEPOSED:
            assert decision_epoch is not None
            logger.error(
                "former primary %s is a primary of epoch %d > ours %d: stepping down",
                target,
                decision_epoch,
                h.epoch,
            )
            await on_deposed(decision_epoch)
            return verdict
        # A former primary that stays down would fill the log: say each new reason once.
        if verdict is FencingVerdict.CONFLICT:
            log = logger.error
        else:
            log = logger.info if detail != last_detail else logger.debug
        log("former primary %s not fenced yet (%s); asking again", target, detail)
        last_detail = detail
        await asyncio.sleep(
            backoff_delay(attempt, base=backoff_base, cap=backoff_cap, jitter=rng())
        )
        attempt += 1
    return FencingVerdict.STOPPED


async def _ask(
    target: str,
    hello: pb.Hello,
    credentials: grpc.ChannelCredentials | None,
    metadata: tuple[tuple[str, str], ...],
    timeout: float,
) -> tuple[bool, int | None, str]:
    """One hello: (refused with FAILED_PRECONDITION, the decision's epoch, detail)."""
    async with open_channel(target, credentials) as channel:
        stub = replication_pb2_grpc.ReplicationServiceStub(channel)
        call = stub.Stream(metadata=metadata)  # type: ignore[call-arg]
        try:
            async with asyncio.timeout(timeout):
                await call.write(pb.StreamRequest(hello=hello))
                msg = await call.read()
        except grpc.aio.AioRpcError as e:
            refused = e.code() == grpc.StatusCode.FAILED_PRECONDITION
            return refused, None, f"{e.code().name}: {e.details()}"
        except TimeoutError:
            return False, None, f"no answer within {timeout:g}s"
        finally:
            call.cancel()
    if isinstance(msg, pb.StreamResponse) and msg.WhichOneof("msg") == "decision":
        return False, msg.decision.epoch, f"a decision of epoch {msg.decision.epoch}"
    return False, None, "the stream ended without an answer"
