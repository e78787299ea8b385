"""Which addresses no fetch made for a caller may reach, and why a URL's host is one.

What it owns
------------
- ``is_blocked_ip(ip)`` is true for every address a server-side fetcher must not reach
  on a user's behalf (loopback, private, link-local, CGNAT, cloud metadata, multicast,
  reserved, unspecified, non-global, and each of those embedded in IPv6: mapped,
  compatible, NAT64, 6to4); ``block_class(ip)`` names the kind;
- ``blocked_reason(url)``: why a URL must not be fetched because of where its host
  points (its canonical host a blocked literal or a loopback name, or a name that
  resolves to a blocked address), or None.

Why it is safe
--------------
It fails closed: an address that does not parse is blocked, a host ``canonical_host``
cannot parse is refused, and a name is blocked when ANY address it resolves to is.
Every spelling of an address is judged as that address (``urls.canonical_host``: the
one host parser). This is the submission-time check (and the webhooks'); the fetch
itself is checked again at the address it connects to (``pagesift.primary.engine.netguard``),
so a name that resolves elsewhere later is still refused. ``blocked_reason`` is the one
function here that does I/O: the running loop's ``getaddrinfo``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from pagesift.core.jobs.urls import host_of, is_loopback_name

__all__ = ["block_class", "blocked_reason", "is_blocked_ip"]

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPAT = ipaddress.ip_network("::/96")


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address carried inside an IPv6 one (mapped, compatible, NAT64, 6to4)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64 or (ip in _IPV4_COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def _block_class(ip: _IPAddress) -> str | None:
    """Which kind of forbidden address ``ip`` is, or None when it may be fetched."""
    if isinstance(ip, ipaddress.IPv6Address):
        v4 = _embedded_v4(ip)
        if v4 is not None:
            return _block_class(v4)
    if ip in _METADATA:
        return "cloud metadata"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "carrier-grade NAT"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-global"
    return None


def _parse_ip(text: str) -> _IPAddress | None:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]  # IPv6 zone id
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_blocked_ip(ip: str) -> bool:
    """True when ``ip`` must not be fetched (see module docstring); unparsable -> True."""
    addr = _parse_ip(ip)
    return addr is None or _block_class(addr) is not None


def block_class(ip: str) -> str | None:
    """Like ``is_blocked_ip`` but names the kind of address ("loopback", "private", ...)."""
    addr = _parse_ip(ip)
    if addr is None:
        return "unparsable address"
    return _block_class(addr)


async def blocked_reason(url: str) -> str | None:
    """Why ``url`` must not be fetched because of where its host points, or None.

    The host is first made canonical (``canonical_host``: every spelling of an
    address is that address; an unparsable host is refused). Literal IPs are checked
    without DNS; ``localhost`` and ``*.localhost`` are blocked without resolving;
    other hosts are resolved with the running loop's ``getaddrinfo`` (which reads
    /etc/hosts) and blocked when ANY address is. A DNS failure returns None (the
    fetch reports it as a dns error).
    """
    host = host_of(url)
    if not host:
        return "the host cannot be parsed"
    if is_loopback_name(host):
        return f"{host} is a loopback name"
    addr = _parse_ip(host)
    if addr is not None:
        kind = _block_class(addr)
        return f"{host} is a {kind} address" if kind else None
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    for info in infos:
        ip = str(info[4][0])
        kind = block_class(ip)
        if kind:
            return f"{host} resolves to {ip}, a {kind} address"
    return None
