"""The drill's webhook receiver: an aiohttp endpoint that verifies and records deliveries.

Owns one HTTP server (``start`` binds ``host``, port 0 = a free one; ``stop`` closes
it). Every POST is parsed (the body pagesift sends: ``id``, ``seq``, ``event_id``,
``event``, ``data``), its ``pagesift-signature`` checked with
``pagesift.primary.webhooks.outbox.verify_signature`` when the account's secret is known,
recorded as a ``verdict.Delivery`` in arrival order, and answered 200 -- unless it is
not a pagesift delivery at all (400, not recorded). The receiver never deduplicates:
the drill counts what was sent, re-sends included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

from aiohttp import web

from pagesift.drill.verdict import Delivery
from pagesift.primary.webhooks.outbox import verify_signature

PATH = "/drill-hook"


class Receiver:
    def __init__(self, secret: str = "", host: str = "127.0.0.1") -> None:
        self.secret = secret
        self.host = host
        self.deliveries: list[Delivery] = []
        self._runner: web.AppRunner | None = None
        self._changed = asyncio.Event()

    async def start(self, port: int = 0) -> str:
        """Serve; returns the webhook URL."""
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_post(PATH, self._handle)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, port).start()
        bound = int(self._runner.addresses[0][1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{bound}{PATH}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            doc = json.loads(body)
            job, seq, event = str(doc["id"]), int(doc["seq"]), str(doc["event"])
            data = doc.get("data") or {}
            event_id = str(doc.get("event_id") or request.headers.get("pagesift-event-id", ""))
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="not a pagesift webhook delivery")
        signed: bool | None = None
        if self.secret:
            signed = verify_signature(
                self.secret,
                request.headers.get("pagesift-timestamp", ""),
                body,
                request.headers.get("pagesift-signature", ""),
            )
        self.deliveries.append(
            Delivery(
                event_id=event_id,
                job=job,
                seq=seq,
                event=event,
                data=dict(data),
                acked=True,  # answered 200 right below
                signed=signed,
            )
        )
        self._changed.set()
        return web.Response(status=200)

    def of(self, job: str) -> list[Delivery]:
        """The deliveries of ``job``, in arrival order."""
        return [d for d in self.deliveries if d.job == job]

    async def wait_for(self, done: Callable[[], bool], timeout: float) -> bool:
        """Until ``done()`` (checked after each delivery, and every 0.25 s) or
        ``timeout`` seconds; returns ``done()``."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return done()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.25))
        return True
