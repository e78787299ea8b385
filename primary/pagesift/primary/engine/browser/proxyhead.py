"""The guard proxy's HTTP/1.x framing: a request head read, its target, the heads sent on.

Owns the pure text work of ``guardproxy`` (no I/O): ``parse_head`` (a request head,
strict: a token method and header names, no obsolete line folding), ``parse_target``
(``CONNECT host:port`` or an absolute ``http://`` URI, its host canonical through
``urls.host_of``), ``upstream_request`` (origin-form, hop-by-hop headers and those
``Connection`` names dropped) and ``closing_response_head``. The guarantee: one request
per upstream connection and per browser connection (``Connection: close`` both ways),
so a connection is checked by the guard for exactly one request; anything it cannot
read is a ``ValueError`` the proxy answers 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pagesift.shared.jobs import urls

__all__ = [
    "Head", "Target", "authority", "closing_response_head", "parse_head", "parse_target",
    "upstream_request",
]  # fmt: skip

_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "proxy-authorization", "te"))
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed request head: method, request target, header (name, value) pairs."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: a tunnel (CONNECT) or one http request for ``path``."""

    tunnel: bool
    host: str  # canonical, no brackets
    port: int
    path: str = "/"


def parse_head(raw: bytes) -> Head:
    """The head ending ``raw`` (through the blank line); ``ValueError`` when it is not
    an HTTP/1.x request head (obsolete line folding refused)."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError("not an HTTP/1.x request line")
    method, target = parts[0], parts[1]
    if not method or not set(method) <= _TOKEN or not target:
        raise ValueError("bad request line")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TOKEN:
            raise ValueError("bad header line")
        headers.append((name, value.strip(" \t")))
    return Head(method, target, tuple(headers))


def parse_target(head: Head) -> Target:
    """The target of ``head``: ``CONNECT host:port`` or an absolute ``http://`` URI;
    ``ValueError`` otherwise. The host is canonical (``urls.host_of``)."""
    if head.method == "CONNECT":
        authority = head.target
        host_part, sep, port_text = authority.rpartition(":")
        if not sep or not port_text.isdigit() or not host_part:
            raise ValueError("CONNECT needs host:port")
        host, port = urls.host_of(f"http://{authority}/"), int(port_text)
        path = "/"
    else:
        parts = urlsplit(head.target)
        if parts.scheme.lower() != "http" or not parts.netloc:
            raise ValueError("only absolute http:// requests and CONNECT are proxied")
        host = urls.host_of(head.target)
        port = parts.port or 80  # ValueError for a bad port
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not host or not 0 < port < 65536:
        raise ValueError("bad host or port")
    return Target(head.method == "CONNECT", host, port, path)


def upstream_request(head: Head, target: Target) -> bytes:
    """The head sent upstream: origin-form, hop-by-hop headers (and those ``Connection``
    names) dropped, ``Connection: close`` (one request per upstream connection)."""
    named = {n.strip().lower() for n in (head.get("connection") or "").split(",")}
    lines = [f"{head.method} {target.path} HTTP/1.1"]
    if head.get("host") is None:
        lines.append(f"Host: {authority(target.host, target.port)}")
    lines += [f"{k}: {v}" for k, v in head.headers if k.lower() not in _HOP | {"upgrade"} | named]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def closing_response_head(raw: bytes) -> bytes:
    """An upstream response head with its connection headers replaced by ``close``, so
    the browser never sends a second request on this connection."""
    lines = raw.decode("latin-1").split("\r\n")
    kept = [lines[0]] + [
        line for line in lines[1:] if line and line.partition(":")[0].strip().lower() not in _HOP
    ]
    kept += ["Connection: close", "Proxy-Connection: close"]
    return ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1")


def authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
