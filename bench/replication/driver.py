"""The primary *driver* process of the replication bench, and its control protocol.

A driver is an in-process primary: ``open_slot`` + ``Log.open_for_writes`` + the real
``ReplicationServicer`` and ``AdminServicer``, wired and served as ``pagesift serve`` does
(``pagesift.node``: ``ReplicationParts``, ``grpcserver.grpc_server``), plus one extra
method, ``DRIVER_METHOD``: JSON commands over a generic unary call (``status``, ``burst``,
``fill``, ``scan``, ``paced_start``, ``paced_stop``) that make it write page groups
through the real write path (``slot.log.write`` on its event loop, as the job runtime
does). The section starts it as ``python -m bench.replication primary
ADDR DATA [BACKLOG_MB]`` (``procs.start_driver``; ``__main__`` calls ``serve``) and talks to
it with ``procs.Node.control``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import grpc

from bench.common import MB
from bench.replication.stats import dist
from bench.replication.workload import PageGen

DRIVER_METHOD = "/bench.Driver/Call"


class Driver:
    """The primary side for parts 2, 5 and 6: the real store/log/replication code, with a
    control method (JSON over a generic unary gRPC call) to drive its writer."""

    def __init__(self, data: Path, backlog_bytes: int) -> None:
        from pagesift.core.jobs.events import JobEvents
        from pagesift.core.replication.slot import open_slot
        from pagesift.node.replicationparts import ReplicationParts

        self.slot = open_slot(data, backlog_bytes=backlog_bytes)
        self.events = JobEvents()  # the server's store observer (watch wake-ups), as in Node
        self.slot.store.add_observer(self.events)
        self.slot.log.open_for_writes()
        self.parts = ReplicationParts(self.slot, node_id="bench-primary")  # as a Node wires it
        self.repl = self.parts.sender
        self.gen = PageGen()
        self.n = 0  # pages written so far
        self.data_bytes = 0
        self.job = "job/11111111-2222-3333-4444-555555555555"
        self.hellos: list[tuple[float, str]] = []
        self._paced: asyncio.Task[dict[str, Any]] | None = None
        self._paced_stop = asyncio.Event()

    def write_one(self) -> int:
        from pagesift.core.store.groups import WriteGroup

        doc, key, links = self.gen.page(self.n)
        key += str(self.n).encode()
        job = self.job

        def group(g: WriteGroup) -> int:
            g.push(f"{job}/pages", doc)
            g.insert(f"{job}/done", key)
            for link, entry in links:
                if g.insert(f"{job}/seen", link + str(self.n).encode()):
                    g.push(f"{job}/frontier", entry)
            return len(g.ops)

        ops = self.slot.log.write(group).result
        self.data_bytes += len(doc) + len(key) + sum(len(a) + len(b) + 8 for a, b in links)
        self.n += 1
        return ops

    async def burst(self, seconds: float, max_groups: int = 10_000_000) -> dict[str, Any]:
        ops = groups = 0
        b0 = self.data_bytes
        first = self.slot.log.last_offset + 1
        t0 = time.monotonic()
        while groups < max_groups and time.monotonic() - t0 < seconds:
            ops += self.write_one()
            groups += 1
            await asyncio.sleep(0)  # let the stream, acks and Role run, as the job runtime does
        t1 = time.monotonic()
        return {
            "groups": groups,
            "ops": ops,
            "data_mb": (self.data_bytes - b0) / MB,
            "t0": t0,
            "t1": t1,
            "seconds": t1 - t0,
            "first_offset": first,
            "last_offset": self.slot.log.last_offset,
        }

    async def fill(self, mb: float, max_s: float) -> dict[str, Any]:
        t0 = time.monotonic()
        out = await self.burst(0.0, 0)
        target = mb * MB
        groups = 0
        while self.data_bytes < target and time.monotonic() - t0 < max_s:
            self.write_one()
            groups += 1
            if groups % 16 == 0:
                await asyncio.sleep(0)
        out.pop("ops", None)
        out.update(
            groups=groups,
            seconds=time.monotonic() - t0,
            data_mb=self.data_bytes / MB,
            last_offset=self.slot.log.last_offset,
        )
        return out

    async def _paced_run(self, rate: float, max_s: float) -> dict[str, Any]:
        period = 1.0 / rate
        call_ms: list[float] = []
        tick_ms: list[float] = []
        t0 = time.monotonic()
        i = 0
        while not self._paced_stop.is_set() and time.monotonic() - t0 < max_s:
            tick = t0 + i * period
            delay = tick - time.monotonic()
            await asyncio.sleep(max(0.0, delay))
            a = time.monotonic()
            self.write_one()
            b = time.monotonic()
            call_ms.append((b - a) * 1000)
            tick_ms.append((b - tick) * 1000)  # includes waiting for a busy event loop
            i += 1
        return {
            "groups": i,
            "seconds": time.monotonic() - t0,
            "rate": rate,
            "write_call_ms": dist(call_ms),
            "tick_to_commit_ms": dist(tick_ms),
        }

    def status(self) -> dict[str, Any]:
        log = self.slot.log
        return {
            "offset": log.last_offset,
            "first_offset": log.first_offset,
            "backlog_mb": log.backlog_bytes / MB,
            "data_mb": self.data_bytes / MB,
            "full_resyncs": self.repl.full_resyncs,
            "continues": self.repl.continues,
            "hellos": self.hellos,
            "now": time.monotonic(),
        }

    def scan(self) -> dict[str, Any]:
        t0 = time.monotonic()
        keys = nbytes = 0
        for k, v in self.slot.store.replicated_items():
            keys += 1
            nbytes += len(k) + len(v)
        return {"keys": keys, "mb": nbytes / MB, "seconds": time.monotonic() - t0}

    async def handle(self, raw: bytes, context: Any) -> bytes:
        """The control method: one JSON command in, one JSON object out."""
        req = json.loads(raw)
        cmd = req["cmd"]
        out: dict[str, Any]
        if cmd == "status":
            out = self.status()
        elif cmd == "burst":
            out = await self.burst(float(req["seconds"]), int(req.get("max_groups", 10**7)))
        elif cmd == "fill":
            out = await self.fill(float(req["mb"]), float(req.get("max_s", 300)))
        elif cmd == "scan":
            out = await asyncio.to_thread(self.scan)
        elif cmd == "paced_start":
            self._paced_stop.clear()
            self._paced = asyncio.create_task(
                self._paced_run(float(req["rate"]), float(req.get("max_s", 300)))
            )
            out = {"started": True}
        elif cmd == "paced_stop":
            self._paced_stop.set()
            out = await self._paced if self._paced is not None else {}
            self._paced = None
        else:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown command {cmd!r}")
        return json.dumps(out).encode()


class _HelloLog(logging.Handler):
    """Records when the primary decided a session (its 'standby X (peer): decision' line)."""

    def __init__(self, driver: Driver) -> None:
        super().__init__(logging.INFO)
        self.driver = driver

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("standby "):
            self.driver.hellos.append((time.monotonic(), record.getMessage()))


async def serve(listen: str, data: Path, backlog_mb: int) -> None:
    """The driver process: serve replication, admin and the control method until SIGTERM."""
    from pagesift.node.grpcserver import grpc_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    driver = Driver(data, backlog_mb * MB)
    driver.events.bind(asyncio.get_running_loop())
    logging.getLogger("pagesift.primary.replication").addHandler(_HelloLog(driver))
    # the server's own assembly (replication + admin, its message limits), no JobService
    server = grpc_server(driver.parts)
    control = grpc.method_handlers_generic_handler(
        "bench.Driver", {"Call": grpc.unary_unary_rpc_method_handler(driver.handle)}
    )
    server.add_generic_rpc_handlers((control,))
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"cannot listen on {listen}")
    await server.start()
    logging.info("bench primary driver serving on %s (data %s)", listen, data)
    stop_ev = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_ev.set)
    await stop_ev.wait()
    driver._paced_stop.set()
    await server.stop(grace=2.0)
    driver.slot.close()
