"""The hostile *client* of issue 28's finding 1: idle and slowloris connections by the thousand.

Not a route family (no ``ROUTES``): ``Flood`` opens connections to an HTTP port from
many loopback source addresses (``127.0.0.X``: each a client of its own for the per-
client cap) and keeps every one open for as long as the server lets it. An *idle*
connection sends nothing; a *slowloris* one sends a request head one byte every
``trickle`` seconds and never ends it. Each ``Conn`` records when it was connected and
when (and how: "reset", "eof", "refused" at connect, "connect_timeout") the server
ended it, so a test can tell refusals at once from timeouts
from never. ``tests/test_hostile_connections.py`` floods real nodes and a real
``pagesift gateway``; ``bench.flood`` does the full 20,000.

Bounded: ``attempts`` connections, at most ``in_flight`` connecting at once, every
task cancelled by ``close``; a connection the local process cannot open (its own
descriptors) is recorded as ``local_error``, not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from dataclasses import dataclass, field

__all__ = ["Conn", "Flood", "fd_count", "raise_own_limit", "server_established"]

SLOW_HEAD = b"GET / HTTP/1.1\r\nHost: flood\r\nX-Slow: " + b"a" * 4000


def raise_own_limit() -> int:
    """This process's soft RLIMIT_NOFILE raised to its hard limit; the new soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fd_count(pid: int) -> int:
    """Open descriptors of process ``pid`` (/proc/PID/fd)."""
    from pathlib import Path

    try:
        return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return 0


def server_established(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (the server's side of
    them: /proc/net/tcp, this network namespace). A flood's client can see more: a
    connection the kernel completed while the server's accept queue was full is open on
    the client's side alone (its final ACK dropped; an idle client never learns)."""
    from pathlib import Path

    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
            count += 1
    return count


@dataclass
class Conn:
    source: str
    slow: bool
    opened: float = 0.0  # when connected (0: never)
    ended: float = 0.0  # when the server ended it (0: not yet)
    how: str = ""  # "reset", "eof", "refused" (at connect), "local_error"

    def lasted(self) -> float | None:
        """Seconds from connect to the server's end (None while open or never opened)."""
        return self.ended - self.opened if self.opened and self.ended else None


@dataclass
class Flood:
    host: str
    port: int
    attempts: int
    slow_share: float = 0.1  # of attempts, slowloris
    sources: int = 10  # 127.0.0.(10 + i)
    in_flight: int = 256
    trickle: float = 1.0
    connect_timeout: float = 5.0
    conns: list[Conn] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> None:
        """Make every attempt (returns once each has connected or failed)."""
        gate = asyncio.Semaphore(self.in_flight)
        slow_every = max(1, round(1 / self.slow_share)) if self.slow_share else 0
        for i in range(self.attempts):
            conn = Conn(
                f"127.0.0.{10 + i % self.sources}", bool(slow_every and i % slow_every == 0)
            )
            self.conns.append(conn)
            connected = asyncio.get_running_loop().create_future()
            await gate.acquire()
            task = asyncio.create_task(self._one(conn, connected))
            connected.add_done_callback(lambda _f: gate.release())
            self._tasks.append(task)
        for _ in range(self.in_flight):  # every attempt has connected or failed
            await gate.acquire()

    async def _one(self, conn: Conn, connected: asyncio.Future[None]) -> None:
        try:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, local_addr=(conn.source, 0)
                    )
            except TimeoutError:  # a listen queue full for good (the old listeners)
                conn.how = "connect_timeout"
                return
            except (ConnectionResetError, ConnectionRefusedError):
                conn.how, conn.opened = "refused", time.monotonic()
                conn.ended = conn.opened
                return
            except OSError:
                conn.how = "local_error"
                return
            finally:
                if not connected.done():
                    connected.set_result(None)
            conn.opened = time.monotonic()
            self._writers.append(writer)
            feeder = asyncio.create_task(self._feed(writer)) if conn.slow else None
            try:
                data = await reader.read(65536)
                while data:  # a server that answers something: read until it closes
                    data = await reader.read(65536)
                conn.how = "eof"
            except ConnectionResetError:
                conn.how = "reset"
            except OSError:
                conn.how = "reset"
            conn.ended = time.monotonic()
            if feeder is not None:
                feeder.cancel()
            writer.close()
        except asyncio.CancelledError:
            pass

    async def _feed(self, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            for byte in SLOW_HEAD:
                writer.write(bytes([byte]))
                await asyncio.sleep(self.trickle)

    # ---------------------------------------------------------------- what happened

    def opened(self) -> list[Conn]:
        return [c for c in self.conns if c.opened and c.how != "refused"]

    def open_now(self) -> int:
        return sum(1 for c in self.conns if c.opened and not c.ended)

    def ended_within(self, seconds: float) -> int:
        """Connections the server ended within ``seconds`` of their connect (refusals
        at connect included)."""
        return sum(1 for c in self.conns if (d := c.lasted()) is not None and d <= seconds)

    def local_errors(self) -> int:
        return sum(1 for c in self.conns if c.how == "local_error")

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
