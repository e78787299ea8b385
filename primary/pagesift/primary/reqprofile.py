"""Request control per job: what every request of one scrape or job sends.

Owns ``RequestProfile`` (one per scrape call or job run), ``JobCookies`` (a job's
cookie jar) and ``ProxyPool`` (the server's named proxies and which one a request
goes through). The engine (``fetch``) applies a profile on every hop; the job
runtime (``jobs``) builds it and persists the jar.

Where each setting comes from, and why a resumed job sends the same requests:

- ``RequestProfile.build`` is a function of the job's stored ``ScrapeOptions``, the
  server config and the owner's permissions, all read again when a job resumes
  (after a restart or on the new primary after a failover). Headers, user agent,
  timeout, TLS choice and proxy are therefore those the job was started with.
  Permissions are read from today's accounts file: an account that lost
  ``allow_proxy_url`` gets its job failed (``PermissionError``), one that lost
  ``allow_ignore_robots`` gets robots.txt obeyed again.
- The pool's choice for a host is a CRC-32 of the host (``per_host``), so a sticky
  host keeps its proxy on either node of a pair; ``per_request`` rotates in order.
- Cookies: the jar is aiohttp's ``CookieJar`` (RFC 6265 domain, path, Secure and
  expiry rules, the jar aiohttp's own sessions use), one per job, never shared.
  The request's ``cookies`` are host-only cookies of every host the request names.
  Each ``Set-Cookie`` a response carries (redirects and error pages included) is
  applied at once, so the next hop sends it. What the jar learnt is kept as the
  Set-Cookie lines themselves, the latest per (host, name, domain, path), at most
  ``MAX_LINES``; ``snapshot()`` is what the job runtime writes in a page's write
  group when the jar changed, and ``restore()`` replays it in order on resume, which
  rebuilds the same jar (a Max-Age restarts from the replay; an Expires date holds).

Safety: a profile never widens what the address guard allows. A custom
``proxy_url`` was checked by validation and is connected to through the guarded
connector like any host; the engine checks each hop's target too (``fetch``).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from pagesift.primary.robots import agent_token
from pagesift.shared import urls
from pagesift.shared.config import ServerConfig
from pagesift.v1 import jobs_pb2

__all__ = ["JobCookies", "ProxyPool", "RequestProfile"]

MAX_LINES = 200  # Set-Cookie lines a job's jar keeps for a restart
MAX_LINE_BYTES = 4096  # a longer Set-Cookie line is ignored (RFC 6265 6.1's minimum)
ROTATIONS = ("per_host", "per_request")
_PROXY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class JobCookies:
    """One job's cookie jar (module docstring). Create it inside the event loop."""

    def __init__(self) -> None:
        self._jar = aiohttp.CookieJar(unsafe=True)  # unsafe = accept IP-address hosts
        self._lines: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        self.dirty = False  # learnt something not yet in a snapshot

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
        for origin in sorted(origins):
            self._jar.update_cookies(dict(cookies), URL(origin))

    def header(self, url: str) -> str | None:
        """The Cookie header for a request to ``url`` (None: no cookie applies)."""
        found = self._jar.filter_cookies(URL(url))
        if not found:
            return None
        return "; ".join(f"{name}={morsel.coded_value}" for name, morsel in found.items())

    def absorb(self, url: str, lines: Iterable[str]) -> None:
        """Apply the Set-Cookie ``lines`` of a response from ``url``."""
        for line in lines:
            if len(line) > MAX_LINE_BYTES:
                continue
            parsed: SimpleCookie = SimpleCookie()
            try:
                parsed.load(line)
            except CookieError:
                continue
            if not parsed:
                continue
            self._jar.update_cookies(parsed, URL(url))
            host = urls.host_of(url)
            for name, morsel in parsed.items():
                key = (host, name, morsel["domain"].lower(), morsel["path"])
                self._lines.pop(key, None)
                self._lines[key] = (url, line)
            while len(self._lines) > MAX_LINES:
                del self._lines[next(iter(self._lines))]
            self.dirty = True

    def snapshot(self) -> bytes:
        """What the jar learnt, for ``restore`` (JSON: [[url, set-cookie line], ...])."""
        return json.dumps([list(entry) for entry in self._lines.values()]).encode()

    def restore(self, raw: bytes) -> None:
        """Replay a ``snapshot`` (after ``seed``); a damaged one is ignored."""
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
        self.dirty = False


@dataclass(frozen=True)
class ProxyPool:
    """The server's proxies (``[server.proxies]``: name -> URL), its rotation and the
    default a job gets when it names none."""

    proxies: tuple[tuple[str, str], ...] = ()  # (name, url), sorted by name
    rotation: str = "per_host"
    default: str = ""

    @classmethod
    def from_config(cls, config: ServerConfig) -> ProxyPool:
        """The pool of ``config``; ``ValueError`` naming the key when it is malformed."""
        if not isinstance(config.proxies, dict):
            raise ValueError("proxies: must be a table of name = URL")
        for name, url in config.proxies.items():
            if not name or len(name) > 64 or not set(name) <= _PROXY_NAME_CHARS or name == "pool":
                raise ValueError(f"proxies.{name}: a name is 1-64 of [A-Za-z0-9._-], not 'pool'")
            if not isinstance(url, str):
                raise ValueError(f"proxies.{name}: must be a URL string")
            bare = urls.strip_userinfo(url)
            problem = urls.validate(bare, 2048)
            if problem is not None:
                raise ValueError(f"proxies.{name}: {problem}")
        if config.proxy_rotation not in ROTATIONS:
            raise ValueError(f"proxy_rotation: {config.proxy_rotation!r} is not one of {ROTATIONS}")
        default = config.default_proxy
        if default and default != "pool" and default not in config.proxies:
            raise ValueError(f"default_proxy: {default!r} is not a proxy of [server.proxies]")
        if default == "pool" and not config.proxies:
            raise ValueError("default_proxy: 'pool' with no [server.proxies]")
        return cls(tuple(sorted(config.proxies.items())), config.proxy_rotation, default)

    def choose(self, choice: str, host: str, turn: int) -> str | None:
        """The proxy URL for a request to ``host`` by a job that chose ``choice`` ("",
        "pool" or a name; "" means the default), or None for a direct connection.
        ``turn`` counts requests (``per_request`` rotation)."""
        choice = choice or self.default
        if not choice:
            return None
        if choice != "pool":
            return dict(self.proxies).get(choice)
        if not self.proxies:
            return None
        if self.rotation == "per_request":
            index = turn % len(self.proxies)
        else:
            index = zlib.crc32(host.encode()) % len(self.proxies)
        return self.proxies[index][1]

    def endpoints(self) -> list[str]:
        """Every proxy URL of the pool (without credentials)."""
        return [urls.strip_userinfo(url) for _, url in self.proxies]


@dataclass
class RequestProfile:
    """What each request of one scrape or job sends (module docstring)."""

    headers: dict[str, str] = field(default_factory=dict)  # the job's own headers
    user_agent: str = ""  # "" = the server's
    timeout: float | None = None  # seconds for one request; None = the server's
    verify_tls: bool = True
    proxy: str = ""  # "", "pool" or a pool name (ProxyPool.choose)
    proxy_url: str = ""  # the account's own proxy (wins over ``proxy``)
    respect_robots: bool = True
    cookies: JobCookies = field(default_factory=JobCookies)

    @classmethod
    def build(
        cls,
        options: jobs_pb2.ScrapeOptions,
        targets: Iterable[str],
        *,
        may_ignore_robots: bool,
        may_use_proxy_url: bool,
    ) -> RequestProfile:
        """The profile of a scrape or job whose request names ``targets`` (its URLs).

        ``PermissionError`` when the options use a proxy URL the owner may not use;
        ``ignore_robots_txt`` without the permission is simply not honoured."""
        if options.proxy_url and not may_use_proxy_url:
            raise PermissionError("options.proxy_url: the account may no longer use its own proxy")
        timeout = None
        if options.HasField("timeout"):
            timeout = options.timeout.seconds + options.timeout.nanos / 1e9
        profile = cls(
            headers=dict(options.headers),
            user_agent=options.user_agent,
            timeout=timeout if timeout and timeout > 0 else None,
            verify_tls=not options.skip_tls_verification,
            proxy=options.proxy,
            proxy_url=options.proxy_url,
            respect_robots=not (options.ignore_robots_txt and may_ignore_robots),
        )
        profile.cookies.seed(options.cookies, targets)
        return profile

    def robots_agent(self, server_agent: str) -> str:
        """The product token robots.txt groups are matched with for this profile."""
        return agent_token(self.user_agent or server_agent)
