"""The address guard where sockets are opened: one policy, three enforcement points.

Owns ``AddressGuard`` (which endpoints a server-side fetch may connect to), the
``GuardedResolver`` and ``guarded_connector``, the aiohttp connector every outbound
HTTP session of the primary is built with (the engine's pages, robots.txt and
sitemaps, and webhooks).

The guarantees, and why they hold:

- **Every connection is checked at the socket.** The connector's ``socket_factory``
  is called by aiohttp (through aiohappyeyeballs) with the exact address tuple the
  new socket is then ``connect()``-ed to, for every address of every connection:
  names from the resolver, IP literals (which aiohttp does NOT pass to the resolver),
  and a proxy's own address (aiohttp opens the connection to a proxy through the same
  connector path). A blocked address raises ``BlockedAddressError`` before any socket
  exists, so no packet is sent. The address is an IP literal at that point, so no
  spelling question remains: ``blockedaddresses.block_class`` judges the number itself.
- **Names are checked when they are resolved.** ``GuardedResolver`` refuses a name
  when ANY of its addresses is blocked (not just the one tried first), and refuses
  ``localhost``/``*.localhost`` without asking DNS. DNS answers (rebinding included)
  are judged at connect time, per connection, not at job start.
- **The per-hop check** (``refusal_for_url``) is what the engine runs on each hop's
  ``urls.fetch_url`` form before robots.txt and politeness, for a clear error early;
  it is not what the guard relies on.
- ``exempt`` lets exact (IP, port) endpoints through despite their class: the seam
  for an operator-configured proxy on a private address and for tests that must
  reach one loopback site while everything else stays blocked. It matches the
  canonical address text and the port exactly, nothing wider.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from pagesift.core.jobs import blockedaddresses, urls

__all__ = ["AddressGuard", "BlockedAddressError", "GuardedResolver", "guarded_connector"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


class BlockedAddressError(OSError):
    """A connection the guard refuses (a blocked address, or a name resolving to one)."""


@dataclass(frozen=True, slots=True)
class AddressGuard:
    """Which endpoints may be connected to: every address ``blockedaddresses.block_class`` does
    not name, plus the ``exempt`` (canonical IP text, port) pairs."""

    exempt: frozenset[tuple[str, int]] = frozenset()

    def refusal(self, ip: str, port: int) -> str | None:
        """Why connecting to ``ip``:``port`` is refused, or None when it is allowed."""
        if self.exempt:
            canonical = urls.host_of(f"http://[{ip}]/" if ":" in ip else f"http://{ip}/")
            if (canonical, port) in self.exempt:
                return None
        kind = blockedaddresses.block_class(ip)
        return None if kind is None else f"{ip} is a {kind} address"

    def refusal_for_url(self, url: str) -> str | None:
        """The per-hop check of a ``urls.fetch_url`` form: a loopback name or a
        blocked literal address (names are left to the resolver)."""
        host = urls.host_of(url)
        if not host:
            return "the host cannot be parsed"
        if urls.is_loopback_name(host):
            return f"{host} is a loopback name"
        if host[0].isdigit() or ":" in host:  # canonical: a literal address looks so
            try:
                parts = urlsplit(url)
                port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 0)
            except ValueError:
                return "the port cannot be parsed"
            if blockedaddresses.block_class(host) != "unparsable address":
                return self.refusal(host, port)
        return None

    def socket_factory(self, addr_info: AddrInfoType) -> socket.socket:
        """aiohttp's ``socket_factory``: a socket for ``addr_info``, unless its address
        is refused (then ``BlockedAddressError``, and no socket is created)."""
        family, type_, proto, _, address = addr_info
        ip, port = str(address[0]), int(address[1])
        reason = self.refusal(ip, port)
        if reason is not None:
            raise BlockedAddressError(f"connection refused by the address guard: {reason}")
        return socket.socket(family=family, type=type_, proto=proto)


class GuardedResolver(AbstractResolver):
    """Resolver wrapper: refuses a host when ANY of its addresses is blocked."""

    def __init__(self, inner: AbstractResolver, guard: AddressGuard | None = None) -> None:
        self._inner = inner
        self._guard = guard or AddressGuard()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        name = host.rstrip(".").lower()
        if urls.is_loopback_name(name):
            raise BlockedAddressError(f"{host} is a loopback name")
        results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = self._guard.refusal(result["host"], result["port"] or port)
            if reason is not None:
                raise BlockedAddressError(f"{host} resolves to {result['host']}: {reason}")
        return results

    async def close(self) -> None:
        await self._inner.close()


def guarded_connector(
    guard: AddressGuard | None, resolver: AbstractResolver | None = None, **options: Any
) -> aiohttp.TCPConnector:
    """A ``TCPConnector`` (``options`` passed on) enforcing ``guard`` in its resolver and
    in its socket factory; ``guard=None`` (private networks allowed) enforces nothing.
    ``resolver`` is the name resolver the guard wraps (default: aiohttp's); tests give
    one that maps test names to loopback."""
    inner = resolver or DefaultResolver()
    if guard is None:
        return aiohttp.TCPConnector(resolver=inner, **options)
    return aiohttp.TCPConnector(
        resolver=GuardedResolver(inner, guard),
        socket_factory=guard.socket_factory,
        **options,
    )
