"""What a job's cookie jar stores: one record per cookie, and the budget its writes keep.

Owns the record of one cookie (``CookieState``: encoded by ``encode``, read back by
``decode``, compared by ``same``) and the jar's write budget (``Budget``, the constants
and ``estimate``), for ``pagesift.primary.engine.cookiejar`` (the jar, which decides
what to write with them; its docstring states the guarantees). Pure: no clock, no I/O.

The budget is a bucket of bytes: a run starts with ``JAR_BURST_BYTES`` of credit; a
page's group may write its ``allowance``, the credit plus ``JAR_PAGE_BYTES`` (at most
``JAR_BURST_BYTES``); ``spend`` after its commit leaves the allowance less what it
wrote. As a group never writes past its allowance, the credit stays in
``[0, JAR_BURST_BYTES]`` and n page groups write at most ``JAR_BURST_BYTES + n *
JAR_PAGE_BYTES``. An op is charged its value's bytes plus ``OP_BYTES`` (its key,
``job/{id}/cookie/{slot}`` of at most 64 bytes, and the log entry's framing), so the
charge is never below what the replication log carries for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

__all__ = [
    "EXPIRY_SLACK",
    "GONE",
    "JAR_BURST_BYTES",
    "JAR_PAGE_BYTES",
    "MAX_RECORD_BYTES",
    "NOTE_BYTES",
    "NOTE_RESERVE",
    "OP_BYTES",
    "QUEUE_BYTES_PER_PAGE",
    "SLOTS_BYTES",
    "Budget",
    "CookieState",
    "Ident",
    "Want",
    "decode",
    "dump",
    "estimate",
    "same",
]

EXPIRY_SLACK = 60.0  # seconds an expiry may move before the record is rewritten (at most)
JAR_PAGE_BYTES = 4096  # bytes of the jar a page's group may write, on average
JAR_BURST_BYTES = 32 << 10  # ... and at most, in one group: the credit a run saves
MAX_RECORD_BYTES = 16 << 10  # a cookie whose record would pass it is not kept (< the burst)
QUEUE_BYTES_PER_PAGE = 64  # an owed change counts a page older per this many bytes it lacks
OP_BYTES = 96  # what the budget charges an op beside its value: its key and framing
SLOTS_BYTES = OP_BYTES + 20  # the slot count's record
NOTE_BYTES = 2 * OP_BYTES  # a job note beside its message (its key, code and time)
NOTE_RESERVE = 512  # kept for the note until it is written: NOTE_BYTES + its message


Ident = tuple[str, str, str]  # (domain, path without its trailing "/", name): aiohttp's identity
GONE = "gone"  # a tombstone: a cookie of the request, deleted since (``JobCookies.changes``)


@dataclass(frozen=True)
class CookieState:
    """One cookie as the jar holds it: what its record stores (beside its order)."""

    name: str
    value: str
    coded: str  # the value as sent (quoted when it needs quotes)
    domain: str  # the host, for a host-only cookie
    host_only: bool
    path: str
    secure: bool
    httponly: bool
    samesite: str
    deadline: float | None  # absolute expiry, epoch seconds; None: a session cookie

    @property
    def ident(self) -> Ident:
        return (self.domain, self.path.rstrip("/"), self.name)

    @property
    def weight(self) -> int:
        """Bytes it counts for against ``MAX_JOB_COOKIE_BYTES``."""
        text = self.name + self.coded + self.domain + self.path + self.samesite
        return len(text.encode("utf-8", "surrogateescape")) + 16

    def encode(self, seq: int) -> bytes:
        record: dict[str, object] = {
            "q": seq, "n": self.name, "v": self.value, "d": self.domain,
            "h": self.host_only, "p": self.path, "s": self.secure, "o": self.httponly,
            "ss": self.samesite, "x": self.deadline,
        }  # fmt: skip
        if self.coded != self.value:
            record["c"] = self.coded  # only when quoted: the value is most of a record
        return dump(record)


Want = CookieState | str | None  # a cookie, ``GONE``, or nothing to store


def dump(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogateescape"
    )


def same(want: Want, had: Want, now: float) -> bool:
    """Whether the stored ``had`` still says ``want``: equal, but for an expiry moved
    by less than a tenth of the cookie's remaining life (and ``EXPIRY_SLACK``), so a
    site that refreshes Max-Age on every response is not rewritten on every page."""
    if not isinstance(want, CookieState) or not isinstance(had, CookieState):
        return want == had
    if replace(want, deadline=None) != replace(had, deadline=None):
        return False
    if want.deadline is None or had.deadline is None:
        return want.deadline == had.deadline
    slack = min(EXPIRY_SLACK, max(0.0, want.deadline - now) / 10)
    return abs(want.deadline - had.deadline) <= slack


def decode(raw: bytes) -> tuple[int, Ident, Want] | None:
    """(seq, identity, cookie or ``GONE``) of a stored record; None when damaged."""
    try:
        r = json.loads(raw.decode("utf-8", "surrogateescape"))
        name, domain, path, seq = r["n"], r["d"], r["p"], r["q"]
        if not all(isinstance(x, str) for x in (name, domain, path)) or not isinstance(seq, int):
            return None
        if r.get("gone"):
            return seq, (domain, path.rstrip("/"), name), GONE
        deadline = r["x"]
        state = CookieState(
            name=name, value=str(r["v"]), coded=str(r.get("c", r["v"])), domain=domain,
            host_only=bool(r["h"]), path=path, secure=bool(r["s"]), httponly=bool(r["o"]),
            samesite=str(r["ss"]), deadline=None if deadline is None else float(deadline),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return seq, state.ident, state


def estimate(want: Want) -> int:
    """About the bytes ``want``'s record costs (the order of the queue, not the budget)."""
    if want is None:
        return OP_BYTES
    if isinstance(want, CookieState):
        return want.weight + 100 + OP_BYTES
    return 100 + OP_BYTES


@dataclass
class Budget:
    """A run's credit of jar bytes (module docstring); one per ``JobCookies``."""

    credit: int = JAR_BURST_BYTES
    pages: int = 0  # page groups committed in this run

    @property
    def allowance(self) -> int:
        """Bytes the next page's group may write of the jar."""
        return max(0, min(JAR_BURST_BYTES, self.credit + JAR_PAGE_BYTES))

    def spend(self, cost: int) -> None:
        """A page's group committed, having written ``cost`` charged bytes."""
        self.credit = self.allowance - cost
        self.pages += 1
