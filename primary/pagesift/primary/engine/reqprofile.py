"""Request control per job: what every request of one scrape or job sends.

Owns ``RequestProfile`` (one per scrape call or job run: headers, user agent,
timeout, TLS choice, proxy, robots, and its cookie jar, ``cookiejar.JobCookies``) and
``ProxyPool`` (the server's named proxies and which one a request goes through). The
job runtime builds the profile and persists its jar; the engine applies it on every
hop (``sessions.Sessions.hop``). Why a resumed job sends the same requests:

- ``RequestProfile.build`` is a function of the job's stored ``ScrapeOptions``, the
  server config and the owner's permissions, all read again when a job resumes
  (after a restart or on the new primary after a failover). Headers, user agent,
  timeout, TLS choice and proxy are therefore those the job was started with.
  Permissions are read from today's accounts file: an account that lost
  ``allow_proxy_url`` gets its job failed (``PermissionError``), one that lost
  ``allow_ignore_robots`` gets robots.txt obeyed again.
- The pool's choice for a host is a CRC-32 of the host (``per_host``), so a sticky
  host keeps its proxy on either node of a pair; ``per_request`` rotates in order.

Safety: a profile never widens what the address guard allows. A custom
``proxy_url`` was checked by validation and is connected to through the guarded
connector like any host; the engine checks each hop's target too (``sessions``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import urls
from pagesift.core.jobs.validate import PermissionDenied
from pagesift.primary.engine.cookiejar import JobCookies
from pagesift.primary.engine.robots import agent_token
from pagesift.v1 import jobs_pb2

__all__ = ["ProxyPool", "RequestProfile"]

ROTATIONS = ("per_host", "per_request")
_PROXY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


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

        ``PermissionDenied`` (a ``PermissionError`` naming the field) when the options
        use a proxy URL the owner may not use;
        ``ignore_robots_txt`` without the permission is simply not honoured."""
        if options.proxy_url and not may_use_proxy_url:
            raise PermissionDenied(
                "options.proxy_url", "the account may no longer use its own proxy"
            )
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
