"""Admission: the one step every outgoing request of the node passes before it is sent.

Owns ``Admission`` (the node's address guard, robots.txt cache, per-host slots and
adaptive delays, shared by every job and by both engines) and ``Pass``, one request's
way through it. ``async with admission.admit(url, ...) as ticket:`` runs, in this
order, and raises the page's ``PageError`` at the first that refuses:

1. the address guard (``netguard``: loopback names and literal IPs; ``BLOCKED_ADDRESS``);
2. in a cluster, the caller's ``foreign_host``: a host another pair owns is
   ``HOST_OWNED_ELSEWHERE``, never sent (that pair keeps its politeness);
3. robots.txt, when asked, for the caller's agent (``ROBOTS_DISALLOWED``, or the
   reason robots.txt could not be read), read as the caller's request would be sent:
   with certificate verification unless it skips it (``verify_tls``, a request's
   ``skip_tls_verification``: ``robots.RobotsCache``); its Crawl-delay is kept in
   ``crawl_delay``;
4. the politeness delay: with a job delay, the larger of the server's, the job's,
   the Crawl-delay (``politeness.effective_delay``) and the adaptive delay; without
   one (robots.txt, sitemaps) none of its own, but the host's pauses;
5. the host's slot (``politeness.Slot.take``): a permit, the start time, and in a
   cluster, last, the host gate (``HostSlots.gate``: whether the pair holds the host
   at that instant). This is the node's budget for a request; a page's own budget
   (the account's pages, ``jobs.pagedraws``) was drawn by the job runtime before it
   asked the engine, once per page, not per hop.

Inside the block the caller sends its request and reports how it went, before the
slot is given back (so before any later request to the host starts):
``ticket.failed(err)`` for a ``PageError`` (a 429/503 slows the host's adaptive delay
and pauses the host for its Retry-After; one beyond ``max_retry_after`` raises
``RETRY_AFTER_TOO_LONG``), ``ticket.answered(latency)`` for a response (the adaptive
delay follows the latency). ``hops.Fetcher.fetch`` passes it for every hop (robots.txt
and sitemaps included); ``rendering.RenderingEngine`` for a render's navigation. Both
engines thus refuse a URL with the same error, wait the same turns and share one
record of slowed and paused hosts.

Why it is cheap: a ``Pass`` is the request's slot itself (a ``politeness.Slot``), so
a hop allocates and awaits what a bare slot did, plus the robots lookup it asks for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Self

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import urls
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine import retrypolicy
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.politeness import HostSlots, Slot, effective_delay
from pagesift.primary.engine.robots import RobotsCache, RobotsFetcher, Rules

__all__ = ["HOST_DELAY_SERIES", "Admission", "Pass", "robots_verdict"]

HOST_DELAY_SERIES = 50  # hosts whose delay ``pagesift_host_delay_seconds`` shows at most


def robots_verdict(rules: Rules, url: str) -> float | None:
    """``rules``' verdict on ``url``: its Crawl-delay when allowed, else the page's error
    (the reason robots.txt could not be read, when that is why)."""
    if not rules.allowed(url):
        if isinstance(rules.error, PageError):
            raise PageError(rules.error.code, f"{rules.error.message} (fetching robots.txt)")
        raise PageError(ErrorCode.ROBOTS_DISALLOWED, f"robots.txt disallows {url}")
    return rules.crawl_delay


class Admission:
    """The checks and turns of every request (module docstring). ``guard`` None: no
    address is refused here (private networks allowed); ``fetch_robots`` fetches one
    robots.txt (``hops.Fetcher``: through an admission of its own, without robots)."""

    def __init__(
        self, config: ServerConfig, guard: AddressGuard | None, fetch_robots: RobotsFetcher
    ) -> None:
        self.config = config
        self.guard = guard
        self.slots = HostSlots(config.per_host_concurrency, config.per_host_delay)
        self.throttle = retrypolicy.HostThrottle(
            concurrency=config.per_host_concurrency, max_delay=config.throttle_max_delay
        )
        self.robots = RobotsCache(fetch_robots, config.user_agent)

    def admit(
        self,
        url: str,
        *,
        robots: bool,
        agent: str | None,
        job_delay: float | None,
        foreign_host: Callable[[str], str | None] | None = None,
        verify_tls: bool = True,
    ) -> Pass:
        """``async with`` it: one request to ``url`` (in ``urls.fetch_url`` form), robots
        checked for ``agent`` (None: the server's) when ``robots`` (robots.txt read
        with certificate verification unless ``verify_tls`` is False), spaced by
        ``job_delay`` (None: no delay of its own), none to a host ``foreign_host``
        names a reason for."""
        return Pass(self, url, robots, agent, job_delay, foreign_host, verify_tls)

    async def robots_check(
        self, url: str, agent: str | None, verify_tls: bool = True
    ) -> float | None:
        """robots.txt's verdict on ``url`` for ``agent`` outside a request's turn (a
        render's final URL): its Crawl-delay, or the page's error (``robots_verdict``)."""
        return robots_verdict(await self.robots.rules(url, agent, verify_tls=verify_tls), url)

    def slowed(self, host: str, err: PageError) -> None:
        """A failed request: pause the host for its Retry-After, slow its adaptive delay
        on 429/503; a Retry-After beyond ``max_retry_after`` becomes the page's error."""
        if err.code != ErrorCode.HTTP_STATUS or err.status not in retrypolicy.SLOW_DOWN_STATUSES:
            return
        config = self.config
        if config.adaptive_throttle:
            self.throttle.slow_down(host, time.monotonic())
        wait = err.retry_after
        if wait is None or wait <= 0:
            return
        limit = config.max_retry_after
        self.slots.pause(host, asyncio.get_running_loop().time() + min(wait, limit))
        if wait > limit:
            raise PageError(
                ErrorCode.RETRY_AFTER_TOO_LONG,
                f"HTTP {err.status} asks to retry after {wait:g} s, over the server's "
                f"max_retry_after of {limit:g} s",
                status=err.status,
                retry_after=wait,
            ) from err

    def host_delays(self, now: float | None) -> dict[str, float]:
        """The current delay of the ``HOST_DELAY_SERIES`` most recently slowed hosts:
        the adaptive delay, or what is left of a Retry-After pause when longer (at
        ``now``, the loop's clock; None outside a loop: the adaptive delays alone)."""
        out = dict(list(self.throttle.delays().items())[-HOST_DELAY_SERIES:])
        if now is not None:
            for host, left in self.slots.paused_hosts(now).items():
                out[host] = max(out.get(host, 0.0), left)
        if len(out) > HOST_DELAY_SERIES:
            out = dict(sorted(out.items(), key=lambda kv: kv[1])[-HOST_DELAY_SERIES:])
        return out

    async def close(self) -> None:
        await self.robots.close()


class Pass(Slot):
    """One request through an ``Admission``: entering runs the checks, then takes the
    host's slot; ``host``, ``crawl_delay`` and ``delay`` say what it was admitted with."""

    __slots__ = (
        "admission", "agent", "check_robots", "crawl_delay", "foreign_host", "job_delay", "url",
        "verify_tls",
    )  # fmt: skip

    def __init__(
        self,
        admission: Admission,
        url: str,
        robots: bool,
        agent: str | None,
        job_delay: float | None,
        foreign_host: Callable[[str], str | None] | None,
        verify_tls: bool = True,
    ) -> None:
        super().__init__(admission.slots, urls.host_of(url))
        self.admission = admission
        self.url = url
        self.check_robots = robots
        self.agent = agent
        self.job_delay = job_delay
        self.foreign_host = foreign_host
        self.verify_tls = verify_tls
        self.crawl_delay: float | None = None  # robots.txt's, once checked

    async def __aenter__(self) -> Self:
        admission, url, host = self.admission, self.url, self.host
        guard = admission.guard
        if guard is not None:
            reason = guard.refusal_for_url(url)
            if reason is not None:
                raise PageError(ErrorCode.BLOCKED_ADDRESS, reason)
        if self.foreign_host is not None:
            elsewhere = self.foreign_host(host)
            if elsewhere is not None:
                raise PageError(ErrorCode.HOST_OWNED_ELSEWHERE, elsewhere)
        if self.check_robots:
            rules = await admission.robots.rules(url, self.agent, verify_tls=self.verify_tls)
            self.crawl_delay = robots_verdict(rules, url)
        if self.job_delay is not None:
            config = admission.config
            delay = effective_delay(config.per_host_delay, self.job_delay, self.crawl_delay)
            if config.adaptive_throttle:
                adaptive = admission.throttle.delay(host)
                if adaptive > delay:
                    delay = adaptive
            self.delay = delay
        return await self.take()

    def failed(self, err: PageError) -> None:
        """The request failed with ``err`` (``Admission.slowed``: may raise
        ``RETRY_AFTER_TOO_LONG`` in its place). Call it inside the block."""
        self.admission.slowed(self.host, err)

    def answered(self, latency: float) -> None:
        """The host answered in ``latency`` seconds: the adaptive delay follows it."""
        if self.admission.config.adaptive_throttle:
            self.admission.throttle.success(self.host, latency)
