"""Webhooks: a durable outbox in a real store, delivered to real aiohttp receivers on
127.0.0.1 -- in order, signed, retried, resumed from the persisted cursor, and turned
into job notes when undeliverable."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from pagesift.core.api.metrics import Metrics
from pagesift.core.jobs import records, views
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.webhooks import delivery, outbox
from tests.helpers import free_port, until

SECRET = "acme-webhook-secret-0123456789"


def secret_for(account: str) -> str | None:
    return SECRET if account == "acme" else None


@dataclass
class Delivery:
    job: str
    seq: int
    event: str
    body: bytes
    headers: dict[str, str]
    doc: dict[str, object]


Behavior = Callable[[Delivery, int], Awaitable[int]]  # (delivery, nth time this seq) -> status


async def ok(d: Delivery, n: int) -> int:
    return 200


@dataclass
class Receiver:
    behavior: Behavior = ok
    got: list[Delivery] = field(default_factory=list)  # every request, in arrival order
    in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    max_in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        doc = json.loads(body)
        d = Delivery(
            str(doc["id"]), int(doc["seq"]), str(doc["event"]), body, dict(request.headers), doc
        )
        self.got.append(d)
        self.in_flight[d.job] += 1
        self.max_in_flight[d.job] = max(self.max_in_flight[d.job], self.in_flight[d.job])
        try:
            n = sum(1 for x in self.got if (x.job, x.seq) == (d.job, d.seq))
            status = await self.behavior(d, n)
        finally:
            self.in_flight[d.job] -= 1
        return web.Response(status=status)

    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        bound = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{bound}/hook"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def seqs(self, job: str) -> list[int]:
        return [d.seq for d in self.got if d.job == job]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        await r.stop()


def make_job(
    store: Store, job_id: str, url: str | None, events: tuple[str, ...] = (), account: str = "acme"
) -> None:
    """What the runtime's registration group does: meta, webhook config, `started`."""
    meta = records.JobMeta(
        id=job_id,
        kind="batch",
        state="scraping",
        owner=account,
        created_ms=0,
        expires_ms=2**62,
    )

    def group(g: WriteGroup) -> None:
        g.put(records.JobKeys(job_id).meta, meta.encode())
        g.insert(records.JOBS_SET, job_id.encode())
        if url is not None:
            outbox.configure(g, job_id, url, events, account)
        outbox.enqueue(g, job_id, "started", {"kind": "batch", "total": 3})

    store.write(group)


def record_page(store: Store, job_id: str, index: int, event: str = "page") -> int | None:
    """What the runtime's page group does: the page and its event, one group."""

    def group(g: WriteGroup) -> int | None:
        g.push(records.JobKeys(job_id).pages, f"doc {index}".encode())
        return outbox.enqueue(g, job_id, event, {"index": index, "url": f"https://x/{index}"})

    seq = store.write(group).result
    return seq


def finish(store: Store, job_id: str) -> None:
    store.write(lambda g: outbox.enqueue(g, job_id, "completed", {"state": "completed"}))


def deliverer(store_getter: Callable[[], Store], **kw: object) -> delivery.Deliverer:
    opts: dict[str, object] = {
        "secret_for": secret_for,
        "allow_private_networks": True,
        "base_delay": 0.01,
        "max_delay": 0.05,
        "timeout": 5.0,
    }
    opts.update(kw)
    return delivery.Deliverer(store_getter, None, **opts)  # type: ignore[arg-type]


def check_delivery(d: Delivery, now: float) -> None:
    assert d.headers["Content-Type"] == "application/json"
    assert d.headers["pagesift-event"] == d.event
    assert d.headers["pagesift-delivery"] == f"{d.job}:{d.seq}"
    ts = d.headers["pagesift-timestamp"]
    assert abs(int(ts) - now) < 60
    assert outbox.verify_signature(SECRET, ts, d.body, d.headers["pagesift-signature"])
    assert not outbox.verify_signature("wrong-secret", ts, d.body, d.headers["pagesift-signature"])
    assert set(d.doc) == {"id", "seq", "event_id", "event", "data", "created_at"}
    assert re.fullmatch(r"[0-9a-f]{32}", str(d.doc["event_id"]))
    assert d.headers["pagesift-event-id"] == d.doc["event_id"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(d.doc["created_at"]))


async def test_every_event_arrives_once_in_order_and_signed(
    store: Store, receiver: Receiver
) -> None:
    async def slow(d: Delivery, n: int) -> int:
        await asyncio.sleep(0.005)  # would expose two deliveries of one job at once
        return 200

    receiver.behavior = slow
    url = await receiver.start()
    metrics = Metrics()
    d = deliverer(lambda: store, metrics=metrics)
    make_job(store, "a", url)  # all events
    make_job(store, "b", url, events=("page", "completed"))  # no started, no page_failed
    make_job(store, "c", None)  # no webhook: nothing is enqueued
    record_page(store, "a", 0)  # enqueued before start: delivered by resume
    try:
        assert await d.start() == 1
        for i in range(1, 15):
            for job in ("a", "b", "c"):
                record_page(store, job, i)
                d.wake(job)
        for job in ("a", "b"):
            seq = record_page(store, job, 99, event="page_failed")
            assert (seq is None) == (job == "b")
            finish(store, job)
            d.wake(job)
        want = {"a": 1 + 15 + 1 + 1, "b": 14 + 1}
        await until(
            lambda: all(outbox.read_ack(store, j) == n for j, n in want.items()),
            "every job's events acked",
        )
        now = time.time()
        for job, n in want.items():
            assert receiver.seqs(job) == list(range(n)), job
            assert receiver.max_in_flight[job] == 1, "two deliveries of one job at once"
        a_events = [x.event for x in receiver.got if x.job == "a"]
        assert a_events == ["started", *["page"] * 15, "page_failed", "completed"]
        assert [x.event for x in receiver.got if x.job == "b"][-1] == "completed"
        assert [x.doc["data"] for x in receiver.got if x.job == "a"][1] == {
            "index": 0,
            "url": "https://x/0",
        }
        for x in receiver.got:
            check_delivery(x, now)
        assert receiver.seqs("c") == [] and store.list_len(records.JobKeys("c").outbox) == 0
        assert outbox.queue_depth(store) == 0
        for job, n in want.items():  # delivered events are dropped; seqs keep rising
            assert store.list_bounds(records.JobKeys(job).outbox) == (n, n), job
        assert metrics.webhook_deliveries.labels("ok")._value.get() == sum(want.values())
    finally:
        await d.close()


async def test_a_receiver_that_is_down_then_back_gets_everything(
    store: Store, receiver: Receiver
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    metrics = Metrics()
    d = deliverer(lambda: store, max_attempts=200, metrics=metrics)
    make_job(store, "j", url)
    for i in range(3):
        record_page(store, "j", i)
    try:
        await d.start()
        # nothing listens: connection refused, counted, retried
        errors = metrics.webhook_deliveries.labels("error")
        await until(lambda: errors._value.get() >= 2, "two refused attempts")
        assert outbox.read_ack(store, "j") == 0
        assert outbox.queue_depth(store) == 4

        async def flaky(d: Delivery, n: int) -> int:
            return 503 if (d.seq == 0 and n <= 2) else 200  # back, but not well at first

        receiver.behavior = flaky
        await receiver.start(port)
        await until(lambda: outbox.read_ack(store, "j") == 4, "events 0-3 acked")
        assert receiver.seqs("j") == [0, 0, 0, 1, 2, 3]
        assert metrics.webhook_deliveries.labels("error")._value.get() >= 3
        assert metrics.webhook_deliveries.labels("ok")._value.get() == 4
        assert views.read_errors(store, "j") == ([], [])  # nothing was given up
    finally:
        await d.close()


async def test_a_restart_mid_delivery_resends_nothing_acknowledged_and_loses_nothing(
    tmp_path: Path, receiver: Receiver
) -> None:
    release = asyncio.Event()

    async def hang_on_5(d: Delivery, n: int) -> int:
        if d.seq == 5 and not release.is_set():
            await asyncio.wait_for(release.wait(), 10)
        return 200

    receiver.behavior = hang_on_5
    url = await receiver.start()
    holder = {"store": Store(tmp_path / "store")}
    make_job(holder["store"], "j", url)
    for i in range(9):
        record_page(holder["store"], "j", i)  # seqs 0..9
    first = deliverer(lambda: holder["store"])
    await first.start()
    await until(lambda: 5 in receiver.seqs("j"), "event 5 posted")  # seq 5 is in flight, unanswered
    await first.close()  # "the process stops" mid-delivery
    ack_at_stop = outbox.read_ack(holder["store"], "j")
    assert ack_at_stop == 5
    holder["store"].close()
    release.set()

    holder["store"] = Store(tmp_path / "store")  # the restart
    try:
        for i in range(9, 12):
            record_page(holder["store"], "j", i)  # more events while nobody delivered
        second = deliverer(lambda: holder["store"])
        await second.start()  # resume() from the persisted cursor
        try:
            await until(lambda: outbox.read_ack(holder["store"], "j") == 13, "events 0-12 acked")
        finally:
            await second.close()
        seqs = receiver.seqs("j")
        for seq in range(ack_at_stop):
            assert seqs.count(seq) == 1, f"acknowledged event {seq} was sent again"
        assert set(seqs) == set(range(13)), "an event was lost"
        resent = {s for s in seqs if seqs.count(s) > 1}
        assert resent == {5}  # only the unacknowledged one in flight
        first_arrivals = list(dict.fromkeys(seqs))
        assert first_arrivals == list(range(13))
    finally:
        holder["store"].close()


async def test_an_undeliverable_event_becomes_a_job_note_and_the_cursor_moves_on(
    store: Store, receiver: Receiver
) -> None:
    async def refuse_0(d: Delivery, n: int) -> int:
        return 500 if d.seq == 0 else 204

    receiver.behavior = refuse_0
    url = await receiver.start()
    metrics = Metrics()
    d = deliverer(lambda: store, max_attempts=3, metrics=metrics)
    make_job(store, "j", url)
    record_page(store, "j", 0)
    finish(store, "j")
    try:
        await d.start()
        await until(lambda: outbox.read_ack(store, "j") == 3, "events 0-2 acked")
    finally:
        await d.close()
    assert receiver.seqs("j") == [0, 0, 0, 1, 2]
    errors, robots = views.read_errors(store, "j")
    assert robots == []
    [note] = errors
    assert note.url == "" and note.code == outbox.NOTE_CODE
    assert "webhook event 0 (started)" in note.message and "HTTP 500" in note.message
    assert "3 attempt" in note.message
    assert metrics.webhook_deliveries.labels("undeliverable")._value.get() == 1
    assert metrics.webhook_deliveries.labels("error")._value.get() == 3


async def test_the_address_guard_refuses_loopback_unless_allowed(
    store: Store, receiver: Receiver
) -> None:
    url = await receiver.start()
    assert await outbox.check_url(url, allow_private_networks=False) is not None
    assert await outbox.check_url(url, allow_private_networks=True) is None
    assert await outbox.check_url("ftp://x/", allow_private_networks=True) is not None
    metrics = Metrics()
    d = deliverer(lambda: store, allow_private_networks=False, metrics=metrics)
    make_job(store, "j", url)
    for i in range(3):
        record_page(store, "j", i)
    make_job(store, "k", url.replace("127.0.0.1", "localhost"))
    try:
        await d.start()
        await until(
            lambda: (outbox.read_ack(store, "j"), outbox.read_ack(store, "k")) == (4, 1),
            "both jobs given up",
        )
    finally:
        await d.close()
    assert receiver.got == []
    for job, word, what in (
        ("j", "loopback", "webhook events 0-3 (from started)"),
        ("k", "localhost", "webhook event 0 (started)"),
    ):
        [note] = views.read_errors(store, job)[0]  # one note, however many events
        assert note.code == outbox.NOTE_CODE and word in note.message
        assert "address guard" in note.message and what in note.message
    assert metrics.webhook_deliveries.labels("blocked")._value.get() == 2
    assert metrics.webhook_deliveries.labels("undeliverable")._value.get() == 5


async def test_an_account_without_a_secret_gets_notes_not_unsigned_posts(
    store: Store, receiver: Receiver
) -> None:
    url = await receiver.start()
    d = deliverer(lambda: store)
    make_job(store, "j", url, account="beta")  # secret_for("beta") is None
    record_page(store, "j", 0)
    try:
        await d.start()
        await until(lambda: outbox.read_ack(store, "j") == 2, "events 0-1 given up")
    finally:
        await d.close()
    assert receiver.got == []
    [note] = views.read_errors(store, "j")[0]
    assert "webhook_secret" in note.message and "events 0-1" in note.message


async def test_a_job_expiring_during_delivery_leaves_no_stray_key(
    store: Store, receiver: Receiver
) -> None:
    async def expire_then_ok(d: Delivery, n: int) -> int:
        def group(g: WriteGroup) -> None:  # the runtime's expiry group
            records.delete_job(g, "j", None)

        store.write(group)
        return 200

    receiver.behavior = expire_then_ok
    url = await receiver.start()
    metrics = Metrics()
    d = deliverer(lambda: store, metrics=metrics)
    make_job(store, "j", url)
    try:
        await d.start()
        # counted "ok" in the same step as the cursor write it decided on (no await between)
        ok = metrics.webhook_deliveries.labels("ok")
        await until(lambda: ok._value.get() == 1, "the 200 to be handled")
    finally:
        await d.close()
    assert list(store.replicated_items()) == []  # not even webhook_ack came back


def test_enqueue_is_part_of_the_group_and_filters_events(store: Store) -> None:
    make_job(store, "j", "https://example.com/hook", events=("completed",))
    assert store.list_len(records.JobKeys("j").outbox) == 0  # started not wanted
    assert record_page(store, "j", 0) is None

    def failing(g: WriteGroup) -> None:
        outbox.enqueue(g, "j", "completed", {})
        raise RuntimeError("the change failed")

    with pytest.raises(RuntimeError):
        store.write(failing)
    assert store.list_len(records.JobKeys("j").outbox) == 0  # no change, no event
    finish(store, "j")
    assert store.list_len(records.JobKeys("j").outbox) == 1
    with pytest.raises(ValueError, match="unknown webhook event"):
        store.write(lambda g: outbox.enqueue(g, "j", "exploded", {}))
    cfg = outbox.load_config(store, "j")
    assert cfg == outbox.WebhookConfig("https://example.com/hook", ("completed",), "acme")
    assert records.webhook_events([]) == records.WEBHOOK_EVENTS
    assert records.webhook_events(["completed", "started"]) == ("started", "completed")
    with pytest.raises(ValueError, match=r"webhook.events\[1\]"):
        records.webhook_events(["page", "nope"])


def test_verify_signature() -> None:
    body = b'{"id":"j","seq":0}'
    now = 1_700_000_000
    header = outbox.sign(SECRET, now, body)
    assert header.startswith("v1=") and len(header) == 3 + 64
    assert outbox.verify_signature(SECRET, str(now), body, header, now=now)
    assert outbox.verify_signature(SECRET, now, body, f"v1=00, {header}", now=now + 299)
    assert not outbox.verify_signature(SECRET, now, body + b" ", header, now=now)
    assert not outbox.verify_signature("other-secret", now, body, header, now=now)
    assert not outbox.verify_signature(SECRET, now, body, header, now=now + 301)  # replay
    assert not outbox.verify_signature(SECRET, now, body, header, now=now - 301)
    assert not outbox.verify_signature(SECRET, "12a", body, header, now=now)
    assert not outbox.verify_signature(SECRET, now, body, "garbage", now=now)
    assert not outbox.verify_signature(SECRET, now + 1, body, header, now=now)
