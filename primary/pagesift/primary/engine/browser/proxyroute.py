"""Where one request of the guard proxy may go: its checked addresses, and how to reach them.

Owns ``Route`` (a target's checked addresses and port, and the upstream proxy to reach
them through, with that proxy's own checked addresses) and ``Router``, which makes one
for each request: the name resolved through ``netguard.GuardedResolver`` (``localhost``
refused without DNS; a name refused when ANY address is blocked) and every address
re-checked on the very text that will be connected to; the upstream proxy is a job's
own ``proxy_url`` (judged by the full guard, as ``sessions``) or the pool's choice (the
pool's literal endpoints exempt, for proxy connections only). The guarantee: a
``Route`` holds only addresses the guard passed for the request it was made for, and
``Route.keys`` names the idle connections (``upstream.Key``) that request may be sent
on, so a connection reused from ``upstream.IdlePool`` goes where this request's own
check said it may; a refusal is a ``Refusal`` (403 ``blocked_address``, 502/504 ``dns``)
before any socket exists.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver

from pagesift.core.jobs import urls
from pagesift.primary.engine.browser.proxyhead import Refusal, Target
from pagesift.primary.engine.browser.upstream import Key
from pagesift.primary.engine.netguard import AddressGuard, BlockedAddressError, GuardedResolver
from pagesift.primary.engine.reqprofile import ProxyPool

__all__ = ["Route", "Router", "is_literal", "pool_endpoints"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request may go: its target's checked addresses and port, and the
    upstream proxy (URL, checked addresses, port, TLS name, credentials line) if any."""

    addresses: tuple[str, ...]
    port: int
    via: str = ""
    via_ips: tuple[str, ...] = ()
    via_port: int = 0
    via_tls: str = ""
    via_auth: str = ""

    def keys(self, owner: str) -> list[Key]:
        """The idle connections of ``owner`` this request may be sent on, best first:
        direct, one to each checked address; through a proxy, a tunnel to the first
        checked address (the one asked of the proxy) from each of its addresses."""
        if not self.via:
            return [(owner, a, self.port, "", "") for a in self.addresses]
        return [(owner, self.addresses[0], self.port, self.via, ip) for ip in self.via_ips]


class Router:
    """Routes for one proxy's requests (module docstring); ``resolver`` is set by the
    proxy once its loop runs."""

    def __init__(
        self,
        guard: AddressGuard | None,
        pool: ProxyPool,
        resolver: AbstractResolver | None,
        timeout: float,
    ) -> None:
        self.guard, self.pool, self.resolver, self.timeout = guard, pool, resolver, timeout
        self.proxy_guard = guard
        if guard is not None:  # the pool's literal endpoints, for proxy connections only
            self.proxy_guard = AddressGuard(exempt=guard.exempt | pool_endpoints(pool))
        self._turns = 0

    async def route(self, target: Target, proxy: str, proxy_url: str) -> Route:
        """Where ``target`` may be reached: its checked addresses, directly or through
        ``proxy_url`` or the pool's choice for ``proxy``. ``Refusal`` says why not."""
        addresses = tuple(await self.checked(self.guard, target.host, target.port))
        self._turns += 1
        upstream = proxy_url or self.pool.choose(proxy, target.host, self._turns)
        if upstream is None:
            return Route(addresses, target.port)
        parts = urlsplit(upstream)
        host = urls.host_of(upstream)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not host:
            raise Refusal(502, "Bad Gateway", "connect", "the proxy URL is not http(s)://")
        port = parts.port or (443 if scheme == "https" else 80)
        # an account's own proxy is judged by the full guard (as ``sessions``)
        guard = self.guard if proxy_url else self.proxy_guard
        proxy_ips = tuple(await self.checked(guard, host, port))
        auth = ""
        if parts.username is not None:
            pair = f"{parts.username}:{parts.password or ''}".encode()
            auth = f"Proxy-Authorization: Basic {base64.b64encode(pair).decode()}\r\n"
        tls = host if scheme == "https" else ""
        return Route(addresses, target.port, upstream, proxy_ips, port, tls, auth)

    async def checked(self, guard: AddressGuard | None, host: str, port: int) -> list[str]:
        """The addresses ``host`` may be connected to, each judged by ``guard``: a
        literal as is; a name resolved here (refused when ANY address is blocked)."""
        addresses = [host]
        if not is_literal(host):
            assert self.resolver is not None
            names = self.resolver if guard is None else GuardedResolver(self.resolver, guard)
            try:
                async with asyncio.timeout(self.timeout):
                    results = await names.resolve(host, port, socket.AF_UNSPEC)
            except BlockedAddressError as exc:
                raise Refusal(403, "Forbidden", "blocked_address", f"{exc}") from None
            except TimeoutError:
                msg = f"resolving {host} timed out"
                raise Refusal(504, "Gateway Timeout", "dns", msg) from None
            except OSError as exc:
                raise Refusal(502, "Bad Gateway", "dns", f"cannot resolve {host}: {exc}") from None
            addresses = list(dict.fromkeys(str(r["host"]) for r in results))[:4]
            if not addresses:
                raise Refusal(502, "Bad Gateway", "dns", f"{host} has no address")
        for address in addresses:  # again, on the very text connected to
            reason = None if guard is None else guard.refusal(address, port)
            if reason is not None:
                msg = f"blocked by the address guard: {host}:{port}: {reason}"
                raise Refusal(403, "Forbidden", "blocked_address", msg)
        return addresses


def is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def pool_endpoints(pool: ProxyPool) -> frozenset[tuple[str, int]]:
    """The (address, port) of every pool proxy named by a literal address."""
    named = ((urls.host_of(url), urlsplit(url)) for url in pool.endpoints())
    return frozenset(
        (host, parts.port or (443 if parts.scheme == "https" else 80))
        for host, parts in named
        if host and is_literal(host)
    )
