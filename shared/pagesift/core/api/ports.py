"""What ``JobService`` needs from the node it runs in: the ports it is wired through.

The service is served by both roles and knows neither: it sees the running node
through ``Node`` (its config, store, events, accounts, metrics, whether it renders, and
the job runtime when it is the primary) and the primary's runtime through
``JobRuntime``. ``pagesift.node.node.Node`` and ``pagesift.primary.jobs.runtime.Jobs``
implement them; tests implement them with fakes. Keeping the ports apart keeps the
service's imports to the shared packages (``tests/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pagesift.core.api.metrics import Metrics
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import records
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.jobs.events import JobEvents
from pagesift.core.jobs.specs import AppendSpec, JobSpec
from pagesift.core.store.db import Store
from pagesift.v1 import jobs_pb2


class Registration(Protocol):
    id: str
    created: bool


@dataclass(frozen=True)
class AccountActivity:
    """What the primary's runtime knows of one account now (``GetAccountUsage``)."""

    jobs: tuple[records.JobMeta, ...]  # its jobs not finished (running, waiting, paused)
    in_flight: Mapping[str, int]  # job id -> its pages being fetched now
    scrapes_in_flight: int  # Scrape calls being fetched now
    last_page_ms: int  # its most recent successful page on this primary (0: none)


class Appended(Protocol):
    """What an append did (``pagesift.primary.jobs.appending.Appended``)."""

    @property
    def first(self) -> int: ...
    @property
    def added(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def reopened(self) -> bool: ...


class JobRuntime(Protocol):
    """What the service needs from the primary's job runtime."""

    async def register(
        self, spec: JobSpec, owner: str, *, check: Callable[[], None] | None = None
    ) -> Registration:
        """Store the job ``spec`` (as validated) for ``owner`` and start it, ``check``
        inside the write section before any write."""

    async def append(self, spec: AppendSpec, check: Callable[[int, bool], None]) -> Appended | None:
        """AppendBatchScrape in one group, ``check(total_after, running)`` inside it
        before any write (None: no such job of the owner's)."""

    async def cancel(self, job_id: str) -> records.JobMeta | None: ...

    async def resume(self, job_id: str) -> records.JobMeta | None: ...

    def visible(self, job_id: str) -> int | None: ...

    async def readable(self) -> None: ...

    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions, owner: str
    ) -> jobs_pb2.Document:
        """One page for ``owner``, charged to its daily pages with the page (raises
        ``quota.LimitExceeded`` when a concurrent call spent the last one)."""

    async def map(self, request: jobs_pb2.MapRequest, owner: str) -> list[str]: ...

    async def crawl_options(
        self, url: str, prompt: str, owner: str
    ) -> tuple[jobs_pb2.StartCrawlRequest, jobs_pb2.ModelUsage]:
        """The crawl options ``prompt`` describes, from the model; raises
        ``ModelUnanswered`` or ``quota.LimitExceeded`` (the day's model tokens)."""
        ...

    def activity(self, owner: str) -> AccountActivity:
        """``owner``'s unfinished jobs and pages in flight, read without a write."""


class Node(Protocol):
    """The running node as the API sees it; its role may change while it runs."""

    config: ServerConfig
    events: JobEvents
    accounts: Accounts
    metrics: Metrics

    def store(self) -> Store: ...

    def runtime(self) -> JobRuntime | None:
        """The job runtime when this node is the primary, else None."""

    def visible(self, job_id: str) -> int | None:
        """How many of the job's pages reads may show (None: all that are stored): the
        runtime's sync-mode caps, kept after its jobs stopped until this node runs a
        new runtime or follows a primary (stored pages past them were never confirmed
        by a standby and may be rolled back)."""

    def primary_hint(self) -> str:
        """Where the writes go, for a standby's NOT_PRIMARY message (an address, or
        an address followed by words, or "(unknown)")."""

    def read_metadata(self) -> Sequence[tuple[str, str]]:
        """Trailing metadata for reads (a standby's applied offset and lag)."""

    @property
    def can_render(self) -> bool:
        """Whether this node renders pages (requests that need a browser are refused
        with RENDERING_UNAVAILABLE otherwise)."""
