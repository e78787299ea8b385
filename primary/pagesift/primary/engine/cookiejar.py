"""A job's cookie jar: RFC 6265 rules, caps, and what of it the store must hold.

Owns ``JobCookies`` (one per scrape call or job run, never shared) and ``JarChanges``
(what a page's write group stores of it). The invariants:

- the rules are aiohttp's ``CookieJar`` (domain, path, Secure, expiry: the jar
  aiohttp's own sessions use); ``JobCookies`` mirrors what it holds, one ``_State``
  per cookie identity (domain, path, name). The request's ``cookies`` are host-only
  cookies of every host it names (``seed``); each ``Set-Cookie`` of a response
  (redirects and error pages included) is applied at once, so the next hop sends it;
- caps (RFC 6265 6.1's minimums, what browsers keep): a Set-Cookie line over
  ``MAX_COOKIE_BYTES`` is dropped (``dropped``); a domain keeps ``MAX_DOMAIN_COOKIES``,
  a job ``MAX_JOB_COOKIES`` cookies and ``MAX_JOB_COOKIE_BYTES`` bytes of them, the
  oldest (by creation: a cookie set again keeps its age) evicted first (``evicted``);
- persistence as changes: ``changes()``, called inside a page's write group, returns
  a record per cookie whose value, attributes or expiry (beyond a small slack) differ
  from its stored record and a delete per cookie gone, each under the cookie's own
  slot (``job/{id}/cookie/{slot}``); ``committed()`` follows the commit. A site that
  sends the same 120 cookies on every response writes them once, not on every page;
- resume: ``load()`` (after ``seed``) re-applies the records in creation order
  through the same jar, each with the expiry it had (an expired one skipped, a
  tombstone deleting its request cookie), rebuilding the jar of the job's last
  committed page. A store holding the snapshot form (Set-Cookie lines, ``legacy``)
  replays it once, and the next page rewrites it as records.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from http.cookies import CookieError, Morsel, SimpleCookie
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from pagesift.shared.jobs import urls

__all__ = [
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
EXPIRY_SLACK = 60.0  # seconds an expiry may move before the record is rewritten (at most)
_DIRTY_MAX = 2 * MAX_JOB_COOKIES  # touched cookies tracked one by one; past it, a full diff

Ident = tuple[str, str, str]  # (domain, path without its trailing "/", name): aiohttp's identity
_GONE = "gone"  # a tombstone: a cookie of the request, deleted since (``JobCookies.changes``)


@dataclass(frozen=True)
class _State:
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
        return _dump(record)


_Want = _State | str | None  # a cookie, ``_GONE``, or nothing to store


def _dump(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogateescape"
    )


def _same(want: _Want, had: _Want, now: float) -> bool:
    """Whether the stored ``had`` still says ``want``: equal, but for an expiry moved
    by less than a tenth of the cookie's remaining life (and ``EXPIRY_SLACK``), so a
    site that refreshes Max-Age on every response is not rewritten on every page."""
    if not isinstance(want, _State) or not isinstance(had, _State):
        return want == had
    if replace(want, deadline=None) != replace(had, deadline=None):
        return False
    if want.deadline is None or had.deadline is None:
        return want.deadline == had.deadline
    slack = min(EXPIRY_SLACK, max(0.0, want.deadline - now) / 10)
    return abs(want.deadline - had.deadline) <= slack


def _decode(raw: bytes) -> tuple[int, Ident, _Want] | None:
    """(seq, identity, cookie or ``_GONE``) of a stored record; None when damaged."""
    try:
        r = json.loads(raw.decode("utf-8", "surrogateescape"))
        name, domain, path, seq = r["n"], r["d"], r["p"], r["q"]
        if not all(isinstance(x, str) for x in (name, domain, path)) or not isinstance(seq, int):
            return None
        if r.get("gone"):
            return seq, (domain, path.rstrip("/"), name), _GONE
        deadline = r["x"]
        state = _State(
            name=name, value=str(r["v"]), coded=str(r.get("c", r["v"])), domain=domain,
            host_only=bool(r["h"]), path=path, secure=bool(r["s"]), httponly=bool(r["o"]),
            samesite=str(r["ss"]), deadline=None if deadline is None else float(deadline),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return seq, state.ident, state


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
    written: tuple[tuple[Ident, int, _Want], ...]
    touches: int  # the jar's touch count when these were computed
    full: bool  # a full diff (the jar lost track of what it touched)

    @property
    def size(self) -> int:
        """Bytes of records it writes."""
        return sum(len(raw) for _, raw in self.puts)


class JobCookies:
    """One job's cookie jar (module docstring). Create it inside the event loop."""

    def __init__(self) -> None:
        self._jar = aiohttp.CookieJar(unsafe=True)  # unsafe = accept IP-address hosts
        self._live: dict[Ident, _State] = {}  # creation order: the oldest first
        self._by_domain: dict[str, dict[Ident, None]] = {}
        self._bytes = 0  # the weight of ``_live``
        self._seq: dict[Ident, int] = {}  # creation order, kept in the records
        self._next_seq = 0
        self._expiry = math.inf  # the earliest deadline in ``_live``
        self._base: dict[Ident, _State] = {}  # what the request's cookies set (``seed``)
        self._stored: dict[Ident, tuple[int, _Want]] = {}  # slot and record in the store
        self._slot_of: dict[Ident, int] = {}  # slots in use or reserved
        self._free: list[int] = []  # slots below ``_next_slot`` not in use (a heap)
        self._next_slot = 0
        self._stored_slots = 0  # the slot count the store records
        self._legacy = False  # the store holds a snapshot from before the records
        self._dirty: set[Ident] = set()  # touched since they were last stored
        self._overflow = False  # too many to track: the next changes() diffs everything
        self._touches = 0
        self.dropped = 0  # Set-Cookie lines over MAX_COOKIE_BYTES, dropped
        self.evicted = 0  # cookies evicted by a cap

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
    ) -> _State | None:
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
        state = _State(
            name=name, value=after.value, coded=after.coded_value, domain=ident[0],
            host_only=not domain, path=after["path"], secure=bool(after["secure"]),
            httponly=bool(after["httponly"]), samesite=str(after["samesite"] or ""),
            deadline=deadline,
        )  # fmt: skip
        self._set(state)
        return state if state.ident in self._live else None

    def _set(self, state: _State) -> None:
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
        """Remove a cookie from both jars (a cap): aiohttp's, by expiring it."""
        state = self._live[ident]
        tmp: SimpleCookie = SimpleCookie()
        tmp[state.name] = ""
        gone = tmp[state.name]
        gone["path"] = state.path
        gone["max-age"] = "0"
        if not state.host_only:
            gone["domain"] = state.domain
        self._jar.update_cookies({state.name: gone}, URL.build(scheme="http", host=state.domain))
        self._drop(ident)
        self.evicted += 1

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
    def _want(self, ident: Ident) -> _Want:
        """What the store should hold for ``ident``: its cookie, nothing (absent, or
        just as the request's cookies set it), or a tombstone (a request cookie gone)."""
        state = self._live.get(ident)
        base = self._base.get(ident)
        if state is None:
            return None if base is None else _GONE
        return None if state == base else state

    def changes(self, now: float | None = None) -> JarChanges | None:
        """What the store lacks of the jar (None: nothing): a record per cookie whose
        value, attributes or expiry changed since it was stored, a delete per cookie
        gone. Pure but for slot reservations; ``committed`` makes them stored."""
        now = time.time() if now is None else now
        if self._expiry <= now:
            self._expire(now)
        full = self._overflow
        idents = set(self._live) | set(self._stored) | set(self._slot_of) if full else self._dirty
        puts: list[tuple[int, bytes]] = []
        deletes: list[int] = []
        written: list[tuple[Ident, int, _Want]] = []
        settled: list[Ident] = []
        for ident in sorted(idents):
            want = self._want(ident)
            have = self._stored.get(ident)
            if have is None:
                if want is None:
                    self._release(ident)
                    settled.append(ident)
                    continue
                slot = self._reserve(ident)
            else:
                slot, had = have
                if _same(want, had, now):
                    settled.append(ident)
                    continue
            if want is None:
                deletes.append(slot)
            elif isinstance(want, _State):
                puts.append((slot, want.encode(self._seq.get(ident, 0))))
            else:
                puts.append((slot, _dump({"q": 0, "n": ident[2], "d": ident[0],
                                          "p": ident[1], "gone": 1})))  # fmt: skip
            written.append((ident, slot, want))
        if not full:
            self._dirty.difference_update(settled)
        slots = self._next_slot if self._next_slot > self._stored_slots else None
        if not written and slots is None and not self._legacy:
            if full and not self._dirty:
                self._overflow = False
            return None
        return JarChanges(
            tuple(puts), tuple(deletes), slots, self._legacy, tuple(written), self._touches, full
        )

    def committed(self, changes: JarChanges) -> None:
        """``changes`` are in the store now."""
        for ident, slot, want in changes.written:
            if want is None:
                self._stored.pop(ident, None)
                if self._want(ident) is None:  # not set again meanwhile: the slot is free
                    self._release(ident)
            else:
                self._stored[ident] = (slot, want)
            if _same(self._want(ident), want, time.time()):
                self._dirty.discard(ident)
        if changes.slots is not None:
            self._stored_slots = max(self._stored_slots, changes.slots)
        if changes.drop_legacy:
            self._legacy = False
        if changes.full and changes.touches == self._touches:
            self._overflow = False

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
        found: list[tuple[int, int, Ident, _Want]] = []
        for slot, raw in records:
            decoded = _decode(raw)
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
            if isinstance(want, _State):
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

    def _restore(self, state: _State, now: float) -> None:
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
