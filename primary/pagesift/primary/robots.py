"""Per-origin robots.txt cache (RFC 9309), shared by every job of the server.

Owns the rules of each origin (scheme://host:port). The guarantees:

- robots.txt is fetched at most once per origin per TTL; concurrent callers for one
  origin share that one fetch (a caller that is cancelled does not cancel it for
  the others).
- RFC 9309 outcomes: 2xx -> the parsed rules (first 512 KiB); 4xx (other than 429)
  or more than five redirects -> allow all; 5xx, 429 or unreachable -> disallow all,
  cached only for ``error_ttl`` seconds so the site is asked again soon, with the
  fetch error kept in ``Rules.error``. Following redirects (at most five hops, as the
  RFC asks) is the fetcher's business.
- Groups are matched with a product token (the user agent up to its first "/" or
  space, e.g. ``pagesift``), falling back to ``*``: the server's, or a job's own
  (``rules(url, agent)``: one cached file, read for each agent); ``Crawl-delay`` and
  ``Sitemap:`` lines are exposed. robots.txt itself is always fetched with the
  server's user agent, so one cached copy serves every job.
- Memory is bounded: at most ``max_origins`` entries, oldest dropped first.

``page_directives`` (pure) reads the page-level robots rules: ``<meta name="robots">``
(or ``name=<our token>``) contents and ``X-Robots-Tag`` header values, where a value
may be scoped to one agent (``googlebot: noindex``, ignored unless it is our token).
``none`` means both ``noindex`` and ``nofollow``. The job runtime applies them to
crawls (see ``jobs``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from protego import Protego

__all__ = [
    "ALLOW_ALL",
    "DISALLOW_ALL",
    "RobotsCache",
    "RobotsFetcher",
    "Rules",
    "agent_token",
    "page_directives",
]

MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 asks parsers to read at least 500 KiB

# Fetch robots.txt: (status, body). Raise OSError/TimeoutError (or anything) when the
# server cannot be reached; status 0 also means unreachable.
RobotsFetcher = Callable[[str], Awaitable[tuple[int, bytes]]]


def agent_token(user_agent: str) -> str:
    """The product token robots.txt groups are matched with: "pagesift/0.1 (...)" -> "pagesift"."""
    token = user_agent.strip().split("/", 1)[0].split(None, 1)
    return (token[0] if token else "*").lower()


def page_directives(meta: list[str], headers: list[str], agent: str) -> tuple[bool, bool]:
    """(noindex, nofollow) from meta robots contents and X-Robots-Tag header values.

    ``meta`` holds the contents of ``<meta name="robots">`` and ``<meta name=agent>``;
    a header value ``"bot: a, b"`` applies only when ``bot`` is ``agent`` (or ``*``)."""
    words: set[str] = set()
    for value in meta:
        words.update(w.strip().lower() for w in value.split(","))
    for value in headers:
        first, colon, rest = value.partition(":")
        scope = first.strip().lower()
        if colon and scope and " " not in scope and "," not in scope and scope not in (
            "unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"
        ):  # fmt: skip
            if scope not in (agent, "*"):
                continue
            value = rest
        words.update(w.strip().lower() for w in value.split(","))
    none = "none" in words
    return none or "noindex" in words, none or "nofollow" in words


@dataclass(frozen=True, slots=True)
class Rules:
    """The robots.txt verdicts for one origin and one agent token."""

    parser: Protego | None = None
    allow_all: bool = True
    agent: str = "*"
    crawl_delay: float | None = None
    sitemaps: tuple[str, ...] = field(default_factory=tuple)
    # Why robots.txt could not be fetched (the fetcher's exception), when that is why
    # everything is disallowed; lets the engine report the real cause (dns, connect...).
    error: BaseException | None = None

    def allowed(self, url: str) -> bool:
        if self.parser is None:
            return self.allow_all
        return bool(self.parser.can_fetch(url, self.agent))

    def for_agent(self, agent: str) -> Rules:
        """The same robots.txt read for another agent token (a job's own user agent)."""
        if agent == self.agent or self.parser is None:
            return self
        delay = self.parser.crawl_delay(agent)
        return replace(
            self,
            agent=agent,
            crawl_delay=float(delay) if delay is not None and delay >= 0 else None,
        )


ALLOW_ALL = Rules(allow_all=True)
DISALLOW_ALL = Rules(allow_all=False)


def parse(body: bytes, agent: str) -> Rules:
    """Rules from a robots.txt body (undecodable bytes replaced; extra bytes ignored)."""
    text = body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace")
    parser = Protego.parse(text)
    delay = parser.crawl_delay(agent)
    return Rules(
        parser=parser,
        agent=agent,
        crawl_delay=float(delay) if delay is not None and delay >= 0 else None,
        sitemaps=tuple(parser.sitemaps),
    )


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lowercase, never with userinfo (robots.txt is
    fetched from, and cached under, the origin alone)."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


class RobotsCache:
    """robots.txt rules per origin, fetched once and cached (see module docstring)."""

    def __init__(
        self,
        fetch: RobotsFetcher,
        user_agent: str,
        *,
        ttl: float = 3600.0,
        error_ttl: float = 60.0,
        max_origins: int = 50_000,
    ) -> None:
        self._fetch = fetch
        self.agent = agent_token(user_agent)
        self._ttl = ttl
        self._error_ttl = error_ttl
        self._max = max_origins
        self._cache: dict[str, tuple[float, Rules]] = {}
        self._inflight: dict[str, asyncio.Task[Rules]] = {}

    async def rules(self, url: str, agent: str | None = None) -> Rules:
        """The rules for ``url``'s origin (fetching robots.txt when not cached), read
        for ``agent`` (a product token; default: the server's)."""
        origin = origin_of(url)
        hit = self._cache.get(origin)
        if hit is not None and hit[0] > time.monotonic():
            rules = hit[1]
        else:
            task = self._inflight.get(origin)
            if task is None:
                task = asyncio.ensure_future(self._load(origin))
                self._inflight[origin] = task
            rules = await asyncio.shield(task)
        return rules if agent is None else rules.for_agent(agent)

    async def allowed(self, url: str) -> bool:
        return (await self.rules(url)).allowed(url)

    def forget(self, url: str) -> None:
        """Drop the cached rules of ``url``'s origin."""
        self._cache.pop(origin_of(url), None)

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        self._inflight.clear()
        self._cache.clear()

    async def _load(self, origin: str) -> Rules:
        try:
            rules, ttl = await self._fetch_rules(origin)
            self._store(origin, rules, ttl)
            return rules
        finally:
            self._inflight.pop(origin, None)

    async def _fetch_rules(self, origin: str) -> tuple[Rules, float]:
        try:
            status, body = await self._fetch(origin + "/robots.txt")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return Rules(allow_all=False, agent=self.agent, error=exc), self._error_ttl
        if 200 <= status < 300:
            try:
                return parse(body, self.agent), self._ttl
            except Exception:  # protego is lenient; be safe anyway: a broken file allows
                return ALLOW_ALL, self._ttl
        if 300 <= status < 500 and status != 429:  # 3xx here = more than 5 redirects
            return ALLOW_ALL, self._ttl
        return DISALLOW_ALL, self._error_ttl  # 5xx, 429, unreachable, too many redirects

    def _store(self, origin: str, rules: Rules, ttl: float) -> None:
        cache = self._cache
        cache.pop(origin, None)
        cache[origin] = (time.monotonic() + ttl, rules)
        if len(cache) > self._max:
            now = time.monotonic()
            for key in [k for k, (exp, _) in cache.items() if exp <= now]:
                del cache[key]
            while len(cache) > self._max:
                del cache[next(iter(cache))]
