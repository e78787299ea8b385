"""The bounds of a listener and the count of its open connections (pure, no I/O).

What it owns
------------
``ListenerLimits`` (what one listener keeps: header, idle and body timeouts, requests
per connection, connection caps in all and per client), ``client_key`` (who a peer
counts as: its IPv4 address, or its IPv6 /64, so one host's many addresses are one
client) and ``ConnectionGate`` (the caps: ``admit`` counts a connection in or names the
cap it is past; ``release`` counts it out). ``pagesift.core.util.listeners`` runs them
on sockets; the CLI reads the defaults here without loading aiohttp.

The guarantee: ``open`` never passes ``max_connections``, nor one client's count
``max_per_client`` (when set), because nothing is counted in past them.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["BACKLOG", "ConnectionGate", "ListenerLimits", "client_key"]

BACKLOG = 128  # the listen queue; also how many sockets one accept turn takes at most


@dataclass(frozen=True)
class ListenerLimits:
    """The bounds of one listener (module docstring); 0 for ``max_requests`` or
    ``max_per_client`` means none."""

    header_timeout: float = 10.0
    idle_timeout: float = 30.0
    body_timeout: float = 60.0
    max_requests: int = 1_000
    max_connections: int = 4_096
    max_per_client: int = 256

    def __post_init__(self) -> None:
        for name in ("header_timeout", "idle_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0 seconds")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.max_requests < 0 or self.max_per_client < 0:
            raise ValueError("max_requests and max_per_client must not be negative")


def client_key(peer: Any) -> str:
    """Who a peer address counts as: its IPv4 address, its IPv6 /64 ("" if unknown)."""
    host = peer[0] if isinstance(peer, tuple) and peer else peer
    if not isinstance(host, str):
        return ""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class ConnectionGate:
    """The open connections, in all and per client; ``admit`` says why not (or None)."""

    def __init__(self, max_connections: int, max_per_client: int = 0) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.open = 0
        self._per_client: Counter[str] = Counter()

    def admit(self, client: str) -> str | None:
        """Count a new connection of ``client`` in, or the cap it is past ("total",
        "per_client") and count nothing."""
        if self.open >= self.max_connections:
            return "total"
        if self.max_per_client and self._per_client[client] >= self.max_per_client:
            return "per_client"
        self.open += 1
        self._per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        """An admitted connection of ``client`` has ended."""
        self.open -= 1
        left = self._per_client[client] - 1
        if left > 0:
            self._per_client[client] = left
        else:
            del self._per_client[client]

    def of(self, client: str) -> int:
        return self._per_client[client]
