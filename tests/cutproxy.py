"""A loopback TCP proxy that a test can cut, blackhole and heal: a partition of one link.

What it owns
------------
``CutProxy`` listens on 127.0.0.1:<free port> (``address``) and relays every connection
to one upstream ``host:port``, in the test's own event loop. Three states:

- ``OPEN``: bytes flow both ways (``heal`` returns here);
- ``CUT``: every relayed connection is reset at once, and so is every new one as soon
  as it is accepted: a peer that died or a firewall that rejects. The listener stays
  bound (were the port released, another process's ephemeral port could take it, and
  ``heal`` could not listen there again);
- ``BLACKHOLE``: connections stay open and new ones are accepted, but no byte moves
  either way (the relays stop reading, so the senders' buffers fill): a partition as
  TCP sees it, where only the caller's own deadline ends a call. ``heal`` resumes the
  relays where they stopped.

Used by the fault tests for "etcd reachable by one node and not the other" (a node's
``--witness etcd://<proxy>``) and for cutting a pair's replication stream (the primary
advertises the proxy in front of it, so its standby dials through it).

Why a proxy rather than network namespaces
------------------------------------------
Every node keeps 127.0.0.1 and its ordinary command line; one link is cut without
routes, veth pairs or processes started inside a namespace, nothing outlives the test
(no namespace to clean up after a crash), and the same code runs unprivileged in the
bench. What a proxy cannot do (drop packets of a link it does not carry) the faults
here do not need: each cut link is a TCP connection the proxy carries.

Bounds
------
Every relay is a handler task and two pump tasks the proxy tracks; ``cut`` and ``close``
cancel the pumps and wait for the handlers (which close both connections); reads are
at most ``CHUNK`` bytes; ``close`` (also the async context manager's exit) stops the
listener and every relay and waits for them, bounded by ``CLOSE_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
from types import TracebackType

CHUNK = 64 * 1024
CLOSE_TIMEOUT = 5.0


class State(enum.Enum):
    OPEN = "open"
    CUT = "cut"
    BLACKHOLE = "blackhole"


class CutProxy:
    """``async with CutProxy("127.0.0.1:2379") as proxy: ... proxy.cut() ...``."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.state = State.OPEN
        self.port = 0
        self.accepted = 0  # connections accepted since start, a figure for tests
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # one per relayed connection
        self._pumps: set[asyncio.Task[None]] = set()  # two per handler, one each way
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> CutProxy:
        await self._listen()
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.state is State.CUT:
            _reset(writer)
            return
        self.accepted += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), CLOSE_TIMEOUT
            )
        except (OSError, TimeoutError):
            self._writers.discard(writer)
            _reset(writer)
            return
        self._writers.add(up_writer)
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        pumps = {
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        }
        self._pumps |= pumps
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.wait(pumps, timeout=CLOSE_TIMEOUT)
            self._pumps -= pumps
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()
            self._handlers.discard(handler)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self._flowing.wait()  # a blackhole holds every relay here
                data = await src.read(CHUNK)
                if not data:
                    return
                await self._flowing.wait()  # read just before the blackhole: held too
                dst.write(data)
                await dst.drain()

    def blackhole(self) -> None:
        """Accept, never forward: every byte either way is held until ``heal``."""
        self.state = State.BLACKHOLE
        self._flowing.clear()

    async def cut(self) -> None:
        """Reset every relayed connection, and every new one until ``heal``."""
        self.state = State.CUT
        self._flowing.set()  # a blackholed relay must see its reset, not wait
        for w in list(self._writers):
            _reset(w)
        await self._drain_relays()

    async def heal(self) -> None:
        """Back to ``OPEN``: new connections are relayed, held bytes flow."""
        self.state = State.OPEN
        self._flowing.set()

    async def _drain_relays(self) -> None:
        """Cancel every pump; each handler then closes its two connections and ends."""
        for pump in list(self._pumps):
            pump.cancel()
        handlers = list(self._handlers)
        if handlers:
            await asyncio.wait(handlers, timeout=CLOSE_TIMEOUT)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._flowing.set()
        for w in list(self._writers):
            _reset(w)
        await self._drain_relays()

    async def __aenter__(self) -> CutProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0): the peer sees a reset, as from a dead host."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
