"""The guard proxy's HTTP/1.x heads: a request head read, its target, the heads sent on.

Owns the pure text work of ``guardproxy`` on heads (no I/O): ``parse_head`` (a request
head, strict: ``HTTP/1.0`` or ``HTTP/1.1``, a token method and header names, no obsolete
line folding, no CR, LF or NUL inside a line), ``parse_target`` (``CONNECT host:port`` or
an absolute ``http://`` URI, its host canonical through ``urls.host_of``),
``upstream_request`` (origin-form, hop-by-hop headers and those ``Connection`` names
dropped, never a framing one, persistent), ``parse_response`` (an origin's response
head, as strict) and ``browser_head`` (that head as the browser gets it, persistent or
closing), and ``Refusal``, what the proxy answers itself. The guarantee: every head
relayed is one this module parsed line by line, so a line the origin or the browser
would split differently (a bare LF or CR, a folded line, a name with spaces) is refused
instead of relayed, no framing header is dropped while its body is relayed, and so no
header smuggles a second message past the framing of ``proxybody``; anything
unreadable is a ``ValueError`` (the proxy answers 400, or 502 for a response). Which
connection a head may travel on is ``guardproxy``'s to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pagesift.core.jobs import urls

__all__ = [
    "Head", "Refusal", "Response", "Target", "authority", "browser_head", "parse_head",
    "parse_response", "parse_target", "request_keeps", "tokens", "upstream_request",
]  # fmt: skip

_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "proxy-authorization", "te"))
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_VERSIONS = ("HTTP/1.0", "HTTP/1.1")
# never dropped for being named in ``Connection``: the framing (and the host) the proxy
# relays by must be the framing the other side reads
_FRAMING = frozenset(("content-length", "transfer-encoding", "host"))


class Refusal(Exception):
    """A request the proxy answers itself: status, reason phrase, error code, message."""

    def __init__(self, status: int, reason: str, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.code, self.message = status, reason, code, message


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed request head: method, request target, header (name, value) pairs."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    version: str = "HTTP/1.1"

    def get(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    def all(self, name: str) -> list[str]:
        low = name.lower()
        return [v for k, v in self.headers if k.lower() == low]


@dataclass(frozen=True, slots=True)
class Response:
    """A parsed response head: version, status, the status line and header pairs."""

    version: str
    status: int
    line: str
    headers: tuple[tuple[str, str], ...]

    def all(self, name: str) -> list[str]:
        low = name.lower()
        return [v for k, v in self.headers if k.lower() == low]


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: a tunnel (CONNECT) or one http request for ``path``."""

    tunnel: bool
    host: str  # canonical, no brackets
    port: int
    path: str = "/"


def _lines(raw: bytes) -> list[str]:
    """The lines of a head ending in the blank line; ``ValueError`` for a CR, LF or NUL
    inside a line (parsers split those differently) or a folded line."""
    text = raw.decode("latin-1")
    if not text.endswith("\r\n\r\n"):
        raise ValueError("the head does not end in a blank line")
    lines = text[:-4].split("\r\n")
    if any("\r" in line or "\n" in line or "\0" in line for line in lines):
        raise ValueError("a bare CR, LF or NUL in the head")
    return lines


def _fields(lines: list[str]) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TOKEN:
            raise ValueError("bad header line")  # a folded line's name starts with a space
        headers.append((name, value.strip(" \t")))
    return tuple(headers)


def parse_head(raw: bytes) -> Head:
    """The head ``raw`` (through the blank line); ``ValueError`` when it is not an
    HTTP/1.0 or 1.1 request head, strictly (module docstring)."""
    lines = _lines(raw)
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in _VERSIONS:
        raise ValueError("not an HTTP/1.x request line")
    method, target = parts[0], parts[1]
    if not method or not set(method) <= _TOKEN or not target:
        raise ValueError("bad request line")
    return Head(method, target, _fields(lines[1:]), parts[2])


def parse_response(raw: bytes) -> Response:
    """The response head ``raw`` (through the blank line), as strict as ``parse_head``:
    ``HTTP/1.0`` or ``1.1``, a three-digit status, token names, no folding."""
    lines = _lines(raw)
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if version not in _VERSIONS or not (code.isascii() and code.isdigit()):
        raise ValueError("not an HTTP/1.x status line")
    if rest[3:4] not in ("", " ") or int(code) < 100:
        raise ValueError("bad status line")
    return Response(version, int(code), lines[0], _fields(lines[1:]))


def tokens(values: list[str]) -> list[str]:
    """The comma-separated tokens of header values, lowercased, empty ones dropped."""
    return [t.strip().lower() for v in values for t in v.split(",") if t.strip()]


def request_keeps(head: Head) -> bool:
    """Whether the browser lets its connection carry another request after this one."""
    said = tokens(head.all("connection") + head.all("proxy-connection"))
    return head.version == "HTTP/1.1" and "close" not in said


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
    """The head sent upstream: origin-form HTTP/1.1, hop-by-hop headers (and those
    ``Connection`` names, and ``Upgrade``) dropped, nothing said of the connection: it
    is persistent (HTTP/1.1's default), and ``guardproxy`` decides whether it is kept."""
    named = set(tokens(head.all("connection"))) - _FRAMING
    lines = [f"{head.method} {target.path} HTTP/1.1"]
    if head.get("host") is None:
        lines.append(f"Host: {authority(target.host, target.port)}")
    lines += [f"{k}: {v}" for k, v in head.headers if k.lower() not in _HOP | {"upgrade"} | named]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def browser_head(resp: Response, *, keep: bool, drop: frozenset[str] = frozenset()) -> bytes:
    """``resp``'s head as the browser gets it: its status line and headers less the
    hop-by-hop ones (and those its ``Connection`` names, and ``drop``); ``keep`` False
    adds ``Connection: close`` (the browser sends nothing more on this connection)."""
    gone = _HOP | (set(tokens(resp.all("connection"))) - _FRAMING) | drop
    lines = [resp.line] + [f"{k}: {v}" for k, v in resp.headers if k.lower() not in gone]
    if not keep:
        lines += ["Connection: close", "Proxy-Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
