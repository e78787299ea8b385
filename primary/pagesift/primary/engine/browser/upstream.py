"""The guard proxy's connections to origins: dialled to checked addresses, kept idle per owner.

Owns ``Upstream`` (one origin connection and its ``Key``), ``dial`` (a connection to the
first of a list of addresses that answers), ``open_tunnel`` (``CONNECT`` through an
upstream proxy to one address) and ``IdlePool``, the idle connections ``guardproxy``
may send a later request on. Its protocol: a connection is put back only by
``guardproxy``, after a response it read to its end (``proxybody`` says when), and is
taken back only by an exact ``Key``: (owner, address, port, upstream proxy URL, that
proxy's address), where owner is the registration and the addresses are literals the
guard passed. The guarantee: a connection serves one owner only, and only requests
whose own check returned its address (``guardproxy`` builds the keys it asks for from
that check), so reuse skips a ``connect`` but never a check. Why it is bounded and safe:

- **Idle bounds.** At most ``per_key`` connections a key and ``total`` in all (past that
  the oldest idle one is closed), each for at most ``idle`` seconds.
- **A watcher a connection.** While idle, a task reads one byte: an origin that closes
  (or sends anything unasked) ends the watch and the connection is closed at once, so
  a dead or desynchronized connection is not handed out; one that closes in the instant
  before its reuse is ``guardproxy``'s to retry (``proxybody.Stale``).
- **Owned.** ``drop(owner)`` (the registration's ``release``) and ``close`` close every
  idle connection they hold and cancel its watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass, field

from pagesift.primary.engine.browser.proxyhead import Refusal, authority

__all__ = ["IdlePool", "Key", "Upstream", "dial", "open_tunnel"]

# (owner, address, port, upstream proxy URL or "", that proxy's address or "")
Key = tuple[str, str, int, str, str]


@dataclass(eq=False, slots=True)
class Upstream:
    """One connection to an origin (or a ``CONNECT`` tunnel to it); ``requests`` it
    has carried."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    key: Key
    requests: int = 0

    def close(self) -> None:
        self.writer.close()


async def dial(
    ips: list[str],
    port: int,
    *,
    timeout: float,
    limit: int,
    tls: ssl.SSLContext | None = None,
    name: str = "",
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
    """A connection to the first of ``ips`` (checked addresses) that answers, and that
    address; ``Refusal`` (502 or 504) when none does."""
    code, msg = "connect", "no address"
    for ip in ips:
        try:
            async with asyncio.timeout(timeout):
                r, w = await asyncio.open_connection(
                    ip, port, ssl=tls, server_hostname=name or None, limit=limit
                )
            return r, w, ip
        except OSError as exc:  # TimeoutError included
            code = "timeout" if isinstance(exc, TimeoutError) else "connect"
            why = "timed out" if code == "timeout" else exc.strerror or str(exc)
            msg = f"cannot connect to {authority(ip, port)}: {why}"
    if code == "timeout":
        raise Refusal(504, "Gateway Timeout", code, msg)
    raise Refusal(502, "Bad Gateway", code, msg)


async def open_tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    where: str,
    auth: str,
    timeout: float,
) -> None:
    """Ask the upstream proxy on ``reader``/``writer`` to ``CONNECT`` to ``where`` (an
    address and port, never a name); ``Refusal`` unless it answers 2xx. The proxy's
    answer must not carry a body (a 2xx to ``CONNECT`` has none)."""
    writer.write(f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\n{auth}\r\n".encode())
    try:
        async with asyncio.timeout(timeout):
            answer = await reader.readuntil(b"\r\n\r\n")
    except (OSError, asyncio.LimitOverrunError, asyncio.IncompleteReadError) as exc:
        raise Refusal(502, "Bad Gateway", "connect", f"the proxy failed: {exc}") from None
    except TimeoutError:
        raise Refusal(504, "Gateway Timeout", "timeout", "the proxy did not answer") from None
    status = answer.split(b" ", 2)[1:2]
    if not status or not status[0].startswith(b"2"):
        line = answer.split(b"\r\n", 1)[0].decode("latin-1")[:100]
        raise Refusal(502, "Bad Gateway", "connect", f"the proxy refused: {line}")


@dataclass(eq=False, slots=True)
class _Idle:
    conn: Upstream
    since: float
    watch: asyncio.Task[None] | None = None


@dataclass
class IdlePool:
    """Idle origin connections by ``Key`` (module docstring)."""

    per_key: int = 8
    total: int = 128
    idle: float = 15.0
    _idle: dict[Key, list[_Idle]] = field(default_factory=dict)  # newest last
    _watches: set[asyncio.Task[None]] = field(default_factory=set)
    _closed: bool = False

    def __len__(self) -> int:
        return sum(len(stack) for stack in self._idle.values())

    async def take(self, key: Key) -> Upstream | None:
        """The newest idle connection of ``key`` still open, or None."""
        while stack := self._idle.get(key):
            entry = stack.pop()
            if not stack:
                del self._idle[key]
            assert entry.watch is not None
            entry.watch.cancel()
            try:
                await asyncio.wait({entry.watch})  # its read has let go of the reader
            except BaseException:  # the taker was cancelled: nobody holds it now
                entry.conn.close()
                raise
            if entry.watch.cancelled() and not entry.conn.writer.is_closing():
                return entry.conn
            entry.conn.close()
        return None

    def put(self, conn: Upstream) -> bool:
        """Keep ``conn`` idle (False, and closed, past the bounds or once closed)."""
        if self._closed or conn.writer.is_closing() or self.per_key < 1 or self.total < 1:
            conn.close()
            return False
        stack = self._idle.get(conn.key, [])
        if len(stack) >= self.per_key:
            self._evict(stack[0])
        elif len(self) >= self.total:
            oldest = min((s[0] for s in self._idle.values()), key=lambda e: e.since)
            self._evict(oldest)
        entry = _Idle(conn, time.monotonic())
        self._idle.setdefault(conn.key, []).append(entry)
        entry.watch = asyncio.get_running_loop().create_task(self._watch(entry))
        self._watches.add(entry.watch)
        entry.watch.add_done_callback(self._watches.discard)
        return True

    def drop(self, owner: str) -> int:
        """Close every idle connection of ``owner``; how many there were."""
        keys = [k for k in self._idle if k[0] == owner]
        gone = [entry for k in keys for entry in self._idle.pop(k)]
        for entry in gone:
            self._end(entry)
        return len(gone)

    async def close(self) -> None:
        """Close every idle connection; take no more."""
        self._closed = True
        for stack in list(self._idle.values()):
            for entry in stack:
                self._end(entry)
        self._idle.clear()
        await asyncio.gather(*self._watches, return_exceptions=True)

    async def _watch(self, entry: _Idle) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(self.idle):
                await entry.conn.reader.read(1)  # a byte or EOF: done either way
        self._forget(entry)
        entry.conn.close()

    def _evict(self, entry: _Idle) -> None:
        self._forget(entry)
        self._end(entry)

    def _forget(self, entry: _Idle) -> None:
        stack = self._idle.get(entry.conn.key)
        if stack is not None and entry in stack:
            stack.remove(entry)
            if not stack:
                del self._idle[entry.conn.key]

    @staticmethod
    def _end(entry: _Idle) -> None:
        if entry.watch is not None:
            entry.watch.cancel()
        entry.conn.close()
