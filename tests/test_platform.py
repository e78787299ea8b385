"""Platform features end to end: accounts and their limits, owner isolation, signed
webhooks, the metrics endpoint, TLS on the public port, mTLS- and token-guarded
replication, and the admin key.

Real gRPC servers (``grpcserver.run`` in the test's event loop), real RocksDB, a real demo
site and real aiohttp webhook receivers, all on 127.0.0.1. The cases that need real
processes killed with SIGKILL (webhook delivery across a restart and a failover) are in
``test_platform_failover.py``; the helpers both use are in ``helpers.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pagesift.client import JobClient
from pagesift.core.api import tls
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import records
from pagesift.core.replication.verify import verify_digests
from pagesift.demo.site import Site
from pagesift.node import grpcserver
from pagesift.node.node import Node
from pagesift.primary.webhooks import outbox
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2_grpc
from pagesift.v1 import replication_pb2 as rpb
from tests import helpers
from tests.helpers import (
    ADMIN_MD,
    ALICE,
    BOB,
    DAILY,
    NOSECRET,
    SMALL,
    SOLO,
    Hit,
    Receiver,
    Samples,
    admin,
    check_event_stream,
    crawl,
    documents,
    eventually,
    free_port,
    make_ca,
    make_leaf,
    metric,
    metric_names,
    role,
    scrape_metrics,
    until,
    wait_done,
    write_accounts,
)

MiB = 1024 * 1024

# ---------------------------------------------------------------- nodes and waits

FAST: dict[str, Any] = {"extract_processes": 0}  # inline extraction: no worker pool to start


@contextlib.asynccontextmanager
async def serving(config: ServerConfig) -> AsyncIterator[Node]:
    """A real node (``grpcserver.run``) in this event loop; no client channel (TLS or not)."""
    stop = asyncio.Event()
    started: asyncio.Future[Node] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(grpcserver.run(config, stop, started))
    try:
        either: set[asyncio.Future[Any]] = {task, started}
        await asyncio.wait(either, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # run() failed before serving: raise its error
        assert started.done(), "the node did not start in 15 s"
        yield started.result()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def node_config(data: Path, **overrides: Any) -> ServerConfig:
    return helpers.node_config(data, **{**FAST, **overrides})


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    """The error of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def trailing(err: grpc.aio.AioRpcError) -> dict[str, str]:
    """The pagesift trailing metadata of an error (the rich status details, checked
    in tests/test_error_details.py, left out)."""
    # grpc.aio gives (key, value) pairs; grpc-stubs types them as the sync _Metadatum
    pairs = cast(Iterable[tuple[str, str | bytes]], err.trailing_metadata() or ())
    return {str(k): str(v) for k, v in pairs if k != "grpc-status-details-bin"}


def article_urls(site: Site, root: str, n: int) -> list[str]:
    paths = sorted(p for p in site.manifest.pages if p.endswith(".html") and p.count("/") == 2)
    return [root.rstrip("/") + p for p in paths[:n]]


# ---------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate signed by a CA the primary does not trust
    rogue_key: Path
    other_ca: Path  # that CA


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1, client certificates (openssl CLI)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    d = tmp_path_factory.mktemp("certs")
    make_ca(d, "ca")
    make_ca(d, "other")
    server_ext = (
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
    make_leaf(d, "server", "localhost", server_ext)
    make_leaf(d, "client", "standby-1", client_ext)
    make_leaf(d, "rogue", "rogue", client_ext, ca="other")
    return Certs(
        d / "ca.pem",
        d / "server.pem",
        d / "server.key",
        d / "client.pem",
        d / "client.key",
        d / "rogue.pem",
        d / "rogue.key",
        d / "other.pem",
    )


# ---------------------------------------------------------------- replication helpers


async def caught_up(
    primary: replication_pb2_grpc.AdminServiceAsyncStub, standby_address: str, timeout: float
) -> int:
    """Wait until the standby is connected and stands at the primary's offset (> 0)."""

    async def check() -> int | None:
        p = await primary.Role(rpb.RoleRequest(), timeout=5)
        s = await role(standby_address)
        same = s.applied_offset == p.applied_offset and s.history_id == p.history_id
        return p.applied_offset if s.connected and same and p.applied_offset > 0 else None

    return await eventually(check, f"the standby {standby_address} to catch up", timeout)


async def stays_refused(standbys: Iterable[Node], want: str) -> None:
    """Each refused standby tries again and again, is never connected, never applies
    anything, and its follower reports ``want`` as the reason (of some session: under
    load gRPC may report a refused stream as "INTERNAL: Internal error from Core" when
    the hello is written after the primary's refusal, see the report)."""
    nodes = list(standbys)
    errors: dict[str, set[str]] = {n.config.listen: set() for n in nodes}

    def refused_for_the_reason() -> bool:
        for n in nodes:
            assert n.follower is not None
            st = n.follower.status()
            assert not st.connected and st.applied_offset == 0, n.config.listen
            if st.last_error:
                errors[n.config.listen].add(st.last_error)
        return all(
            n.follower is not None
            and n.follower.sessions >= 2
            and any(want in e for e in errors[n.config.listen])
            for n in nodes
        )

    await until(refused_for_the_reason, f"the refused standbys to report {want!r}", 15)
    for n in nodes:
        assert n.slot.log.last_offset == 0 and n.slot.log.history_id == ""
        r = await role(n.config.listen)
        assert (r.connected, r.applied_offset, r.history_id) == (False, 0, "")


# ================================================================= limits


async def test_max_concurrent_jobs_refuses_a_second_job_until_the_first_is_cancelled_or_done(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        serving(node_config(tmp_path / "n", accounts_file=str(accounts))) as node,
        grpc.aio.insecure_channel(node.config.listen) as ch,
    ):
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        md = SOLO.md
        # a paced crawl that runs for seconds: the account's one running job
        slow = await stub.StartCrawl(crawl(root, delay=0.3, max_concurrency=1), metadata=md)
        batch = jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 2))
        for call in (
            stub.StartBatchScrape(batch, metadata=md),
            stub.StartCrawl(crawl(root), metadata=md),
        ):
            err = await refused(call)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_concurrent_jobs" in (err.details() or "")
            assert "1" in (err.details() or "")
            assert trailing(err)["pagesift-limit"] == "max_concurrent_jobs"
            assert "pagesift-limit-resets-at" not in trailing(err)  # frees on finish
        # another account is not limited by this one's jobs
        other = await stub.StartBatchScrape(batch, metadata=ALICE.md)
        await wait_done(stub, other.id, ALICE.md)
        # cancelling the running job frees the slot
        cancelled = await stub.CancelJob(jobs_pb2.CancelJobRequest(id=slow.id), metadata=md)
        assert cancelled.state == jobs_pb2.JOB_STATE_CANCELLED
        second = await stub.StartBatchScrape(batch, metadata=md)
        # ... and so does a job finishing
        done = await wait_done(stub, second.id, md)
        assert done.state == jobs_pb2.JOB_STATE_COMPLETED
        third = await stub.StartBatchScrape(batch, metadata=md)
        assert third.id not in (slow.id, second.id)
        await wait_done(stub, third.id, md)
        rejections = node.metrics.limit_rejections.labels("max_concurrent_jobs")._value.get()
        assert rejections == 2


async def test_pages_per_day_stops_a_job_mid_crawl_keeping_its_pages_then_refuses_starts(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    limit = DAILY.limits["pages_per_day"]
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        serving(node_config(tmp_path / "n", accounts_file=str(accounts))) as node,
        grpc.aio.insecure_channel(node.config.listen) as ch,
    ):
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        md = DAILY.md
        job = await stub.StartCrawl(crawl(root, max_concurrency=4), metadata=md)
        final = await wait_done(stub, job.id, md)
        # the quota ran out mid-crawl: the job failed, keeping exactly `limit` pages
        assert final.state == jobs_pb2.JOB_STATE_FAILED
        assert "pages_per_day" in final.note
        assert final.completed == limit
        docs = await documents(stub, job.id, md)
        assert len(docs) == limit
        assert len({d.url for d in docs}) == limit, "a page recorded twice"
        assert len(s.expected_documents(root)) > limit  # the crawl had more to do
        errors = await stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job.id), metadata=md)
        notes = [e for e in errors.errors if not e.url]
        assert len(notes) == 1, notes
        assert notes[0].code == "failed"
        assert "pages_per_day" in notes[0].message
        assert "pages so far are kept" in notes[0].message
        # now every start is refused, naming the limit and when it resets
        now = time.time()
        for call in (
            stub.StartCrawl(crawl(root), metadata=md),
            stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 1)), metadata=md
            ),
            stub.Scrape(jobs_pb2.ScrapeRequest(url=root), metadata=md),
        ):
            err = await refused(call)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = err.details() or ""
            md_out = trailing(err)
            assert md_out["pagesift-limit"] == "pages_per_day"
            resets = md_out["pagesift-limit-resets-at"]
            assert "pages_per_day" in details and f"resets at {resets}" in details
            assert f"used {limit} of" in details
            when = datetime.strptime(resets, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            # every page was charged this hour: usage drops when this hour leaves the
            # rolling 24 h window, i.e. 23 to 24 hours from now
            assert 23 * 3600 - 60 <= when.timestamp() - now <= 24 * 3600 + 5
        # the usage is the account's own: another account still starts jobs
        ok = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 1)), metadata=ALICE.md
        )
        await wait_done(stub, ok.id, ALICE.md)
        assert node.metrics.limit_rejections.labels("pages_per_day")._value.get() == 1 + 3


async def test_max_batch_urls_and_max_crawl_limit_refuse_oversized_requests_only(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        serving(node_config(tmp_path / "n", accounts_file=str(accounts))) as node,
        grpc.aio.insecure_channel(node.config.listen) as ch,
    ):
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        md = SMALL.md
        four = jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 4))
        err = await refused(stub.StartBatchScrape(four, metadata=md))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_batch_urls" in (err.details() or "") and "3" in (err.details() or "")
        assert trailing(err) == {"pagesift-limit": "max_batch_urls"}
        three = jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 3))
        batch = await stub.StartBatchScrape(three, metadata=md)

        err = await refused(stub.StartCrawl(crawl(root, limit=6), metadata=md))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_crawl_limit" in (err.details() or "") and "5" in (err.details() or "")
        assert trailing(err) == {"pagesift-limit": "max_crawl_limit"}
        at_limit = await stub.StartCrawl(crawl(root, limit=5), metadata=md)
        # no limit asked: the server default, capped at the account's limit
        unlimited = await stub.StartCrawl(crawl(root), metadata=md)
        # another account is not bound by these limits
        big = await stub.StartCrawl(crawl(root, limit=6), metadata=ALICE.md)
        for job_id, key, most in (
            (batch.id, md, 3),
            (at_limit.id, md, 5),
            (unlimited.id, md, 5),
            (big.id, ALICE.md, 6),
        ):
            final = await wait_done(stub, job_id, key)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED
            assert final.completed + final.failed == most
        assert node.metrics.limit_rejections.labels("max_batch_urls")._value.get() == 1
        assert node.metrics.limit_rejections.labels("max_crawl_limit")._value.get() == 1


# ================================================================= owners


async def test_another_account_cannot_see_or_touch_a_job_and_keyless_calls_are_refused(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    root = site[1]
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        serving(node_config(tmp_path / "n", accounts_file=str(accounts))) as node,
        grpc.aio.insecure_channel(node.config.listen) as ch,
    ):
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        job = await stub.StartCrawl(crawl(root, delay=0.2, max_concurrency=1), metadata=ALICE.md)
        nobody = "00000000-0000-4000-8000-000000000000"

        async def not_found(job_id: str) -> list[str]:
            details: list[str] = []
            for call in (
                stub.GetJob(jobs_pb2.GetJobRequest(id=job_id), metadata=BOB.md),
                stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job_id), metadata=BOB.md),
                stub.CancelJob(jobs_pb2.CancelJobRequest(id=job_id), metadata=BOB.md),
            ):
                err = await refused(call)
                assert err.code() == grpc.StatusCode.NOT_FOUND
                details.append((err.details() or "").replace(job_id, "ID"))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.WatchJob(jobs_pb2.WatchJobRequest(id=job_id), metadata=BOB.md):
                    pass
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            details.append((info.value.details() or "").replace(job_id, "ID"))
            return details

        # B gets exactly what it gets for an id that does not exist: no oracle
        assert await not_found(job.id) == await not_found(nobody)
        assert job.id not in [
            j.id for j in (await stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=BOB.md)).jobs
        ]
        mine = await stub.ListJobs(jobs_pb2.ListJobsRequest(active_only=True), metadata=ALICE.md)
        assert [j.id for j in mine.jobs] == [job.id]
        # B's cancel did nothing: the job still runs for A
        still = await stub.GetJob(jobs_pb2.GetJobRequest(id=job.id), metadata=ALICE.md)
        assert still.state == jobs_pb2.JOB_STATE_SCRAPING
        # no key, an unknown key, a malformed header: UNAUTHENTICATED, for reads too
        for md in [
            (),
            (("authorization", "Bearer psk_nobody_0123456789"),),
            (("authorization", ALICE.key),),
        ]:
            for call in (
                stub.GetJob(jobs_pb2.GetJobRequest(id=job.id), metadata=md),
                stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=md),
                stub.CancelJob(jobs_pb2.CancelJobRequest(id=job.id), metadata=md),
                stub.StartCrawl(crawl(root), metadata=md),
                stub.Scrape(jobs_pb2.ScrapeRequest(url=root), metadata=md),
            ):
                err = await refused(call)
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.WatchJob(jobs_pb2.WatchJobRequest(id=job.id)):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        cancelled = await stub.CancelJob(jobs_pb2.CancelJobRequest(id=job.id), metadata=ALICE.md)
        assert cancelled.state == jobs_pb2.JOB_STATE_CANCELLED
        counted = node.metrics.grpc_requests.labels(
            "pagesift.v1.JobService/GetJob", "UNAUTHENTICATED"
        )._value.get()
        assert counted == 3


async def test_job_client_sends_the_api_key_on_streams_too(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    root = site[1]
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        serving(node_config(tmp_path / "n", accounts_file=str(accounts))) as node,
        JobClient(node.config.listen, api_key=ALICE.key) as client,
    ):
        job_id = await client.start_crawl(crawl(root, limit=3))
        seen = [event async for event in client.watch(job_id)]  # WatchJob: a stream
        assert seen[-1].state.state == jobs_pb2.JOB_STATE_COMPLETED
        assert sum(e.HasField("document") for e in seen) == 3


# ================================================================= webhooks


async def test_a_crawl_webhook_delivers_every_event_once_in_order_and_signed(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    root = site[1]
    receiver = Receiver(ALICE.secret)
    url = await receiver.start()
    accounts = write_accounts(tmp_path / "accounts.toml")
    try:
        async with (
            serving(node_config(tmp_path / "n", accounts_file=str(accounts))) as node,
            grpc.aio.insecure_channel(node.config.listen) as ch,
        ):
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            md = ALICE.md
            # refusals first: an unknown event, an account with nothing to sign with
            bad = crawl(root, webhook=jobs_pb2.Webhook(url=url, events=["page", "nope"]))
            err = await refused(stub.StartCrawl(bad, metadata=md))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "webhook.events[1]" in (err.details() or "")
            hooked = crawl(root, max_concurrency=4, webhook=jobs_pb2.Webhook(url=url))
            err = await refused(stub.StartCrawl(hooked, metadata=NOSECRET.md))
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION

            job = await stub.StartCrawl(hooked, metadata=md)
            final = await wait_done(stub, job.id, md)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED
            n = 2 + final.completed + final.failed  # started, one per page, completed
            await until(
                lambda: outbox.pending(node.store(), job.id) == 0, "the outbox to drain", 15
            )
            docs = await documents(stub, job.id, md)
            errs = await stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job.id), metadata=md)
        hits = receiver.of(job.id)
        check_event_stream(hits, n)
        assert receiver.hits == hits  # nothing else was posted
        assert hits[-1].event == "completed"
        assert hits[-1].data["completed"] == final.completed == len(docs)
        assert hits[-1].data["failed"] == final.failed
        assert hits[0].data["kind"] == "crawl"
        pages = [x for x in hits if x.event == "page"]
        assert [x.data["index"] for x in pages] == list(range(len(docs)))
        for x in pages:  # each page event names the document at its index
            d = docs[x.data["index"]]
            assert (x.data["url"], x.data["title"]) == (d.url, d.title)
        failed = sorted(str(x.data["url"]) for x in hits if x.event == "page_failed")
        assert failed == sorted(e.url for e in errs.errors if e.url)
        assert not [e for e in errs.errors if e.code == outbox.NOTE_CODE]
        # signed with alice's secret, and with nobody else's
        for x in hits:
            assert not outbox.verify_signature(BOB.secret, x.timestamp, x.body, x.signature)
    finally:
        await receiver.stop()


async def test_a_webhook_receiver_down_then_back_gets_every_event_by_retries(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    accounts = write_accounts(tmp_path / "accounts.toml")
    config = node_config(
        tmp_path / "n",
        accounts_file=str(accounts),
        webhook_base_delay=0.02,
        webhook_max_delay=0.1,
        webhook_max_attempts=500,  # ~50 s of retries: never given up in this test
    )
    failures = {"left": 2}

    async def flaky(hit: Hit) -> int:  # back, but answering 503 twice at first
        if failures["left"] > 0:
            failures["left"] -= 1
            return 503
        return 200

    receiver = Receiver(ALICE.secret, flaky)
    try:
        async with (
            serving(config) as node,
            grpc.aio.insecure_channel(node.config.listen) as ch,
        ):
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            req = jobs_pb2.StartBatchScrapeRequest(
                urls=article_urls(s, root, 5), webhook=jobs_pb2.Webhook(url=url)
            )
            job = await stub.StartBatchScrape(req, metadata=ALICE.md)
            final = await wait_done(stub, job.id, ALICE.md)
            n = 2 + final.completed + final.failed
            errors = node.metrics.webhook_deliveries.labels("error")

            # nobody listens: connection refused, again and again, nothing given up
            await until(lambda: errors._value.get() >= 5, "failed attempts", 10)
            assert outbox.pending(node.store(), job.id) == n
            queue = metric(await scrape_metrics_local(node), "pagesift_webhook_queue_depth")
            assert queue == n
            await receiver.start(port)
            await until(
                lambda: outbox.pending(node.store(), job.id) == 0, "the outbox to drain", 15
            )
            errs = await stub.GetJobErrors(
                jobs_pb2.GetJobErrorsRequest(id=job.id), metadata=ALICE.md
            )
            assert not [e for e in errs.errors if e.code == outbox.NOTE_CODE]
            assert node.metrics.webhook_deliveries.labels("undeliverable")._value.get() == 0
        hits = receiver.of(job.id)
        assert [x.seq for x in hits] == [0, 0, 0, *range(1, n)]  # 503, 503, then 2xx
        check_event_stream([x for x in hits if x.status == 200], n)
    finally:
        await receiver.stop()


async def test_in_sync_mode_a_page_event_is_posted_only_once_its_page_is_replicated(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    root = site[1]
    accounts = write_accounts(tmp_path / "accounts.toml")
    # a sync primary whose standby is away: each page waits sync_timeout for an ack and
    # is not visible (GetJob caps at the replicated pages) until then
    config = node_config(
        tmp_path / "n", accounts_file=str(accounts), replication_mode="sync", sync_timeout=2.0
    )
    seen: list[tuple[int, int]] = []  # (the event's page index, pages GetJob shows then)
    nodes: list[tuple[Node, jobs_pb2_grpc.JobServiceAsyncStub]] = []

    async def respond(hit: Hit) -> int:
        node, stub = nodes[0]
        if hit.event == "started":
            # answer once a page is committed (its event is next in the outbox), so the
            # delivery loop reads that event at once instead of going idle
            pages = records.JobKeys(hit.job).pages
            await until(lambda: node.store().list_len(pages) > 0, "a page committed", 10)
        if hit.event == "page" and len(seen) < 3:
            job = await stub.GetJob(jobs_pb2.GetJobRequest(id=hit.job), metadata=ALICE.md)
            seen.append((int(hit.data["index"]), job.completed))
        return 200

    receiver = Receiver(ALICE.secret, respond)
    url = await receiver.start()
    try:
        async with serving(config) as node, grpc.aio.insecure_channel(node.config.listen) as ch:
            nodes.append((node, jobs_pb2_grpc.JobServiceStub(ch)))
            req = crawl(root, max_concurrency=4, webhook=jobs_pb2.Webhook(url=url))
            await nodes[0][1].StartCrawl(req, metadata=ALICE.md)
            await until(lambda: len(seen) >= 3, "three page events", 15)
            premature = [(i, shown) for i, shown in seen if shown <= i]
            assert not premature, f"page events before their page was visible: {premature}"
    finally:
        await receiver.stop()


async def scrape_metrics_local(node: Node) -> Samples:
    """The node's exposition, parsed (without an HTTP endpoint)."""
    text = (await asyncio.to_thread(node.metrics.exposition)).decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


# ================================================================= metrics

EXPECTED_SERIES = {
    "pagesift_jobs",
    "pagesift_pages_total",
    "pagesift_page_errors_total",
    "pagesift_fetch_seconds_bucket",
    "pagesift_fetch_seconds_count",
    "pagesift_fetch_seconds_sum",
    "pagesift_fetched_bytes_total",
    "pagesift_robots_blocked_total",
    "pagesift_grpc_requests_total",
    "pagesift_webhook_queue_depth",
    "pagesift_replication_role",
    "pagesift_replication_epoch",
    "pagesift_replication_applied_offset",
    "pagesift_replication_primary_offset",
    "pagesift_replication_acked_offset",
    "pagesift_replication_lag_seconds",
    "pagesift_replication_connected",
    "pagesift_replication_backlog_bytes",
    "pagesift_replication_full_resyncs_total",
    "pagesift_replication_sync_degraded_total",
}


async def test_the_metrics_endpoint_serves_every_series_and_they_move_with_a_crawl(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    root = site[1]
    address = f"127.0.0.1:{free_port()}"
    async with serving(node_config(tmp_path / "n", metrics_listen=address)) as node:
        before = await scrape_metrics(address)
        async with grpc.aio.insecure_channel(node.config.listen) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            job = await stub.StartCrawl(crawl(root, max_concurrency=4))
            final = await wait_done(stub, job.id)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED
            await refused(
                stub.GetJob(jobs_pb2.GetJobRequest(id="00000000-0000-4000-8000-000000000000"))
            )

        async def counted() -> Samples | None:
            # the interceptor counts a call once its handler has ended, which can be just
            # after the caller already has the status
            samples = await scrape_metrics(address)
            name, labels = "pagesift_grpc_requests_total", "pagesift.v1.JobService/GetJob"
            return samples if metric(samples, name, method=labels, code="NOT_FOUND") else None

        after = await eventually(counted, "the refused GetJob to be counted", timeout=10)
    missing = EXPECTED_SERIES - metric_names(after)
    assert not missing, missing
    assert metric(after, "pagesift_replication_role", role="primary") == 1
    assert metric(after, "pagesift_replication_role", role="standby") == 0
    assert metric(after, "pagesift_replication_applied_offset") > metric(
        before, "pagesift_replication_applied_offset"
    )
    assert metric(before, "pagesift_jobs", kind="crawl", state="completed") == 0
    assert metric(after, "pagesift_jobs", kind="crawl", state="completed") == 1
    assert metric(after, "pagesift_pages_total", kind="crawl") == final.completed > 0
    assert metric(before, "pagesift_pages_total", kind="crawl") == 0
    errors = sum(v for (name, _), v in after.items() if name == "pagesift_page_errors_total")
    assert errors == final.failed > 0
    assert (
        metric(after, "pagesift_page_errors_total", code="robots_disallowed")
        == metric(after, "pagesift_robots_blocked_total")
        > 0
    )
    assert metric(after, "pagesift_fetch_seconds_count") >= final.completed
    assert metric(after, "pagesift_fetch_seconds_count") > metric(
        before, "pagesift_fetch_seconds_count"
    )
    assert metric(after, "pagesift_fetch_seconds_sum") > 0
    assert metric(after, "pagesift_fetched_bytes_total") > 10_000

    def calls(samples: Samples, method: str, code: str) -> float:
        name = "pagesift_grpc_requests_total"
        return metric(samples, name, method=f"pagesift.v1.JobService/{method}", code=code)

    assert calls(before, "StartCrawl", "OK") == 0
    assert calls(after, "StartCrawl", "OK") == 1
    assert calls(after, "GetJob", "NOT_FOUND") == 1
    assert calls(after, "GetJob", "OK") >= 1


# ================================================================= transport security

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@needs_openssl
async def test_the_public_port_with_tls_serves_tls_clients_and_refuses_plaintext(
    tmp_path: Path, certs: Certs, site: tuple[Site, str]
) -> None:
    s, root = site
    config = node_config(
        tmp_path / "n", tls_cert=str(certs.server_cert), tls_key=str(certs.server_key)
    )
    async with serving(config) as node:
        creds = tls.channel_credentials(certs.ca)
        async with grpc.aio.secure_channel(node.config.listen, creds) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            job = await stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 2)), timeout=5
            )
            final = await wait_done(stub, job.id)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED and final.completed == 2
        async with grpc.aio.insecure_channel(node.config.listen) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            err = await refused(stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
        # a client that does not trust the server's CA is refused too
        untrusted = tls.channel_credentials(certs.other_ca)
        async with grpc.aio.secure_channel(node.config.listen, untrusted) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            err = await refused(stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5))
            assert err.code() == grpc.StatusCode.UNAVAILABLE


@needs_openssl
async def test_mtls_replication_follows_with_a_client_certificate_and_refuses_without_one(
    tmp_path: Path, certs: Certs, site: tuple[Site, str]
) -> None:
    s, root = site
    repl_address = f"127.0.0.1:{free_port()}"
    primary_cfg = node_config(
        tmp_path / "p",
        tls_cert=str(certs.server_cert),
        tls_key=str(certs.server_key),
        replication_listen=repl_address,
        replication_ca=str(certs.ca),
        replication_token_file="",  # mTLS only
    )

    def standby(name: str, target: str = repl_address, **kw: Any) -> ServerConfig:
        return node_config(
            tmp_path / name,
            role="standby",
            primary=target,
            replication_ca=str(certs.ca),
            replication_token_file="",
            **kw,
        )

    good = standby(
        "good", replication_cert=str(certs.client_cert), replication_key=str(certs.client_key)
    )
    no_cert = standby("nocert")
    rogue = standby(
        "rogue", replication_cert=str(certs.rogue_cert), replication_key=str(certs.rogue_key)
    )
    # the public port does not serve replication when an mTLS port exists, even with a cert
    public = standby(
        "public",
        target=primary_cfg.listen,
        replication_cert=str(certs.client_cert),
        replication_key=str(certs.client_key),
    )
    async with contextlib.AsyncExitStack() as stack:
        p = await stack.enter_async_context(serving(primary_cfg))
        nodes = [
            await stack.enter_async_context(serving(c)) for c in (good, no_cert, rogue, public)
        ]
        ch = await stack.enter_async_context(
            grpc.aio.secure_channel(p.config.listen, tls.channel_credentials(certs.ca))
        )
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        job = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 3)), timeout=5
        )
        await wait_done(stub, job.id)
        offset = await caught_up(admin(ch), good.listen, 15)
        assert offset > 0
        async with grpc.aio.insecure_channel(good.listen) as s_ch:
            same = await verify_digests(admin(ch), admin(s_ch))
            assert same.equal and same.offset >= offset
            replica = await jobs_pb2_grpc.JobServiceStub(s_ch).GetJob(
                jobs_pb2.GetJobRequest(id=job.id)
            )
            assert replica.completed == 3
            # a write refused by the standby names the primary's public port, which the
            # primary announced, not the replication port the standby follows
            with pytest.raises(grpc.aio.AioRpcError) as write:
                await jobs_pb2_grpc.JobServiceStub(s_ch).StartBatchScrape(
                    jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 1)), timeout=5
                )
            assert write.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = write.value.details() or ""
            assert p.config.listen in details and repl_address not in details
        primary_role = await admin(ch).Role(rpb.RoleRequest(), timeout=5)
        assert primary_role.connected and primary_role.peer == nodes[0].node_id
        # no client certificate, or one from a CA the primary does not trust: the TLS
        # handshake fails; the public port refuses replication when an mTLS port exists
        await stays_refused(nodes[1:3], "UNAVAILABLE")
        await stays_refused(nodes[3:], "PERMISSION_DENIED: replication is served with mTLS")


async def test_the_replication_token_admits_a_standby_with_it_and_refuses_one_without(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    token = tmp_path / "token"
    token.write_text("s3cret-replication-token-0123\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-replication-token\n")
    primary_cfg = node_config(tmp_path / "p", replication_token_file=str(token))

    def standby(name: str, **kw: Any) -> ServerConfig:
        return node_config(tmp_path / name, role="standby", primary=primary_cfg.listen, **kw)

    async with contextlib.AsyncExitStack() as stack:
        p = await stack.enter_async_context(serving(primary_cfg))
        good, bad = [
            await stack.enter_async_context(serving(c))
            for c in (
                standby("good", replication_token_file=str(token)),
                standby("bad", replication_token_file=str(wrong)),
            )
        ]
        ch = await stack.enter_async_context(grpc.aio.insecure_channel(p.config.listen))
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        job = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 3)), timeout=5
        )
        await wait_done(stub, job.id)
        offset = await caught_up(admin(ch), good.config.listen, 15)
        async with grpc.aio.insecure_channel(good.config.listen) as s_ch:
            same = await verify_digests(admin(ch), admin(s_ch))
            assert same.equal and same.offset >= offset > 0
        await stays_refused([bad], "UNAUTHENTICATED: replication needs the shared token")


async def test_promote_needs_the_admin_key_when_one_is_configured(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    primary_cfg = node_config(tmp_path / "p", accounts_file=str(accounts))
    standby_cfg = node_config(
        tmp_path / "s", role="standby", primary=primary_cfg.listen, accounts_file=str(accounts)
    )
    async with (
        serving(primary_cfg) as p,
        serving(standby_cfg) as sb,
        grpc.aio.insecure_channel(p.config.listen) as p_ch,
        grpc.aio.insecure_channel(sb.config.listen) as s_ch,
    ):
        p_stub = jobs_pb2_grpc.JobServiceStub(p_ch)
        job = await p_stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 2)), metadata=ALICE.md
        )
        await wait_done(p_stub, job.id, ALICE.md)

        async def standby_caught_up() -> int | None:
            pr, sr = await role(p.config.listen, ADMIN_MD), await role(sb.config.listen, ADMIN_MD)
            return (
                sr.applied_offset
                if sr.connected and sr.applied_offset == pr.applied_offset
                else None
            )

        await eventually(standby_caught_up, "the standby to catch up", 15)
        for stub in (admin(p_ch), admin(s_ch)):
            for md in [(), ALICE.md, (("authorization", "Bearer psk_wrong_0123456789"),)]:
                for call in (
                    stub.Promote(rpb.PromoteRequest(), metadata=md, timeout=5),
                    stub.Role(rpb.RoleRequest(), metadata=md, timeout=5),
                    stub.Digest(rpb.DigestRequest(), metadata=md, timeout=5),
                ):
                    err = await refused(call)
                    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
                    assert "admin key" in (err.details() or "")
        assert (await role(sb.config.listen, ADMIN_MD)).role == rpb.NODE_ROLE_STANDBY
        before = await role(sb.config.listen, ADMIN_MD)
        promoted = await admin(s_ch).Promote(rpb.PromoteRequest(), metadata=ADMIN_MD, timeout=10)
        assert not promoted.already_primary and promoted.epoch == before.epoch + 1
        after = await role(sb.config.listen, ADMIN_MD)
        assert after.role == rpb.NODE_ROLE_PRIMARY
        # the promoted node takes writes from the same accounts, and keeps their jobs
        s_stub = jobs_pb2_grpc.JobServiceStub(s_ch)
        old = await s_stub.GetJob(jobs_pb2.GetJobRequest(id=job.id), metadata=ALICE.md)
        assert old.completed == 2
        err = await refused(s_stub.GetJob(jobs_pb2.GetJobRequest(id=job.id), metadata=BOB.md))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        new = await s_stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=article_urls(s, root, 1)), metadata=ALICE.md
        )
        assert (await wait_done(s_stub, new.id, ALICE.md)).completed == 1
