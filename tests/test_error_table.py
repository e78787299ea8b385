"""The error table (``pagesift.core.api.errortable``) and the request specs
(``pagesift.core.jobs.specs``): one row per reason, every mapped exception becomes
its row's status, the API docs' reason table is the generated one, and one validation
call per request reports every bad field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from pagesift.client.errors import details_of, status_of
from pagesift.core.api.errortable import (
    HANDLED,
    TABLE,
    AdminKeyRequired,
    BackupFailed,
    BackupInProgress,
    CallFacts,
    CannotPromote,
    DigestOffsetPassed,
    DocumentTooLarge,
    JobNotFound,
    KeyRequired,
    MalformedRequest,
    NoLongerPrimary,
    OffsetNotReached,
    PageFailed,
    ReplicationNotAllowed,
    ReplicationRefused,
    SkipOutOfRange,
    StandbyNode,
    SteppedDownForPeer,
    reason_table_markdown,
    refusal_of,
    row_for,
)
from pagesift.core.api.rpcerrors import Reason
from pagesift.core.cluster.ownership import HostOwnedElsewhere
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quota
from pagesift.core.jobs.accounts import Account, Unauthenticated
from pagesift.core.jobs.clusterlimits import ClusterUnavailable
from pagesift.core.jobs.modelrequests import ModelUnanswered
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.records import IdempotencyKeyReused, JobNotAppendable
from pagesift.core.jobs.renderoptions import RenderingUnavailable
from pagesift.core.jobs.specs import Permissions, WebhookSecretMissing, crawl, scrape
from pagesift.core.jobs.validate import InvalidArgument, PermissionDenied
from pagesift.core.replication.backlog import BacklogLost
from pagesift.core.replication.identity import Fenced, NotWritable
from pagesift.core.store.errors import NO_SPACE, StorageUnavailable
from pagesift.v1 import jobs_pb2
from tests.helpers import in_process_node

ROOT = Path(__file__).resolve().parent.parent
C = grpc.StatusCode
FACTS = CallFacts(account="acme", primary_hint="10.0.0.1:50051 (from the witness)", now=1e9)

#: one instance of every exception type the table maps
SAMPLES: dict[type[Exception], Exception] = {
    InvalidArgument: InvalidArgument("url", "missing"),
    IdempotencyKeyReused: IdempotencyKeyReused("job-1"),
    Unauthenticated: Unauthenticated("no API key"),
    PermissionDenied: PermissionDenied("options.proxy_url", "not this account"),
    JobNotFound: JobNotFound("job-1", "id: no job job-1"),
    JobNotAppendable: JobNotAppendable("job-1", "batch", "cancelled"),
    SkipOutOfRange: SkipOutOfRange(9, 3),
    StandbyNode: StandbyNode(),
    NotWritable: NotWritable("the witness lease lapsed"),
    Fenced: Fenced("met epoch 7"),
    WebhookSecretMissing: WebhookSecretMissing("acme"),
    RenderingUnavailable: RenderingUnavailable("options.engine"),
    ModelUnanswered: ModelUnanswered("invalid_answer", "the model gave no valid crawl options"),
    quota.LimitExceeded: quota.LimitExceeded("pages_per_day", "over 10 pages", 1e9 + 60),
    DocumentTooLarge: DocumentTooLarge(4, 99, 64, "skip"),
    PageFailed: PageFailed(PageError(ErrorCode.INVALID_URL, "no host"), "http://x/"),
    StorageUnavailable: StorageUnavailable(NO_SPACE),
    ClusterUnavailable: ClusterUnavailable("etcd (cluster 'prod') did not answer within 5 s"),
    HostOwnedElsewhere: HostOwnedElsewhere("docs.example", "p2", "url", "p1"),
    CannotPromote: CannotPromote(),
    DigestOffsetPassed: DigestOffsetPassed(3, "asked for offset 3, already at 5"),
    OffsetNotReached: OffsetNotReached(9, 5, 1.0),
    BackupInProgress: BackupInProgress("a backup of this node is already running"),
    BackupFailed: BackupFailed(OSError("disk on fire")),
    ReplicationRefused: ReplicationRefused("this node is not a writable primary"),
    SteppedDownForPeer: SteppedDownForPeer(7, "peer 'b' has epoch 7 > ours 6"),
    NoLongerPrimary: NoLongerPrimary(),
    BacklogLost: BacklogLost("offset 4 was trimmed"),
    MalformedRequest: MalformedRequest("pagesift.v1.GetJobRequest"),
    KeyRequired: KeyRequired("/pagesift.v1.JobService/GetJob", "no key", C.UNAUTHENTICATED),
    AdminKeyRequired: AdminKeyRequired("/pagesift.v1.AdminService/Role", "no", C.PERMISSION_DENIED),
    ReplicationNotAllowed: ReplicationNotAllowed(
        "/pagesift.v1.ReplicationService/Stream", "no token", C.UNAUTHENTICATED
    ),
}


def test_every_reason_has_exactly_one_row() -> None:
    assert sorted(row.reason for row in TABLE) == sorted(Reason)


def test_every_row_maps_an_exception_so_no_refusal_is_built_by_hand() -> None:
    assert [row.reason for row in TABLE if not row.raised_by or row.build is None] == []


def test_every_mapped_exception_becomes_its_rows_reason_code_and_documented_keys() -> None:
    assert set(SAMPLES) == set(HANDLED), "a mapped exception without a sample here"
    for kind, exc in SAMPLES.items():
        row = row_for(exc)
        assert row is not None and kind in row.raised_by
        code, reason, refusal = refusal_of(exc, FACTS)
        assert reason == row.reason, kind
        assert code in row.codes, (kind, code)
        for key in refusal.metadata:
            assert f"`{key}`" in row.metadata, (reason, key)
        if code == C.INVALID_ARGUMENT:  # every INVALID_ARGUMENT names its fields
            kinds = [type(d) for d in refusal.details]
            assert error_details_pb2.BadRequest in kinds, reason


def test_the_most_specific_class_wins() -> None:
    assert refusal_of(Fenced("x"), FACTS)[1] == Reason.FENCED
    assert refusal_of(NotWritable("x"), FACTS)[1] == Reason.NOT_PRIMARY
    _, _, standby = refusal_of(StandbyNode(), FACTS)
    assert dict(standby.metadata) == {"primary": "10.0.0.1:50051", "hint": FACTS.primary_hint}
    with pytest.raises(KeyError):
        refusal_of(ValueError("not mapped"), FACTS)


def test_a_limit_names_the_caller_and_when_it_resets() -> None:
    exc = quota.LimitExceeded("pages_per_day", "over", FACTS.now + 60)
    _, _, refusal = refusal_of(exc, FACTS)
    failure, retry = refusal.details
    assert isinstance(failure, error_details_pb2.QuotaFailure)
    assert failure.violations[0].subject == "account:acme"
    assert isinstance(retry, error_details_pb2.RetryInfo)
    assert retry.retry_delay.seconds == 60
    assert ("pagesift-limit", "pages_per_day") in refusal.trailing


def test_a_page_error_takes_the_status_of_its_code() -> None:
    page = PageError(ErrorCode.HTTP_STATUS, "gone", status=404)
    code, reason, refusal = refusal_of(PageFailed(page, "http://x/a"), FACTS)
    assert (code, reason) == (C.NOT_FOUND, Reason.PAGE_FETCH_FAILED)
    assert refusal.metadata["url"] == "http://x/a"
    assert ("pagesift-error-code", "http_status") in refusal.trailing


def test_the_docs_reason_table_is_the_generated_one() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [
        (path, body)
        for path in docs
        if path.exists()
        for body in re.findall(
            r"<!-- reason-table:begin -->\n(.*?)<!-- reason-table:end -->",
            path.read_text(),
            re.DOTALL,
        )
    ]
    assert len(found) == 1, "the docs need one reason-table:begin/end marker pair"
    assert found[0][1] == reason_table_markdown(), (
        f"{found[0][0].name}'s reason table is stale: paste "
        "pagesift.core.api.errortable.reason_table_markdown()"
    )


def test_no_handler_recovers_a_field_by_splitting_a_message() -> None:
    for path in (ROOT / "shared" / "pagesift" / "shared").rglob("*.py"):
        assert 'str(e).split(":"' not in path.read_text(), path.name


# ---------------------------------------------------------------- one call per request kind

CONFIG = ServerConfig(allow_private_networks=True, max_crawl_limit=100, default_crawl_limit=50)
PLAIN = Permissions(Account("plain", max_crawl_limit=20), can_sign_webhooks=True)


async def test_a_crawl_spec_carries_the_effective_limit_and_the_merged_webhook() -> None:
    hook = jobs_pb2.Webhook(
        url="http://127.0.0.1:9/hook",
        events=["completed"],
        event_types=[jobs_pb2.WEBHOOK_EVENT_STARTED],
    )
    spec = await crawl(
        jobs_pb2.StartCrawlRequest(url="http://127.0.0.1:9/", webhook=hook), PLAIN, CONFIG
    )
    assert spec.limit == 20  # the default, capped at the account's max_crawl_limit
    assert spec.webhook is not None
    assert list(spec.webhook.events) == ["started", "completed"]
    assert not spec.webhook.event_types


async def test_every_bad_field_is_reported_and_the_first_leads() -> None:
    request = jobs_pb2.StartCrawlRequest(
        url="ftp://x/", limit=-1, delay=3600, options=jobs_pb2.ScrapeOptions(proxy_url="http://p/")
    )
    with pytest.raises(InvalidArgument) as info:
        await crawl(request, PLAIN, CONFIG)
    fields = [f for f, _ in info.value.violations]
    assert fields == ["url", "limit", "delay"]  # the permission waits for valid fields
    assert str(info.value).startswith("url: ")
    assert all(f in str(info.value) for f in fields)


async def test_a_permission_is_refused_once_every_field_is_valid() -> None:
    options = jobs_pb2.ScrapeOptions(proxy_url="http://p/", ignore_robots_txt=True)
    with pytest.raises(PermissionDenied) as info:
        await scrape(
            jobs_pb2.ScrapeRequest(url="http://127.0.0.1:9/", options=options), PLAIN, CONFIG
        )
    assert info.value.field == "options.proxy_url"
    no_secret = Permissions(PLAIN.account, can_sign_webhooks=False)
    hooked = jobs_pb2.StartCrawlRequest(
        url="http://127.0.0.1:9/", webhook=jobs_pb2.Webhook(url="http://127.0.0.1:9/h")
    )
    with pytest.raises(WebhookSecretMissing):
        await crawl(hooked, no_secret, CONFIG)
    hooked.limit = -1  # a bad field outranks the missing secret
    with pytest.raises(InvalidArgument):
        await crawl(hooked, no_secret, CONFIG)


async def test_the_api_sends_every_bad_field_in_one_bad_request(tmp_path: Path) -> None:
    async with in_process_node(tmp_path) as node:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url="http://127.0.0.1:9/", max_depth=-1, delay=61)
            )
        err: Any = e.value
        assert err.code() == C.INVALID_ARGUMENT
        assert err.details().startswith("max_depth: -1 is outside")
        status = status_of(err)
        (info,) = details_of(status, error_details_pb2.ErrorInfo)
        assert (info.reason, info.metadata["field"]) == (Reason.INVALID_FIELD, "max_depth")
        (bad,) = details_of(status, error_details_pb2.BadRequest)
        assert [v.field for v in bad.field_violations] == ["max_depth", "delay"]
        assert list(node.node.store().replicated_items()) == []  # nothing was written
