"""A job's cookie jar: RFC 6265 rules, caps, and what of it the store must hold.

Owns ``JobCookies`` (one per scrape call or job run, never shared) and ``JarChanges``
(what a page's write group stores of it). The invariants:

- the rules are aiohttp's ``CookieJar`` (domain, path, Secure, expiry: the jar
  aiohttp's own sessions use); ``JobCookies`` mirrors what it holds, one ``CookieState``
  per cookie identity (domain, path, name). The request's ``cookies`` are host-only
  cookies of every host it names (``seed``); each ``Set-Cookie`` of a response
  (redirects and error pages included) is applied at once, so the next hop sends it;
- caps (RFC 6265 6.1's minimums, what browsers keep): a Set-Cookie line over
  ``MAX_COOKIE_BYTES`` is dropped (``dropped``; so is a cookie whose record would pass
  ``MAX_RECORD_BYTES``, only a path taken from a very long URL gets there); a domain
  keeps ``MAX_DOMAIN_COOKIES``, a job ``MAX_JOB_COOKIES`` cookies and
  ``MAX_JOB_COOKIE_BYTES`` bytes of them, the oldest (by creation: a cookie set again
  keeps its age) evicted first (``evicted``);
- persistence as changes: ``changes()``, called inside a page's write group, returns
  a record per cookie whose value, attributes or expiry (beyond a small slack) differ
  from its stored record and a delete per cookie gone, each under the cookie's own
  slot (``job/{id}/cookie/{slot}``); ``committed()`` follows the commit. A site that
  sends the same 120 cookies on every response writes them once, not on every page;
- the budget (issue 28): the jar's writes are bounded whatever the site sends. A
  page's group writes at most its ``allowance``: the credit saved plus
  ``JAR_PAGE_BYTES``, never more than ``JAR_BURST_BYTES`` (charged: each record's bytes
  plus ``OP_BYTES`` per op for its key and framing, not less than the log carries:
  ``cookierecords``, which holds the records' codec and the ``Budget``).
  Every committed page group earns ``JAR_PAGE_BYTES`` (``committed``, ``EMPTY`` for a
  page that wrote none) and spends what it wrote, so over any n page groups of a run
  the jar writes at most ``JAR_BURST_BYTES + n * JAR_PAGE_BYTES`` bytes (32 KiB + 4 KiB
  a page): cookies rotating through the per-domain cap cost the log 4 KiB a page on
  average, not their 200 KB. What does not fit is owed, kept in memory and folded
  (a cookie changed again is written once, as it is then; one created and evicted
  before its turn is never written). Owed changes go in the order of ``since +
  bytes / QUEUE_BYTES_PER_PAGE`` (the page since which it is owed, plus a page per
  64 bytes it charges), each written whole or not at all: a session cookie of 100
  bytes passes 4 KB ones owed up to 60 pages before it, yet no change waits for one owed
  after its own key, and every record fits ``JAR_BURST_BYTES``, so each owed change
  is stored after a bounded number of pages. The churn is charged to the job: the
  first page group of a run that leaves changes owed carries a job note
  (``JarChanges.note``, code ``cookie_budget`` in GetJobErrors); ``deferred_pages``
  counts such groups;
- resume: ``load()`` (after ``seed``) re-applies the records in creation order
  through the same jar, each with the expiry it had (an expired one skipped, a
  tombstone deleting its request cookie). What survives a restart or a failover:
  while nothing is owed (a job whose jar changes by at most ``JAR_BURST_BYTES`` at
  once and ``JAR_PAGE_BYTES`` a page on average: logins, CSRF tokens, counters), the
  jar of the job's last committed page, exactly. With changes owed, the stored jar
  lacks them: each cookie it holds is one the job held on a committed page (its
  value then, its expiry), but a cookie owed is missing, a changed one older, a
  deleted one back, until the site sets it again; the caps hold either way. A store
  holding the snapshot form (Set-Cookie lines, ``legacy``) replays it once, and the
  following pages rewrite it as records.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, Morsel, SimpleCookie
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from pagesift.core.jobs import urls
from pagesift.primary.engine.cookierecords import (
    GONE,
    JAR_BURST_BYTES,
    JAR_PAGE_BYTES,
    MAX_RECORD_BYTES,
    NOTE_BYTES,
    NOTE_RESERVE,
    OP_BYTES,
    QUEUE_BYTES_PER_PAGE,
    SLOTS_BYTES,
    Budget,
    CookieState,
    Ident,
    Want,
    decode,
    dump,
    estimate,
    same,
)

__all__ = [
    "EMPTY",
    "JAR_BURST_BYTES",
    "JAR_PAGE_BYTES",
    "MAX_COOKIE_BYTES",
    "MAX_DOMAIN_COOKIES",
    "MAX_JOB_COOKIES",
    "MAX_JOB_COOKIE_BYTES",
    "JarChanges",
    "JobCookies",
]

MAX_COOKIE_BYTES = 4096  # name + value + attributes of one cookie (RFC 6265 6.1's minimum)
MAX_DOMAIN_COOKIES = 50  # cookies per domain (RFC 6265 6.1's minimum); the oldest go first
MAX_JOB_COOKIES = 3000  # cookies per job (RFC 6265 6.1's minimum); the oldest go first
MAX_JOB_COOKIE_BYTES = 1 << 20  # bytes of cookies per job (``_weight``); the oldest go first
_DIRTY_MAX = 2 * MAX_JOB_COOKIES  # touched cookies tracked one by one; past it, a full diff


@dataclass(frozen=True)
class JarChanges:
    """What a page's write group stores of the jar (``JobCookies.changes``): records
    to put and slots to delete (``job/{id}/cookie/{slot}``), the new slot count when
    it grew, and whether the pre-change snapshot key goes. Hand it back to
    ``JobCookies.committed`` once the group is committed."""

    puts: tuple[tuple[int, bytes], ...]
    deletes: tuple[int, ...]
    slots: int | None
    drop_legacy: bool
    written: tuple[tuple[Ident, int, Want], ...]
    touches: int  # the jar's touch count when these were computed
    full: bool  # a full diff (the jar lost track of what it touched)
    cost: int = 0  # bytes the budget charges for them (``JAR_PAGE_BYTES``), note included
    deferred: tuple[Ident, ...] = ()  # changes past the allowance, left for later pages
    note: str | None = None  # the job's note: the first changes of the run deferred

    @property
    def size(self) -> int:
        """Bytes of records it writes."""
        return sum(len(raw) for _, raw in self.puts)


EMPTY = JarChanges((), (), None, False, (), 0, False)  # a page's group that changed nothing


class JobCookies:
    """One job's cookie jar (module docstring). Create it inside the event loop."""

    def __init__(self) -> None:
        self._jar = aiohttp.CookieJar(unsafe=True)  # unsafe = accept IP-address hosts
        self._live: dict[Ident, CookieState] = {}  # creation order: the oldest first
        self._by_domain: dict[str, dict[Ident, None]] = {}
        self._bytes = 0  # the weight of ``_live``
        self._seq: dict[Ident, int] = {}  # creation order, kept in the records
        self._next_seq = 0
        self._expiry = math.inf  # the earliest deadline in ``_live``
        self._base: dict[Ident, CookieState] = {}  # what the request's cookies set (``seed``)
        self._stored: dict[Ident, tuple[int, Want]] = {}  # slot and record in the store
        self._slot_of: dict[Ident, int] = {}  # slots in use or reserved
        self._free: list[int] = []  # slots below ``_next_slot`` not in use (a heap)
        self._next_slot = 0
        self._stored_slots = 0  # the slot count the store records
        self._legacy = False  # the store holds a snapshot from before the records
        self._dirty: set[Ident] = set()  # touched since they were last stored
        self._overflow = False  # too many to track: the next changes() diffs everything
        self._touches = 0
        self._since: dict[Ident, int] = {}  # the page since which each change is owed
        self.budget = Budget()  # the run's credit of jar bytes (``cookierecords``)
        self._noted = False  # the job's note on deferred changes was written
        self.dropped = 0  # Set-Cookie lines over MAX_COOKIE_BYTES (or records over
        # MAX_RECORD_BYTES), dropped
        self.evicted = 0  # cookies evicted by a cap
        self.deferred_pages = 0  # page groups that left changes past the budget for later

    # requests ---------------------------------------------------------------------------
    def seed(self, cookies: Mapping[str, str], targets: Iterable[str]) -> None:
        """The request's cookies, host-only, for the host of each URL in ``targets``."""
        if not cookies:
            return
        origins: set[str] = set()
        for target in targets:
            try:
                parts = urlsplit(urls.fetch_url(target))
            except ValueError:
                continue
            origins.add(f"{parts.scheme}://{parts.netloc}/")
        now = time.time()
        for origin in sorted(origins):
            for name, value in cookies.items():
                tmp: SimpleCookie = SimpleCookie()
                try:
                    tmp[name] = value
                except CookieError:
                    continue
                state = self._take(URL(origin), name, tmp[name], now)
                if state is not None:
                    self._base[state.ident] = state

    def header(self, url: str) -> str | None:
        """The Cookie header for a request to ``url`` (None: no cookie applies)."""
        found = self._jar.filter_cookies(URL(url))
        if not found:
            return None
        return "; ".join(f"{name}={morsel.coded_value}" for name, morsel in found.items())

    def absorb(self, url: str, lines: Iterable[str]) -> None:
        """Apply the Set-Cookie ``lines`` of a response from ``url``, within the caps."""
        now = time.time()
        if self._expiry <= now:
            self._expire(now)
        response_url = URL(url)
        for line in lines:
            if len(line.encode("utf-8", "surrogateescape")) > MAX_COOKIE_BYTES:
                self.dropped += 1
                continue
            parsed: SimpleCookie = SimpleCookie()
            try:
                parsed.load(line)
            except CookieError:
                continue
            for name, morsel in parsed.items():
                self._take(response_url, name, morsel, now)

    def __len__(self) -> int:
        return len(self._live)

    def held(self) -> frozenset[tuple[str, str, str, str]]:
        """(domain, path, name, value) of each cookie held: what two jars are compared
        by (``header`` sends what fits aiohttp's limits, in an order of its own)."""
        return frozenset((s.domain, s.path, s.name, s.value) for s in self._live.values())

    @property
    def dirty(self) -> bool:
        """Learnt something the store may not hold yet (``changes`` tells what)."""
        return bool(self._dirty) or self._overflow or self._legacy

    # the jar ----------------------------------------------------------------------------
    def _take(
        self,
        response_url: URL,
        name: str,
        morsel: Morsel[str],
        now: float,
        deadline: float | None = None,
    ) -> CookieState | None:
        """Hand one cookie to aiohttp's jar (its RFC 6265 rules decide), then mirror what
        it did: the cookie kept (within the caps), deleted, or refused. ``deadline``
        (a restored record's) wins over the morsel's own expiry."""
        hostname = response_url.raw_host or ""
        domain = morsel["domain"]
        if domain and domain[-1] == ".":
            domain = ""  # aiohttp ignores such a Domain: host-only
        if domain and domain[0] == ".":
            domain = domain[1:]
        path = morsel["path"]
        if not path or path[0] != "/":
            path = response_url.path
            path = "/" + path[1 : path.rfind("/")] if path.startswith("/") else "/"
        ident = (domain or hostname, path.rstrip("/"), name)
        bucket = self._jar.cookies.get(ident[:2])
        before = None if bucket is None else bucket.get(name)
        self._jar.update_cookies({name: morsel}, response_url)
        bucket = self._jar.cookies.get(ident[:2])
        after = None if bucket is None else bucket.get(name)
        if after is None:  # deleted (Max-Age <= 0, an Expires past), or never there
            if ident in self._live:
                self._drop(ident)
            return None
        if after is before and domain and not aiohttp.CookieJar._is_domain_match(domain, hostname):
            return None  # refused: the cookie there is another host's
        if deadline is None:
            deadline = _deadline(morsel, now)
        state = CookieState(
            name=name, value=after.value, coded=after.coded_value, domain=ident[0],
            host_only=not domain, path=after["path"], secure=bool(after["secure"]),
            httponly=bool(after["httponly"]), samesite=str(after["samesite"] or ""),
            deadline=deadline,
        )  # fmt: skip
        if self._too_big(state):  # a path from a very long URL: never stored whole
            self._expunge(state)
            if ident in self._live:
                self._drop(ident)
            self.dropped += 1
            return None
        self._set(state)
        return state if state.ident in self._live else None

    def _too_big(self, state: CookieState) -> bool:
        """Whether ``state``'s record passes ``MAX_RECORD_BYTES`` (JSON writes a
        character in at most 6 bytes: the exact size only when that could pass)."""
        chars = state.name + state.value + state.coded + state.domain + state.path
        if 6 * (len(chars) + len(state.samesite)) + 200 <= MAX_RECORD_BYTES:
            return False
        return len(state.encode(self._next_seq)) > MAX_RECORD_BYTES

    def _set(self, state: CookieState) -> None:
        ident = state.ident
        old = self._live.get(ident)
        self._live[ident] = state  # a cookie set again keeps its place (its creation)
        self._bytes += state.weight - (0 if old is None else old.weight)
        if old is None:
            self._by_domain.setdefault(state.domain, {})[ident] = None
            self._seq[ident] = self._next_seq
            self._next_seq += 1
        if state.deadline is not None:
            self._expiry = min(self._expiry, state.deadline)
        self._touch(ident)
        domain = self._by_domain[state.domain]
        while len(domain) > MAX_DOMAIN_COOKIES:
            self._evict(next(iter(domain)))
        while len(self._live) > MAX_JOB_COOKIES or self._bytes > MAX_JOB_COOKIE_BYTES:
            oldest = next(iter(self._live))
            if oldest == ident:
                break  # never the cookie just set (each is far below the budget)
            self._evict(oldest)

    def _drop(self, ident: Ident) -> None:
        """Forget a cookie aiohttp's jar dropped (deleted or expired there)."""
        state = self._live.pop(ident)
        self._bytes -= state.weight
        domain = self._by_domain[state.domain]
        del domain[ident]
        if not domain:
            del self._by_domain[state.domain]
        self._seq.pop(ident, None)
        self._touch(ident)

    def _evict(self, ident: Ident) -> None:
        """Remove a cookie from both jars (a cap)."""
        self._expunge(self._live[ident])
        self._drop(ident)
        self.evicted += 1

    def _expunge(self, state: CookieState) -> None:
        """Remove a cookie from aiohttp's jar, by expiring it."""
        tmp: SimpleCookie = SimpleCookie()
        tmp[state.name] = ""
        gone = tmp[state.name]
        gone["path"] = state.path
        gone["max-age"] = "0"
        if not state.host_only:
            gone["domain"] = state.domain
        self._jar.update_cookies({state.name: gone}, URL.build(scheme="http", host=state.domain))

    def _expire(self, now: float) -> None:
        """Forget the cookies past their expiry (aiohttp's jar drops them itself)."""
        expired = [i for i, s in self._live.items() if s.deadline is not None and s.deadline <= now]
        for ident in expired:
            self._drop(ident)
        deadlines = [s.deadline for s in self._live.values() if s.deadline is not None]
        self._expiry = min(deadlines, default=math.inf)

    def _touch(self, ident: Ident) -> None:
        self._touches += 1
        if self._overflow:
            return
        self._dirty.add(ident)
        if len(self._dirty) > _DIRTY_MAX:
            self._overflow = True
            self._dirty.clear()

    # persistence ------------------------------------------------------------------------
    def _want(self, ident: Ident) -> Want:
        """What the store should hold for ``ident``: its cookie, nothing (absent, or
        just as the request's cookies set it), or a tombstone (a request cookie gone)."""
        state = self._live.get(ident)
        base = self._base.get(ident)
        if state is None:
            return None if base is None else GONE
        return None if state == base else state

    def changes(self, now: float | None = None) -> JarChanges | None:
        """What the store lacks of the jar, within this page's allowance (None:
        nothing to write now): a record per cookie whose value, attributes or expiry
        changed since it was stored, a delete per cookie gone, in the budget's order
        (module docstring); what does not fit is owed to later pages. Pure but for slot
        reservations; ``committed`` makes them stored and spends the budget."""
        now = time.time() if now is None else now
        if self._expiry <= now:
            self._expire(now)
        full = self._overflow
        idents = set(self._live) | set(self._stored) | set(self._slot_of) if full else self._dirty
        queue: list[tuple[float, Ident, Want]] = []
        settled: list[Ident] = []
        for ident in idents:
            want = self._want(ident)
            have = self._stored.get(ident)
            if have is None and want is None:
                self._release(ident)
                settled.append(ident)
            elif have is not None and same(want, have[1], now):
                settled.append(ident)
            else:
                since = self._since.setdefault(ident, self.budget.pages)
                queue.append((since + estimate(want) / QUEUE_BYTES_PER_PAGE, ident, want))
        for ident in settled:
            self._since.pop(ident, None)
        if not full:
            self._dirty.difference_update(settled)
        allowance = self.budget.allowance
        spent = OP_BYTES if self._legacy else 0  # the snapshot key's delete
        puts: list[tuple[int, bytes]] = []
        deletes: list[int] = []
        written: list[tuple[Ident, int, Want]] = []
        queue.sort(key=lambda q: (q[0], q[1]))
        reserve = SLOTS_BYTES + (0 if self._noted else NOTE_RESERVE)  # room kept for both
        left = 0
        for i, (_, ident, want) in enumerate(queue):
            raw = b""
            if isinstance(want, CookieState):
                raw = want.encode(self._seq.get(ident, 0))
            elif want is not None:
                raw = dump({"q": 0, "n": ident[2], "d": ident[0], "p": ident[1], "gone": 1})
            cost = OP_BYTES + len(raw)
            if spent + cost + reserve > allowance:
                left = len(queue) - i  # the head of what is left waits: oldest first
                break
            spent += cost
            if want is None:
                deletes.append(self._stored[ident][0])
                written.append((ident, self._stored[ident][0], want))
            else:
                have = self._stored.get(ident)
                slot = self._reserve(ident) if have is None else have[0]
                puts.append((slot, raw))
                written.append((ident, slot, want))
        slots = self._next_slot if self._next_slot > self._stored_slots else None
        if slots is not None:
            spent += SLOTS_BYTES
        deferred = tuple(q[1] for q in queue[len(queue) - left :]) if left else ()
        note = None
        if left and not self._noted:
            note = (
                f"cookie changes past the jar's budget ({JAR_PAGE_BYTES} bytes a page, "
                f"{JAR_BURST_BYTES} at once): {left} held in memory for later pages; "
                "a run resumed before they are stored starts without them"
            )
            spent += len(note) + NOTE_BYTES  # within NOTE_RESERVE
        if not written and slots is None and not self._legacy and note is None:
            if full and not self._dirty and not deferred:
                self._overflow = False
            return None
        return JarChanges(
            tuple(puts), tuple(deletes), slots, self._legacy, tuple(written), self._touches,
            full, spent, deferred, note,
        )  # fmt: skip

    def committed(self, changes: JarChanges) -> None:
        """``changes`` (``EMPTY``: none, but a page) are in the store now: one page's
        allowance earned, their bytes spent."""
        self.budget.spend(changes.cost)
        if changes.deferred:
            self.deferred_pages += 1
        if changes.note is not None:
            self._noted = True
        now = time.time()
        for ident, slot, want in changes.written:
            if want is None:
                self._stored.pop(ident, None)
                if self._want(ident) is None:  # not set again meanwhile: the slot is free
                    self._release(ident)
            else:
                self._stored[ident] = (slot, want)
            if same(self._want(ident), want, now):
                self._dirty.discard(ident)
                self._since.pop(ident, None)
        if changes.slots is not None:
            self._stored_slots = max(self._stored_slots, changes.slots)
        if changes.drop_legacy:
            self._legacy = False
        if changes.full and changes.touches == self._touches:
            self._overflow = len(changes.deferred) > _DIRTY_MAX
            if not self._overflow:
                self._dirty.update(changes.deferred)  # still owed: tracked one by one again

    def _reserve(self, ident: Ident) -> int:
        slot = self._slot_of.get(ident)
        if slot is None:
            if self._free:
                slot = heapq.heappop(self._free)
            else:
                slot, self._next_slot = self._next_slot, self._next_slot + 1
            self._slot_of[ident] = slot
        return slot

    def _release(self, ident: Ident) -> None:
        slot = self._slot_of.pop(ident, None)
        if slot is not None:
            heapq.heappush(self._free, slot)

    def load(
        self, records: Iterable[tuple[int, bytes]], slots: int = 0, legacy: bytes | None = None
    ) -> None:
        """Rebuild the jar from the store (after ``seed``): ``records`` are the
        ``(slot, record)`` pairs ``changes`` wrote, ``slots`` the slot count stored,
        ``legacy`` the snapshot of a job stored before records (replayed only when
        there is no record; the next ``changes`` rewrites it as records and drops it).
        A damaged record is skipped."""
        now = time.time()
        found: list[tuple[int, int, Ident, Want]] = []
        for slot, raw in records:
            decoded = decode(raw)
            if decoded is None or slot < 0:
                continue
            seq, ident, want = decoded
            found.append((seq, slot, ident, want))
        used: set[int] = set()
        for seq, slot, ident, want in sorted(found, key=lambda f: (f[0], f[1])):
            if ident in self._slot_of:  # two records of one cookie: the later wins
                used.discard(self._slot_of[ident])
            self._slot_of[ident] = slot
            self._stored[ident] = (slot, want)
            used.add(slot)
            if isinstance(want, CookieState):
                if want.deadline is not None and want.deadline <= now:
                    continue  # expired while the job was down
                self._restore(want, now)
                if ident in self._live:
                    self._seq[ident] = seq
                    self._next_seq = max(self._next_seq, seq + 1)
            elif ident in self._live:  # a tombstone: a request cookie deleted since
                self._evict(ident)
                self.evicted -= 1
        self._stored_slots = max([slots, *(s + 1 for s in used)])
        self._next_slot = self._stored_slots
        self._free = [s for s in range(self._next_slot) if s not in used]
        heapq.heapify(self._free)
        for slot in set(self._slot_of.values()) - used:  # unreachable: two records, one cookie
            heapq.heappush(self._free, slot)
        if legacy is not None:
            self._legacy = True
            if not found:
                self._replay(legacy)
        self._dirty = set(self._live) | set(self._stored)  # the next changes() settles them

    def _restore(self, state: CookieState, now: float) -> None:
        morsel: Morsel[str] = Morsel()
        try:
            morsel.set(state.name, state.value, state.coded)
        except CookieError:
            return
        morsel["path"] = state.path
        if not state.host_only:
            morsel["domain"] = state.domain
        morsel["secure"] = state.secure
        morsel["httponly"] = state.httponly
        if state.samesite:
            morsel["samesite"] = state.samesite
        if state.deadline is not None:
            morsel["max-age"] = str(max(1, math.ceil(state.deadline - now)))
        try:
            host_url = URL.build(scheme="http", host=state.domain)
        except ValueError:
            return
        self._take(host_url, state.name, morsel, now, state.deadline)

    def _replay(self, raw: bytes) -> None:
        """The snapshot a job stored before records ([[url, set-cookie line], ...])."""
        try:
            entries = json.loads(raw)
        except ValueError:
            return
        if not isinstance(entries, list):
            return
        for entry in entries:
            if (
                isinstance(entry, list)
                and len(entry) == 2
                and all(isinstance(x, str) for x in entry)
            ):
                self.absorb(entry[0], [entry[1]])


def _deadline(morsel: Morsel[str], now: float) -> float | None:
    """The absolute expiry a Set-Cookie gives, as aiohttp's jar reads it."""
    max_age = morsel["max-age"]
    if max_age:
        try:
            delta = int(max_age)
        except ValueError:
            return None
        return 0.0 if delta <= 0 else min(now + delta, float(aiohttp.CookieJar.MAX_TIME))
    expires = morsel["expires"]
    if expires:
        when = aiohttp.CookieJar._parse_date(expires)
        return float(when) if when else None
    return None
