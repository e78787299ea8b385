"""Webhook delivery across a SIGKILL and across a failover, with real processes.

``pagesift serve`` children (an accounts file with a webhook secret, short webhook
backoff, a metrics endpoint) crawl a demo site and POST every event of the crawl to an
aiohttp receiver in this test process. The receiver holds one chosen event unanswered,
so the primary is killed with that event in flight, at a known instant: every event
before it was acknowledged and its ack cursor written (the Deliverer writes the cursor
before it reads the next event), so the only event that may be sent twice is the held
one. The restart test then kills once more at an arbitrary instant: at most the one
event that kill interrupted (the last one the receiver saw) is sent again. The failover
test waits for the standby to apply the held event's cursor before the kill, so the
promoted standby resumes from exactly the held event. Every child is terminated (then
killed) in a ``finally``; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest

from pagesift.demo.site import Site
from pagesift.primary.webhooks import outbox
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from pagesift.v1 import replication_pb2 as rpb
from tests.helpers import (
    ADMIN_MD,
    ALICE,
    PAIR_TOKEN_FILE,
    QUICK_RETRIES,
    Hit,
    NodeFactory,
    Receiver,
    ServeProc,
    SiteSpec,
    admin,
    check_event_stream,
    crawl,
    documents,
    eventually,
    free_port,
    metric,
    role,
    scrape_metrics,
    until,
    wait_done,
    write_accounts,
)

pytestmark = pytest.mark.system

MiB = 1024 * 1024
HOLD = 12  # the event the receiver leaves unanswered until the primary is killed
PACE = 0.01  # the receiver answers each event after this long: delivery outlasts a kill


def settings(accounts: Path) -> dict[str, Any]:
    """A node's whole ``[server]`` table (``base={}``), with its own metrics endpoint."""
    return {
        **QUICK_RETRIES,  # the slow and the failing page: one quick retry each
        "read_timeout": 1.0,
        "connect_timeout": 1.0,
        "max_body_bytes": MiB,
        "extract_processes": 0,
        "accounts_file": str(accounts),  # both nodes: same keys, same webhook secrets
        "webhook_base_delay": 0.05,
        "webhook_max_delay": 0.2,
        "webhook_max_attempts": 200,
        "metrics_listen": f"127.0.0.1:{free_port()}",
        "replication_token_file": str(PAIR_TOKEN_FILE),
        # two kills of one crawl are this test's, not the job's: no quarantine
        "poison_threshold": 100,
    }


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=80, slow_seconds=1.2, big_bytes=2 * MiB)


class Held:
    """Receiver behaviour: answer every event after PACE, but hold ``seq`` unanswered
    (the first time it comes) until ``release``."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, hit: Hit) -> int:
        if hit.seq == self.seq and not self.arrived.is_set():
            self.arrived.set()
            await asyncio.wait_for(self.release.wait(), 60)
            return 200  # too late: the sender is dead by now
        await asyncio.sleep(PACE)
        return 200


async def start_hooked_crawl(address: str, root: str, url: str) -> str:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        req = crawl(root, max_concurrency=4, webhook=jobs_pb2.Webhook(url=url))
        return (await stub.StartCrawl(req, metadata=ALICE.md, timeout=10)).id


async def drained(node: ServeProc, job_id: str, timeout: float = 40) -> tuple[int, list[str]]:
    """Wait for the job to finish and the node's webhook queue to be empty (its metrics
    endpoint); returns the number of events and the job's document URLs."""
    async with grpc.aio.insecure_channel(node.address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        final = await wait_done(stub, job_id, ALICE.md, timeout=timeout)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note

        async def empty() -> bool | None:
            metrics = await scrape_metrics(node.settings["metrics_listen"])
            depth = metric(metrics, "pagesift_webhook_queue_depth")
            return True if depth == 0 else None

        await eventually(empty, f"{node.name}'s webhook queue to drain", timeout)
        docs = await documents(stub, job_id, ALICE.md)
        errs = await stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job_id), metadata=ALICE.md)
    assert not [e for e in errs.errors if e.code == outbox.NOTE_CODE], "an event given up"
    assert final.completed == len(docs)
    return 2 + final.completed + final.failed, [d.url for d in docs]


def check_deliveries(hits: list[Hit], n: int, urls: list[str]) -> Counter[int]:
    """Every seq 0..n-1 arrived (first arrivals in order, signed, started first,
    completed last); a re-sent event is byte-for-byte the same event; page events
    name the document at their index. Returns how often each seq arrived."""
    firsts: dict[int, Hit] = {}
    for x in hits:
        firsts.setdefault(x.seq, x)  # in arrival order
    first = list(firsts.values())
    check_event_stream(first, n)
    assert all(x.signed and x.headers_ok for x in hits)
    for x in hits:
        assert json.loads(x.body) == json.loads(firsts[x.seq].body), f"seq {x.seq} changed"
    pages = [x for x in first if x.event == "page"]
    assert [x.data["index"] for x in pages] == list(range(len(urls)))
    assert [x.data["url"] for x in pages] == urls
    return Counter(x.seq for x in hits)


async def test_a_primary_sigkilled_mid_delivery_resends_only_the_event_in_flight(
    tmp_path: Path, site: tuple[Site, str], nodes: NodeFactory
) -> None:
    root = site[1]
    accounts = write_accounts(tmp_path / "accounts.toml")
    held = Held(HOLD)
    receiver = Receiver(ALICE.secret, held)
    url = await receiver.start()
    try:
        primary = nodes("primary", config=settings(accounts), base={})
        await primary.start()
        job = await start_hooked_crawl(primary.address, root, url)

        # kill 1: at a known instant, event HOLD posted and unanswered
        await asyncio.wait_for(held.arrived.wait(), 30)
        primary.kill()
        held.release.set()
        before = [x.seq for x in receiver.of(job)]
        assert before == list(range(HOLD + 1))
        await primary.start()

        # kill 2: at an arbitrary instant of the delivery (an event may be in flight, or
        # acknowledged with its cursor not yet written: either way that one event only)
        await until(lambda: len(receiver.of(job)) >= HOLD + 20, "more deliveries", 30)
        primary.kill()
        await asyncio.sleep(0.2)  # let the receiver read what the dead primary had sent
        last_before_2 = max(x.seq for x in receiver.of(job))
        await primary.start()

        n, urls = await drained(primary, job)
        seen = check_deliveries(receiver.of(job), n, urls)
        again = {seq: k - 1 for seq, k in seen.items() if k > 1}
        # the held event was never acknowledged: it is sent again, once; every event
        # acknowledged before it (cursor persisted before the next was read) never is
        assert again.get(HOLD) == 1
        assert {seq: seen[seq] for seq in range(HOLD)} == dict.fromkeys(range(HOLD), 1)
        # the second kill re-sends at most the one event it interrupted
        assert set(again) <= {HOLD, last_before_2}, (again, last_before_2)
        assert sum(again.values()) <= 2
        between = range(HOLD + 1, last_before_2)
        assert {seq: seen[seq] for seq in between} == dict.fromkeys(between, 1)
    finally:
        held.release.set()
        await receiver.stop()


async def test_a_failover_resumes_delivery_from_the_replicated_cursor(
    tmp_path: Path, site: tuple[Site, str], nodes: NodeFactory
) -> None:
    root = site[1]
    accounts = write_accounts(tmp_path / "accounts.toml")
    held = Held(HOLD)
    receiver = Receiver(ALICE.secret, held)
    url = await receiver.start()
    try:
        primary = nodes("primary", config=settings(accounts), base={})
        standby = nodes(
            "standby", config=settings(accounts), base={}, role="standby", primary=primary.address
        )
        await asyncio.gather(primary.start(), standby.start())

        async def connected() -> bool | None:
            return True if (await role(standby.address, ADMIN_MD)).connected else None

        await eventually(connected, "the standby to connect", 20)
        job = await start_hooked_crawl(primary.address, root, url)
        await asyncio.wait_for(held.arrived.wait(), 30)
        # Event HOLD is in flight, so the cursor write for HOLD-1 is committed on the
        # primary already (it precedes reading HOLD) and no later cursor write can happen
        # while HOLD is held. Wait until the standby applied everything the primary had
        # committed by now: then the standby's cursor is exactly HOLD, and the tight bound
        # after the failover is "HOLD is sent again, once; nothing else is".
        at = (await role(primary.address, ADMIN_MD)).applied_offset

        async def replicated() -> bool | None:
            return True if (await role(standby.address, ADMIN_MD)).applied_offset >= at else None

        await eventually(replicated, "the standby to apply the cursor", 20)
        primary.kill()
        held.release.set()
        assert [x.seq for x in receiver.of(job)] == list(range(HOLD + 1))
        async with grpc.aio.insecure_channel(standby.address) as ch:
            promoted = await admin(ch).Promote(rpb.PromoteRequest(), metadata=ADMIN_MD, timeout=10)
        assert not promoted.already_primary

        n, urls = await drained(standby, job)
        seen = check_deliveries(receiver.of(job), n, urls)
        again = {seq: k - 1 for seq, k in seen.items() if k > 1}
        assert again == {HOLD: 1}, again
    finally:
        held.release.set()
        await receiver.stop()
