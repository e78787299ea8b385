"""Account limits across pairs, as plans: concurrency slots and daily pages in blocks.

Concurrency (``max_concurrent_jobs`` cluster-wide)
--------------------------------------------------
The account has ``limit`` slot keys ``C/slots/{account}/{0..limit-1}`` (``registry``). A
pair starting a job creates the first free one (``free_slot``) in a transaction that
requires the key to be absent (create revision 0), under the pair's lease; it deletes
it when the job ends. Two pairs racing for one slot: etcd lets exactly one create it,
the other tries the next. So at most ``limit`` jobs run at once, and a pair that dies
frees its slots when its lease lapses.

Daily pages (``pages_per_day`` cluster-wide), without an etcd write per page
----------------------------------------------------------------------------
``C/pages/{account}/{day}`` counts pages *drawn*. A pair draws a block (``plan_draw``:
compare the key's mod revision, set value + granted) before it spends any page of it,
and spends from its block locally (``BlockLedger``) before each page's request (a
request that stored nothing gives its page back: ``give_back``); it holds at most one
block per account and returns what it did not use when the account goes idle
(``plan_return``).
Worst case: the pages fetched cluster-wide never exceed the allowance (every page was
drawn first); an account can be told "exhausted" while up to one block per pair sits
unused in other pairs, and a pair that crashes loses its unused block for the day. So
the error is on the safe side, at most ``pairs x block`` pages, and etcd sees one write
per block: ``1000 / block`` writes per 1,000 pages.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

__all__ = [
    "MAX_BLOCK", "BlockLedger", "Draw", "Grant", "block_size", "free_slot", "plan_draw",
    "plan_return",
]  # fmt: skip

MAX_BLOCK = 256


def free_slot(taken: Collection[int], limit: int) -> int | None:
    """The lowest slot index below ``limit`` not in ``taken``; None when all are taken."""
    return next((i for i in range(limit) if i not in taken), None)


def block_size(allowance: int, pairs: int) -> int:
    """Pages a pair draws at once: an eighth of a fair share, 1..``MAX_BLOCK``."""
    return max(1, min(MAX_BLOCK, allowance // max(1, 8 * pairs)))


@dataclass(frozen=True, slots=True)
class Draw:
    """A compare-and-swap on the day's counter: if its mod revision is still
    ``revision``, set it to ``value``; the pair then holds ``granted`` pages."""

    revision: int
    value: int
    granted: int


def plan_draw(drawn: int, revision: int, allowance: int, block: int) -> Draw | None:
    """The draw of at most ``block`` pages when ``drawn`` of ``allowance`` are out
    (None: the day's allowance is used up)."""
    granted = min(block, allowance - drawn)
    if granted <= 0:
        return None
    return Draw(revision, drawn + granted, granted)


def plan_return(drawn: int, revision: int, unused: int) -> Draw | None:
    """Give back ``unused`` pages of a block (None: nothing to give back)."""
    if unused <= 0:
        return None
    return Draw(revision, max(0, drawn - unused), -min(unused, drawn))


@dataclass(frozen=True, slots=True)
class Grant:
    """``take``'s answer: ``ok`` (a page may be fetched) or, if not, whether a block
    must be drawn first (``draw``) or the day's allowance is used up."""

    ok: bool
    draw: bool = False


class BlockLedger:
    """One pair's blocks: per account, the day of its block and the pages left in it."""

    def __init__(self) -> None:
        self._left: dict[str, tuple[str, int]] = {}
        self._exhausted: dict[str, str] = {}  # account -> the day it ran out

    def take(self, account: str, day: str) -> Grant:
        """Spend one page of ``account``'s block for ``day``."""
        held_day, left = self._left.get(account, (day, 0))
        if held_day == day and left > 0:
            self._left[account] = (day, left - 1)
            return Grant(ok=True)
        if self._exhausted.get(account) == day:
            return Grant(ok=False)
        return Grant(ok=False, draw=True)

    def drawn(self, account: str, day: str, granted: int) -> None:
        """A draw of ``granted`` pages succeeded (0: the allowance is used up)."""
        if granted <= 0:
            self._exhausted[account] = day
            self._left.pop(account, None)
            return
        self._exhausted.pop(account, None)  # pages came back meanwhile (a return)
        held_day, left = self._left.get(account, (day, 0))
        self._left[account] = (day, (left if held_day == day else 0) + granted)

    def give_back(self, account: str, day: str) -> None:
        """A page taken for ``day`` whose request stored nothing: back into the block
        (a block released meanwhile is held again, one page, to be returned with the
        next; a page of a day gone by is dropped: that day's counter no longer
        matters)."""
        held_day, left = self._left.get(account, (day, 0))
        if held_day != day and account in self._left:
            return
        self._exhausted.pop(account, None)
        self._left[account] = (day, left + 1)

    def release(self, account: str, day: str) -> int:
        """Drop the account's block; the pages of ``day`` left in it, to return."""
        held_day, left = self._left.pop(account, (day, 0))
        return left if held_day == day else 0

    def held(self, account: str) -> int:
        return self._left.get(account, ("", 0))[1]
