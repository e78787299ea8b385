"""Per-host request slots, shared by every job of the server.

Owns the politeness state of each host, and ``Slot``, one request's hold on it
(``HostSlots.slot`` makes a bare one; ``admission.Pass`` is one that runs the
admission checks first, so a request costs one object either way). The guarantees,
per host name:

- at most ``concurrency`` requests are inside ``slot(host, delay)`` at once; waiters
  are served first come, first served;
- two consecutive request starts are at least ``max(min_delay, delay)`` seconds
  apart, where ``delay`` is the later request's (the caller computes it with
  ``effective_delay``: the job's delay, the server's, robots Crawl-delay capped at
  ``MAX_CRAWL_DELAY``);
- ``pause(host, until)`` (a 429/503 with Retry-After, for every job of the node): no
  request to the host starts before ``until`` -- also one that was already waiting
  for its turn when the pause came (it re-checks after its sleep);
- a host's state is dropped as soon as it has no user and its delay window (or
  pause) has passed, so idle hosts cost no memory;
- cancellation at any point (waiting for a permit, waiting for the start time, inside
  the block) releases what was taken;
- with a ``gate`` (a node of a cluster: the hosts its pair holds,
  ``pagesift.primary.jobs.clustered``), a request that has its permit and its turn
  asks ``gate.admit(host)`` last, so nothing is sent to a host the pair does not hold
  at that instant (the gate waits, or raises the page's ``PageError``); and
  ``abandon(lost)`` ends every request inside a slot of a host ``lost`` names (its
  block raises ``HOST_OWNED_ELSEWHERE``: the cancel scope each gated slot opens is set
  to expire at once), so a pair that learns a host moved stops its requests in flight
  before the new owner's handover ends (``pagesift.core.cluster.tenure``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, Self

from pagesift.core.jobs.pageerrors import ErrorCode, PageError

__all__ = ["MAX_CRAWL_DELAY", "HostGate", "HostSlots", "Slot", "effective_delay"]

MAX_CRAWL_DELAY = 60.0
#: A request that met this many new pauses while it waited goes ahead after the last.
MAX_PAUSE_RECHECKS = 100


def effective_delay(server_delay: float, job_delay: float, crawl_delay: float | None) -> float:
    """Seconds between two request starts to one host: the largest of the three,
    with robots.txt's Crawl-delay capped at ``MAX_CRAWL_DELAY``."""
    delay = server_delay if server_delay > job_delay else job_delay
    if crawl_delay is not None and crawl_delay > delay:
        delay = min(crawl_delay, MAX_CRAWL_DELAY)
    return max(delay, 0.0)


class HostGate(Protocol):
    """Whether a request may be sent to a host now: ``admit`` returns when it may,
    waits while it may not yet, raises the page's ``PageError`` when it may not."""

    async def admit(self, host: str) -> None: ...


class _Host:
    __slots__ = (
        "active",
        "drop_handle",
        "hold_until",
        "last_start",
        "paused_until",
        "scopes",
        "users",
        "waiters",
    )

    def __init__(self) -> None:
        self.active = 0  # permits held
        self.users = 0  # callers inside slot() (waiting or holding)
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.last_start = float("-inf")
        self.hold_until = float("-inf")  # the state must live until then (delay window)
        self.paused_until = float("-inf")  # no request starts before (Retry-After)
        self.drop_handle: asyncio.TimerHandle | None = None
        self.scopes: set[asyncio.Timeout] = set()  # gated requests inside the slot


class HostSlots:
    """Per-host concurrency and spacing (see module docstring)."""

    def __init__(self, concurrency: int, min_delay: float = 0.0) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.min_delay = max(min_delay, 0.0)
        self.gate: HostGate | None = None
        self._hosts: dict[str, _Host] = {}

    def __len__(self) -> int:
        """Hosts with live state (busy, or inside their delay window)."""
        return len(self._hosts)

    def pause(self, host: str, until: float) -> None:
        """No request to ``host`` starts before ``until`` (the event loop's clock)."""
        st = self._hosts.get(host)
        if st is None:
            st = self._hosts[host] = _Host()
        if until > st.paused_until:
            st.paused_until = until
        if until > st.hold_until:
            st.hold_until = until
        if st.users == 0:
            if st.drop_handle is not None:
                st.drop_handle.cancel()
            loop = asyncio.get_running_loop()
            st.drop_handle = loop.call_at(st.hold_until, self._drop_if_idle, host, st)

    def paused_for(self, host: str, now: float) -> float:
        """Seconds left of the host's pause (0: none)."""
        st = self._hosts.get(host)
        return 0.0 if st is None else max(0.0, st.paused_until - now)

    def paused_hosts(self, now: float) -> dict[str, float]:
        """Every host still paused, with the seconds left."""
        return {h: st.paused_until - now for h, st in self._hosts.items() if st.paused_until > now}

    def slot(self, host: str, delay: float = 0.0) -> Slot:
        """``async with slots.slot(host, delay):`` -- one request to ``host``."""
        return Slot(self, host, delay)

    def abandon(self, lost: Callable[[str], bool]) -> int:
        """End the gated requests in flight to every host ``lost`` names; how many."""
        now = asyncio.get_running_loop().time()
        ended = 0
        for host, st in self._hosts.items():
            if st.scopes and lost(host):
                for scope in st.scopes:
                    scope.reschedule(now)
                    ended += 1
        return ended

    # --- internals -----------------------------------------------------------------------

    def _user(self, host: str) -> _Host:
        """The host's state, with one more caller inside ``slot()`` (no drop pending)."""
        st = self._hosts.get(host)
        if st is None:
            st = self._hosts[host] = _Host()
        elif st.drop_handle is not None:
            st.drop_handle.cancel()
            st.drop_handle = None
        st.users += 1
        return st

    def _exit(self, host: str, st: _Host) -> None:
        self._release(st)
        self._leave(host, st)

    async def _acquire(self, st: _Host) -> None:
        if st.active < self.concurrency and not st.waiters:
            st.active += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        st.waiters.append(fut)
        try:
            await fut  # the releaser hands its permit over (active unchanged)
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._release(st)  # got the permit but will not use it: pass it on
            else:
                with contextlib.suppress(ValueError):
                    st.waiters.remove(fut)
            raise

    async def _wait_turn(self, st: _Host, delay: float) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(MAX_PAUSE_RECHECKS):  # each pass sleeps until a pause's end
            now = loop.time()
            start = st.last_start + delay
            if start < now:
                start = now
            if start < st.paused_until:
                start = st.paused_until
            previous = st.last_start
            st.last_start = start
            if start + delay > st.hold_until:
                st.hold_until = start + delay
            if start <= now:
                return
            try:
                await asyncio.sleep(start - now)
            except BaseException:
                if st.last_start == start:
                    st.last_start = previous  # give the unused turn back
                raise
            if st.paused_until <= loop.time():
                return
            # a pause came while this request waited for its turn: wait it out too
            if st.last_start == start:
                st.last_start = previous

    def _release(self, st: _Host) -> None:
        while st.waiters:
            fut = st.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        st.active -= 1

    def _leave(self, host: str, st: _Host) -> None:
        st.users -= 1
        if st.users:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= st.hold_until:
            if self._hosts.get(host) is st:
                del self._hosts[host]
        else:
            st.drop_handle = loop.call_at(st.hold_until, self._drop_if_idle, host, st)

    def _drop_if_idle(self, host: str, st: _Host) -> None:
        st.drop_handle = None
        if st.users == 0 and self._hosts.get(host) is st:
            del self._hosts[host]


class Slot:
    """One request's hold on its host (``async with``). Entering (``take``) waits for a
    permit, then for the start time, then asks the gate; leaving gives back what was
    taken, whatever the block raised. ``admission.Pass`` extends it with the checks a
    request passes before its turn (one object per request either way)."""

    __slots__ = ("_scope", "_slots", "_state", "delay", "host")

    def __init__(self, slots: HostSlots, host: str, delay: float = 0.0) -> None:
        self._slots = slots
        self.host = host
        self.delay = delay  # seconds after the host's previous start (the caller's)
        self._state: _Host | None = None
        self._scope: asyncio.Timeout | None = None

    async def take(self) -> Self:
        """Wait for the turn (module docstring); on any exception nothing is held."""
        slots, host = self._slots, self.host
        st = slots._user(host)
        try:
            await slots._acquire(st)
        except BaseException:
            slots._leave(host, st)
            raise
        try:
            await slots._wait_turn(st, max(self.delay, slots.min_delay))
        except BaseException:
            slots._exit(host, st)
            raise
        gate = slots.gate
        if gate is None:
            self._state = st
            return self
        try:
            await gate.admit(host)
            scope = asyncio.timeout(None)
            await scope.__aenter__()
        except BaseException:
            slots._exit(host, st)
            raise
        self._state, self._scope = st, scope
        st.scopes.add(scope)
        return self

    __aenter__ = take

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state, self._state = self._state, None
        scope, self._scope = self._scope, None
        try:
            if scope is not None:
                assert state is not None
                state.scopes.discard(scope)
                try:
                    await scope.__aexit__(exc_type, exc, tb)
                except TimeoutError:
                    raise PageError(
                        ErrorCode.HOST_OWNED_ELSEWHERE,
                        f"host {self.host} moved to another pair of the cluster while "
                        "this request was in flight: abandoned, left to its new owner",
                    ) from None
        finally:
            if state is not None:
                self._slots._exit(self.host, state)
