"""API conventions (AIPs): ListJobs and GetJobErrors paging (AIP-158) through the owner
index, the ListJobs state filter (AIP-132), idempotency keys bound to their request
(AIP-155), the closed sets as enums, and server reflection v1."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2

from pagesift.cli import amain
from pagesift.client.errors import details_of, error_info_of, reason_of, status_of
from pagesift.core.api.rpcerrors import Reason
from pagesift.core.jobs import records, views
from pagesift.core.jobs.pageerrors import ErrorCode
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.v1 import jobs_pb2
from tests.helpers import (
    ALICE,
    BOB,
    Metadata,
    RunningNode,
    in_process_node,
    serve_handler,
    wait_done,
    write_accounts,
)

C = grpc.StatusCode
DEAD = "http://127.0.0.1:9/"  # connection refused: a page error at once


def fields_of(err: grpc.aio.AioRpcError) -> list[str]:
    (bad,) = details_of(status_of(err), error_details_pb2.BadRequest)
    return [v.field for v in bad.field_violations]


@pytest.fixture
async def slow_port() -> AsyncIterator[int]:
    """A site whose pages never answer within the test: jobs on it stay running."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(60)
        return web.Response(text="late")

    async with serve_handler(handler) as port:
        yield port


def batch(*urls: str, key: str = "") -> jobs_pb2.StartBatchScrapeRequest:
    return jobs_pb2.StartBatchScrapeRequest(urls=list(urls), idempotency_key=key)


async def start(node: RunningNode, md: Metadata, *urls: str, key: str = "") -> str:
    resp = await node.stub.StartBatchScrape(batch(*urls, key=key), metadata=md)
    return resp.id


async def walk(
    node: RunningNode, md: Metadata, page_size: int, **filters: Any
) -> tuple[list[jobs_pb2.JobSummary], int]:
    """Every job ListJobs pages out, and how many pages it took."""
    jobs: list[jobs_pb2.JobSummary] = []
    token, pages = "", 0
    while True:
        resp = await node.stub.ListJobs(
            jobs_pb2.ListJobsRequest(page_size=page_size, page_token=token, **filters),
            metadata=md,
        )
        jobs.extend(resp.jobs)
        pages += 1
        assert pages < 100
        if not resp.next_page_token:
            return jobs, pages
        token = resp.next_page_token


def ids(jobs: list[jobs_pb2.JobSummary]) -> list[str]:
    return [j.id for j in jobs]


def members(store: Store, owner: str) -> set[str]:
    return {records.member_job(m) for m in store.set_members(records.owner_set(owner))}


# ------------------------------------------------------------------ the store's range read


def test_set_range_reads_members_in_byte_order_both_ways_past_a_cursor(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    try:

        def fill(g: WriteGroup) -> None:
            for m in (b"b", b"d", b"a", b"c", b"e"):
                g.insert("s", m)
            g.insert("s2", b"zz")  # a neighbouring set is never read
            g.insert("r", b"zz")

        store.write(fill)
        assert store.set_range("s", None, 2) == [b"a", b"b"]
        assert store.set_range("s", b"b", 10) == [b"c", b"d", b"e"]
        assert store.set_range("s", None, 2, reverse=True) == [b"e", b"d"]
        assert store.set_range("s", b"d", 10, reverse=True) == [b"c", b"b", b"a"]
        assert store.set_range("s", b"bb", 1, reverse=True) == [b"b"]  # a gone cursor
        assert store.set_range("s", b"a", 10, reverse=True) == []
        assert store.set_range("s", b"e", 10) == []
    finally:
        store.close()


# ------------------------------------------------------------------ ListJobs


async def test_list_jobs_pages_every_job_of_the_caller_once_newest_first_never_another_accounts(
    tmp_path: Path, slow_port: int
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    slow = f"http://127.0.0.1:{slow_port}/"
    async with in_process_node(
        tmp_path / "n", accounts_file=str(accounts), read_timeout=60.0
    ) as node:
        mine = [await start(node, ALICE.md, f"{slow}{i}") for i in range(7)]
        theirs = [await start(node, BOB.md, f"{slow}b{i}") for i in range(3)]
        cancelled = mine[1:3]
        for job_id in cancelled:
            await node.stub.CancelJob(jobs_pb2.CancelJobRequest(id=job_id), metadata=ALICE.md)

        for size in (1, 3, 7, 100):
            jobs, pages = await walk(node, ALICE.md, size)
            assert sorted(ids(jobs)) == sorted(mine)  # each once, none of bob's
            assert len(ids(jobs)) == len(set(ids(jobs)))
            keys = [(j.created_at.ToMilliseconds(), j.id) for j in jobs]
            assert keys == sorted(keys, reverse=True)  # newest first, ties by id
            assert pages == -(-len(mine) // size)  # the last page says it is the last
        bobs, _ = await walk(node, BOB.md, 2)
        assert sorted(ids(bobs)) == sorted(theirs)

        gone, _ = await walk(node, ALICE.md, 1, states=[jobs_pb2.JOB_STATE_CANCELLED])
        assert sorted(ids(gone)) == sorted(cancelled)
        running, _ = await walk(node, ALICE.md, 2, active_only=True)
        assert sorted(ids(running)) == sorted(set(mine) - set(cancelled))
        both, _ = await walk(
            node,
            ALICE.md,
            2,
            states=[jobs_pb2.JOB_STATE_CANCELLED, jobs_pb2.JOB_STATE_COMPLETED],
            active_only=True,
        )
        assert both == []  # the filters apply together

        store = node.node.store()
        assert members(store, "alice") == set(mine)  # the index, written with each job
        assert members(store, "bob") == set(theirs)
        assert store.get(records.OWNER_INDEX_DONE) == b"1"


async def test_list_jobs_refuses_a_bad_page_token_page_size_or_state_naming_the_field(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        for i in range(3):
            await start(node, ALICE.md, f"{DEAD}{i}")
        first = await node.stub.ListJobs(jobs_pb2.ListJobsRequest(page_size=1), metadata=ALICE.md)
        assert first.next_page_token
        forged = base64.urlsafe_b64encode(b"jobs1\x00all\x00../../etc").decode()
        bad: list[tuple[jobs_pb2.ListJobsRequest, str]] = [
            (jobs_pb2.ListJobsRequest(page_token="not a token!"), "page_token"),
            (jobs_pb2.ListJobsRequest(page_token=forged), "page_token"),
            # the same token with another filter (AIP-158: the request must not change)
            (
                jobs_pb2.ListJobsRequest(page_token=first.next_page_token, active_only=True),
                "page_token",
            ),
            (jobs_pb2.ListJobsRequest(page_size=-1), "page_size"),
            (jobs_pb2.ListJobsRequest(states=[jobs_pb2.JOB_STATE_UNSPECIFIED]), "states[0]"),
        ]
        for request, field in bad:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await node.stub.ListJobs(request, metadata=ALICE.md)
            assert e.value.code() == C.INVALID_ARGUMENT, field
            assert reason_of(e.value) == Reason.INVALID_FIELD
            assert fields_of(e.value) == [field]
        # a page size above max_page_size is cut to it, not refused (AIP-158)
        big = await node.stub.ListJobs(jobs_pb2.ListJobsRequest(page_size=10**6), metadata=ALICE.md)
        assert len(big.jobs) == 3 and not big.next_page_token


async def test_the_owner_index_entry_is_gone_with_the_jobs_expiry(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE,))
    async with in_process_node(
        tmp_path / "n", accounts_file=str(accounts), job_ttl_seconds=1.0
    ) as node:
        job_id = await start(node, ALICE.md, DEAD, key="expiring")
        store = node.node.store()
        assert members(store, "alice") == {job_id}
        await wait_done(node.stub, job_id, ALICE.md)
        for _ in range(100):
            if not list(store.replicated_items()):
                break
            await asyncio.sleep(0.1)
        # the job, its index entry, its key, and the index marker (no job left): nothing
        assert list(store.replicated_items()) == []
        listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=ALICE.md)
        assert list(listed.jobs) == []


async def test_a_store_written_before_the_index_still_lists_its_jobs(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    data = tmp_path / "n"

    def unindex(g: WriteGroup) -> None:  # what a store of the previous version holds
        g.clear_set(records.owner_set("alice"))
        g.clear_set(records.owner_set("bob"))
        g.delete(records.OWNER_INDEX_DONE)

    async with in_process_node(data, accounts_file=str(accounts)) as node:
        mine = [await start(node, ALICE.md, f"{DEAD}{i}") for i in range(4)]
        theirs = [await start(node, BOB.md, DEAD)]
        for job_id in mine:
            await wait_done(node.stub, job_id, ALICE.md)
        store = node.node.store()
        store.write(unindex)
        assert not records.has_owner_index(store)
        jobs, _ = await walk(node, ALICE.md, 3)  # the fallback pages the jobs set
        assert sorted(ids(jobs)) == sorted(mine)
    async with in_process_node(data, accounts_file=str(accounts)) as node:
        store = node.node.store()  # the start-up migration built the index, in one group
        assert store.get(records.OWNER_INDEX_DONE) == b"1"
        assert members(store, "alice") == set(mine)
        assert members(store, "bob") == set(theirs)
        jobs, pages = await walk(node, ALICE.md, 3)
        assert sorted(ids(jobs)) == sorted(mine) and pages == 2
        newer = await start(node, ALICE.md, DEAD)
        jobs, _ = await walk(node, ALICE.md, 3)
        assert ids(jobs)[0] == newer and sorted(ids(jobs)) == sorted([*mine, newer])


# ------------------------------------------------------------------ GetJobErrors


async def test_get_job_errors_pages_every_error_once_in_order_with_its_code_enum(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE,))
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        urls = [f"{DEAD}{i}" for i in range(7)]
        job_id = await start(node, ALICE.md, *urls)
        await wait_done(node.stub, job_id, ALICE.md)
        whole = await node.stub.GetJobErrors(
            jobs_pb2.GetJobErrorsRequest(id=job_id, page_size=1000), metadata=ALICE.md
        )
        assert not whole.next_page_token and len(whole.errors) >= 7
        assert {err.url for err in whole.errors if err.url} == set(urls)
        for err in whole.errors:
            assert (
                err.code_enum == views.code_enum(err.code) != jobs_pb2.PAGE_ERROR_CODE_UNSPECIFIED
            )
        for size in (1, 2, 3, len(whole.errors)):
            got: list[jobs_pb2.PageError] = []
            token = ""
            while True:
                page = await node.stub.GetJobErrors(
                    jobs_pb2.GetJobErrorsRequest(id=job_id, page_size=size, page_token=token),
                    metadata=ALICE.md,
                )
                assert len(page.errors) <= size
                got.extend(page.errors)
                if not page.next_page_token:
                    break
                token = page.next_page_token
            assert list(got) == list(whole.errors)

        other = await start(node, ALICE.md, DEAD, f"{DEAD}x")
        await wait_done(node.stub, other, ALICE.md)
        first = await node.stub.GetJobErrors(
            jobs_pb2.GetJobErrorsRequest(id=other, page_size=1), metadata=ALICE.md
        )
        assert first.next_page_token
        for token in (first.next_page_token, "@@@"):  # another job's token, or junk
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await node.stub.GetJobErrors(
                    jobs_pb2.GetJobErrorsRequest(id=job_id, page_token=token), metadata=ALICE.md
                )
            assert e.value.code() == C.INVALID_ARGUMENT
            assert fields_of(e.value) == ["page_token"]


def test_page_error_codes_and_webhook_events_are_closed_sets_with_enums() -> None:
    for code in ErrorCode:
        assert views.code_enum(str(code)) != jobs_pb2.PAGE_ERROR_CODE_UNSPECIFIED, code
    for note in ("failed", "completed", "webhook_undeliverable"):
        assert views.code_enum(note) != jobs_pb2.PAGE_ERROR_CODE_UNSPECIFIED
    assert views.code_enum("no_such_code") == jobs_pb2.PAGE_ERROR_CODE_UNSPECIFIED
    named = [records.event_name(v) for v in jobs_pb2.WebhookEvent.values()]
    assert sorted(n for n in named if n) == sorted(records.WEBHOOK_EVENTS)
    assert records.event_name(jobs_pb2.WEBHOOK_EVENT_UNSPECIFIED) == ""


async def test_webhook_event_types_are_validated_naming_the_element(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE,))
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        hook = jobs_pb2.Webhook(
            url="http://127.0.0.1:9/hook",
            event_types=[jobs_pb2.WEBHOOK_EVENT_COMPLETED, jobs_pb2.WEBHOOK_EVENT_UNSPECIFIED],
        )
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=[DEAD], webhook=hook), metadata=ALICE.md
            )
        assert e.value.code() == C.INVALID_ARGUMENT
        assert fields_of(e.value) == ["webhook.event_types[1]"]
        hook.event_types[:] = [jobs_pb2.WEBHOOK_EVENT_COMPLETED]
        hook.events[:] = ["started"]
        resp = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=[DEAD], webhook=hook), metadata=ALICE.md
        )
        raw = node.node.store().get(records.JobKeys(resp.id).webhook)
        assert raw is not None and b"completed" in raw and b"started" in raw


# ------------------------------------------------------------------ idempotency (AIP-155)


async def test_the_same_key_and_request_return_the_first_job(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        a = await start(node, ALICE.md, DEAD, f"{DEAD}a", key="k1")
        b = await start(node, ALICE.md, DEAD, f"{DEAD}a", key="k1")
        c = await start(node, BOB.md, DEAD, f"{DEAD}a", key="k1")  # another owner's key
        assert a == b != c
        listed, _ = await walk(node, ALICE.md, 10)
        assert ids(listed) == [a]


async def test_the_same_key_with_another_request_is_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE,))
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        first = await start(node, ALICE.md, DEAD, key="k1")
        refused: list[Any] = [
            node.stub.StartBatchScrape(batch(f"{DEAD}other", key="k1"), metadata=ALICE.md),
            node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url=DEAD, idempotency_key="k1"), metadata=ALICE.md
            ),  # the same key for another kind of job
        ]
        for call in refused:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == C.INVALID_ARGUMENT
            assert reason_of(e.value) == Reason.IDEMPOTENCY_KEY_REUSED
            assert fields_of(e.value) == ["idempotency_key"]
            info = error_info_of(e.value)
            assert info.metadata["field"] == "idempotency_key" and info.metadata["id"] == first
        listed, _ = await walk(node, ALICE.md, 10)
        assert ids(listed) == [first]  # nothing was written


async def test_a_key_is_reusable_for_another_request_once_its_job_expired(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE,))
    async with in_process_node(
        tmp_path / "n", accounts_file=str(accounts), job_ttl_seconds=1.0
    ) as node:
        first = await start(node, ALICE.md, DEAD, key="k1")
        await wait_done(node.stub, first, ALICE.md)
        store = node.node.store()
        for _ in range(100):
            if store.get(records.idem_key("alice", "k1")) is None:
                break
            await asyncio.sleep(0.1)
        assert store.get(records.idem_key("alice", "k1")) is None  # expired with its job
        second = await start(node, ALICE.md, f"{DEAD}other", key="k1")
        assert second != first


async def test_a_key_stored_without_a_request_hash_returns_its_job_as_before(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE,))
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        old = "00000000-0000-4000-8000-000000000001"
        now = records.now_ms()
        meta = records.JobMeta(old, "batch", "completed", "alice", now, now + 3_600_000, 1, 0, "k0")

        def previous_version(g: WriteGroup) -> None:  # a job and key as they were stored
            g.put(records.JobKeys(old).meta, meta.encode())
            g.put(records.idem_key("alice", "k0"), old.encode())
            g.insert(records.owner_set("alice"), records.owner_member(now, old))
            g.insert(records.JOBS_SET, old.encode())

        node.node.store().write(previous_version)
        assert await start(node, ALICE.md, f"{DEAD}any", key="k0") == old


# ------------------------------------------------------------------ reflection


async def test_server_reflection_v1_and_v1alpha_list_the_services(tmp_path: Path) -> None:
    async with in_process_node(tmp_path / "n") as node:
        for version in ("v1", "v1alpha"):
            call = node.channel.stream_stream(
                f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            )
            requests = [
                reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(
                    file_containing_symbol="grpc.reflection.v1.ServerReflection"
                ),
            ]
            answers = [r async for r in call(iter(requests))]
            names = {s.name for s in answers[0].list_services_response.service}
            assert {
                "pagesift.v1.JobService",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            } <= names, version
            files = answers[1].file_descriptor_response.file_descriptor_proto
            assert files, f"{version}: reflection v1 cannot describe itself"


# ------------------------------------------------------------------ client and CLI


async def test_the_cli_lists_every_page_of_jobs_and_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        mine = [await start(node, ALICE.md, f"{DEAD}{i}", f"{DEAD}{i}x") for i in range(5)]
        await start(node, BOB.md, DEAD)
        for job_id in mine:
            await wait_done(node.stub, job_id, ALICE.md)
        who = ["--server", node.address, "--api-key", ALICE.key]
        assert await amain(["jobs", *who, "--json", "--page-size", "2"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert sorted(j["id"] for j in listed["jobs"]) == sorted(mine)
        assert "next_page_token" not in listed  # the output it always had
        assert await amain(["jobs", *who, "--page-size", "2"]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 5

        assert await amain(["jobs", *who, "--json", "--page-size", "2", "--page-token", ""]) == 0
        first = json.loads(capsys.readouterr().out)
        assert len(first["jobs"]) == 2 and first["next_page_token"]
        token = first["next_page_token"]
        assert await amain(["jobs", *who, "--page-size", "2", "--page-token", token]) == 0
        out = capsys.readouterr()
        assert len(out.out.splitlines()) == 2 and "--page-token" in out.err

        assert await amain(["errors", mine[0], *who, "--json"]) == 0
        errors = json.loads(capsys.readouterr().out)["errors"]
        assert {e["url"] for e in errors if e["url"]} == {f"{DEAD}0", f"{DEAD}0x"}
