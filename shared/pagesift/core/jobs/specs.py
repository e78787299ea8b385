"""Request specs: one validation call per request kind, returning what the handler registers.

What it owns: ``scrape``, ``batch``, ``crawl`` and ``map_spec`` each take a request
and the caller's ``Permissions`` (the account, its limits and what it may use) and
return a typed spec (the validated request plus what was derived from it: the URLs
kept, the effective crawl limit, the webhook as registered), or raise. The field
rules are ``pagesift.core.jobs.validate``'s; this module only runs them, in the order
a request's fields are documented, and gathers what they refuse.

A job's spec (``JobSpec``: ``BatchSpec`` or ``CrawlSpec``) carries everything its runs
need: the handler registers it (``encode``: the request key's bytes; its ``limit``:
the meta's, the one copy of the limit) and ``stored`` recovers it from what the
registration stored, parsing the request once per call and trusting it: no
validation rule runs again at run time, so a job runs as it was accepted whatever
the configuration of the node that runs it now (``CrawlSpec.scope``: its regexes
compiled under the bounds they were accepted within, ``scope.Scope.trusted``).

Invariants:
- every independent check runs, so one ``InvalidArgument`` carries every violation
  found (``InvalidArgument.combined``: the first leads the status message and the
  ErrorInfo; each is a BadRequest violation);
- a bad field outranks a permission: ``PermissionDenied`` (the first one) is raised
  only when no field is invalid, then ``RenderingUnavailable`` (the node cannot render:
  ``renders``, by default whether ``browser_executable`` is set) and
  ``WebhookSecretMissing`` only when the request is otherwise acceptable;
- nothing here writes: a refused request leaves the store untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar
from urllib.parse import urlsplit

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import (
    blockedaddresses,
    modelrequests,
    quota,
    records,
    renderoptions,
    urls,
    validate,
)
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.scope import Scope
from pagesift.core.jobs.validate import InvalidArgument, PermissionDenied
from pagesift.core.store.db import Store
from pagesift.v1 import jobs_pb2


class WebhookSecretMissing(Exception):
    """A job asks for webhooks but ``account`` has no ``webhook_secret`` to sign with."""

    def __init__(self, account: str) -> None:
        super().__init__(f"webhook: account {account!r} has no webhook_secret to sign with")
        self.account = account


@dataclass(frozen=True)
class Permissions:
    """What the caller may do: its account (limits, ``allow_proxy_url``,
    ``allow_ignore_robots``, ``allow_execute_javascript``) and whether it can sign
    webhooks."""

    account: Account
    can_sign_webhooks: bool


@dataclass(frozen=True)
class ScrapeSpec:
    url: str
    options: jobs_pb2.ScrapeOptions


@dataclass(frozen=True)
class BatchSpec:
    """A batch scrape as accepted: ``request`` as validated (recovered by ``stored``:
    as stored, its kept URLs only), ``skipped`` the indices of ``request.urls`` left
    out (``ignore_invalid_urls``; none once stored) and the webhook as registered.
    The options, concurrency and retries a run uses are the request's."""

    request: jobs_pb2.StartBatchScrapeRequest
    skipped: frozenset[int]
    webhook: jobs_pb2.Webhook | None
    kind: ClassVar[str] = "batch"
    limit: ClassVar[int] = 0  # a batch's pages are its URLs

    @property
    def options(self) -> jobs_pb2.ScrapeOptions:
        return self.request.options

    @property
    def total(self) -> int:
        """How many URLs the job starts with."""
        return len(self.request.urls) - len(self.skipped)

    def kept(self) -> Iterator[str]:
        """The URLs the job scrapes, in order."""
        for i, url in enumerate(self.request.urls):
            if i not in self.skipped:
                yield url

    @property
    def urls(self) -> list[str]:
        return list(self.kept())

    @property
    def invalid(self) -> list[str]:
        """The URLs skipped, in order (listed back to the caller)."""
        return [self.request.urls[i] for i in sorted(self.skipped)]

    def encode(self) -> bytes:
        """The request key's bytes: the request as sent when every URL is valid, else
        the same request with only the kept URLs, built without copying the sent URLs
        first (protobuf merges concatenated encodings, repeated fields appended)."""
        if not self.skipped:
            return self.request.SerializeToString(deterministic=True)
        rest = jobs_pb2.StartBatchScrapeRequest()
        for field, value in self.request.ListFields():
            if field.name == "urls":
                continue
            if hasattr(value, "extend"):  # a repeated field
                getattr(rest, field.name).extend(value)
            elif field.message_type is not None:
                getattr(rest, field.name).CopyFrom(value)
            else:
                setattr(rest, field.name, value)
        kept = jobs_pb2.StartBatchScrapeRequest(urls=self.kept())
        return rest.SerializeToString(deterministic=True) + kept.SerializeToString()


@dataclass(frozen=True)
class AppendSpec:
    """An AppendBatchScrape to make: the owner's job ``id`` takes ``urls`` (the valid
    ones, in order); ``key`` and ``digest`` (of the request) are its AIP-155 pair."""

    id: str
    owner: str
    urls: list[str]
    invalid: list[str]
    key: str
    digest: str


@dataclass(frozen=True)
class CrawlSpec:
    """A crawl as accepted: ``request`` as validated, ``limit`` the effective page
    limit (``quota.crawl_limit_for``; stored as the meta's ``limit``, recovered from
    it) and the webhook as registered."""

    request: jobs_pb2.StartCrawlRequest
    limit: int
    webhook: jobs_pb2.Webhook | None
    kind: ClassVar[str] = "crawl"
    total: ClassVar[int] = 0  # a crawl's pages are found as it runs

    @property
    def options(self) -> jobs_pb2.ScrapeOptions:
        return self.request.options

    def encode(self) -> bytes:
        """The request key's bytes (AIP-155 hashes them too)."""
        return self.request.SerializeToString(deterministic=True)

    async def scope(self, memory: int) -> Scope:
        """The crawl's scope, its regexes compiled as accepted (``Scope.trusted``;
        ``memory``: the run's RE2 budget per pattern)."""
        return await Scope.trusted(self.request, self.limit, memory)


JobSpec = BatchSpec | CrawlSpec


def stored(store: Store, meta: records.JobMeta) -> JobSpec:
    """The spec of a registered job, from what its registration stored: the request
    key (parsed here, once; the only parse of a job's request at run time) and the
    meta (its kind and limit). Trusted: it was validated when it was accepted."""
    raw = store.get(records.JobKeys(meta.id).request) or b""
    if meta.kind == "batch":
        batch = jobs_pb2.StartBatchScrapeRequest.FromString(raw)
        return BatchSpec(batch, frozenset(), registered_webhook(batch.webhook))
    crawl = jobs_pb2.StartCrawlRequest.FromString(raw)
    return CrawlSpec(crawl, meta.limit, registered_webhook(crawl.webhook))


@dataclass(frozen=True)
class MapSpec:
    request: jobs_pb2.MapRequest


class _Violations:
    """Gathers what the checks run under ``with violations:`` refuse (each block one
    independent check); ``settle`` raises them, bad fields first."""

    def __init__(self) -> None:
        self.invalid: list[InvalidArgument] = []
        self.denied: PermissionDenied | None = None

    def __enter__(self) -> _Violations:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if isinstance(exc, InvalidArgument):
            self.invalid.append(exc)
            return True
        if isinstance(exc, PermissionDenied):
            self.denied = self.denied or exc
            return True
        return False

    def settle(self) -> None:
        if self.invalid:
            raise InvalidArgument.combined(self.invalid)
        if self.denied is not None:
            raise self.denied


async def scrape(
    req: jobs_pb2.ScrapeRequest,
    caller: Permissions,
    config: ServerConfig,
    *,
    renders: bool | None = None,
) -> ScrapeSpec:
    v = _Violations()
    with v:
        await validate.url(req.url, "url", config)
    _options(v, req.options, caller, config)
    with v:
        await validate.request_control(req.options, caller.account, config)
    v.settle()
    _can_render(req.options, config, renders)
    return ScrapeSpec(url=req.url, options=req.options)


async def batch(
    req: jobs_pb2.StartBatchScrapeRequest,
    caller: Permissions,
    config: ServerConfig,
    *,
    renders: bool | None = None,
) -> BatchSpec:
    v = _Violations()
    counted = False
    with v:
        _batch_size(req, config)
        counted = True
    _options(v, req.options, caller, config)
    with v:
        validate.concurrency(req.max_concurrency, config)
    with v:
        validate.max_retries(req, config)
    skipped: frozenset[int] = frozenset()
    if counted:
        with v:
            skipped = frozenset(await _skipped_urls(req, config))
    with v:
        await validate.request_control(req.options, caller.account, config)
    hook: jobs_pb2.Webhook | None = None
    with v:
        hook = await webhook(req.webhook, config)
    v.settle()
    _can_render(req.options, config, renders)
    _can_sign(hook, caller)
    return BatchSpec(req, skipped, hook)


async def append(
    req: jobs_pb2.AppendBatchScrapeRequest,
    caller: Permissions,
    config: ServerConfig,
    job: jobs_pb2.StartBatchScrapeRequest,
) -> AppendSpec:
    """An append to the batch ``job`` (its stored request): its URLs as a start's
    (count, rules, address guard); ``options`` and ``max_concurrency``, when given,
    must be the job's own (the added URLs are scraped as the job's)."""
    v = _Violations()
    skipped: list[int] = []
    with v:
        _batch_size(req, config)
        skipped = await _skipped_urls(req, config)
    if req.HasField("options") and req.options != job.options:
        with v:
            raise InvalidArgument("options", _NOT_THE_JOBS.format("scrape options"))
    if req.max_concurrency and req.max_concurrency != job.max_concurrency:
        with v:
            raise InvalidArgument("max_concurrency", _NOT_THE_JOBS.format("max_concurrency"))
    v.settle()
    digest = records.request_hash("append", req.SerializeToString(deterministic=True))
    bad = set(skipped)
    kept = [u for i, u in enumerate(req.urls) if i not in bad]
    invalid = [req.urls[i] for i in skipped]
    return AppendSpec(req.id, caller.account.name, kept, invalid, req.idempotency_key, digest)


_NOT_THE_JOBS = (
    "an append is scraped with the job's own {}; these differ (leave them unset, or "
    "start a new batch)"
)


async def crawl(
    req: jobs_pb2.StartCrawlRequest,
    caller: Permissions,
    config: ServerConfig,
    *,
    renders: bool | None = None,
) -> CrawlSpec:
    v = _Violations()
    with v:
        await validate.url(req.url, "url", config)
    with v:
        validate.crawl_limit(req.limit, config)
    with v:
        validate.max_depth(req.max_depth)
    with v:
        await validate.path_filters(req, config)
    with v:
        validate.sitemap(req.sitemap)
    with v:
        validate.concurrency(req.max_concurrency, config)
    with v:
        validate.max_retries(req, config)
    with v:
        validate.delay(req.delay)
    _options(v, req.options, caller, config)
    with v:
        await validate.request_control(req.options, caller.account, config)
    hook: jobs_pb2.Webhook | None = None
    with v:
        hook = await webhook(req.webhook, config)
    v.settle()
    _can_render(req.options, config, renders)
    _can_sign(hook, caller)
    limit = quota.crawl_limit_for(caller.account, req.limit, config.default_crawl_limit)
    return CrawlSpec(req, limit, hook)


async def map_spec(req: jobs_pb2.MapRequest, caller: Permissions, config: ServerConfig) -> MapSpec:
    """A Map call: the URL (and the address guard), the limit, the search text, the
    regexes (as a crawl's) and the sitemap mode. It has no request control, so the
    caller's permissions decide nothing yet."""
    v = _Violations()
    with v:
        await validate.url(req.url, "url", config)
    with v:
        validate.map_limit(req.limit, config)
    with v:
        validate.search(req.search)
    with v:
        await validate.path_filters(req, config)
    with v:
        validate.sitemap(req.sitemap)
    v.settle()
    return MapSpec(request=req)


def _options(
    v: _Violations, opts: jobs_pb2.ScrapeOptions, caller: Permissions, config: ServerConfig
) -> None:
    """What shapes the document (``validate.options``), the rendering options
    (``rendering.check``) and who may run JavaScript; request control is apart."""
    with v:
        validate.options(opts, config)
    with v:
        renderoptions.check(opts, config)
    with v:
        renderoptions.permissions(opts, caller.account)
    with v:
        modelrequests.check(opts, config)
    with v:
        modelrequests.permission(opts, caller.account)


def _can_render(opts: jobs_pb2.ScrapeOptions, config: ServerConfig, renders: bool | None) -> None:
    """``RenderingUnavailable`` when the request needs a browser and the node has none
    (``renders``: the node's own word; None: ``browser_executable`` is set)."""
    can = bool(config.browser_executable) if renders is None else renders
    refusal = renderoptions.unavailable(opts, can)
    if refusal is not None:
        raise refusal


def _can_sign(hook: jobs_pb2.Webhook | None, caller: Permissions) -> None:
    if hook is not None and not caller.can_sign_webhooks:
        raise WebhookSecretMissing(caller.account.name)


_Batch = jobs_pb2.StartBatchScrapeRequest | jobs_pb2.AppendBatchScrapeRequest


def _batch_size(req: _Batch, config: ServerConfig) -> None:
    if not req.urls:
        raise InvalidArgument("urls", "must list at least one URL")
    if len(req.urls) > config.max_batch_urls:
        raise InvalidArgument(
            "urls", f"{len(req.urls)} URLs exceed the cap of {config.max_batch_urls}"
        )


async def _skipped_urls(req: _Batch, config: ServerConfig) -> list[int]:
    """The indices of a batch's invalid URLs, in order, each bad URL a violation of
    its own (``urls[3]``) unless ``ignore_invalid_urls`` skips them. The address guard
    resolves each origin once."""
    bad: list[int] = []
    problems: dict[int, str] = {}
    blocked: set[int] = set()  # refused by the address guard (BLOCKED_ADDRESS)
    checked_hosts: dict[str, str | None] = {}
    for i, u in enumerate(req.urls):
        problem = urls.validate(u, config.max_url_length)
        if problem is None and not config.allow_private_networks:
            origin = urlsplit(u).netloc.lower()
            if origin not in checked_hosts:
                checked_hosts[origin] = await blockedaddresses.blocked_reason(u)
            reason = checked_hosts[origin]
            problem = f"refused: {reason}" if reason else None
            if reason:
                blocked.add(i)
        if problem is not None:
            bad.append(i)
            problems[i] = problem
    if bad and not req.ignore_invalid_urls:
        shown = "; ".join(f"urls[{i}]: {problems[i]}" for i in bad[:10])
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        err = InvalidArgument(
            "urls",
            f"invalid URLs at indices {bad[:50]}{more}: {shown}",
            [(f"urls[{i}]", problems[i]) for i in bad[:100]],
        )
        err.causes = [validate.BLOCKED_ADDRESS if i in blocked else "" for i in bad[:100]]
        raise err
    if len(bad) == len(req.urls):
        raise InvalidArgument("urls", "no valid URL left after skipping the invalid ones")
    return bad


_NO_FIRECRAWL_EVENT = "page_failed has no Firecrawl-shaped event (WEBHOOK_FORMAT_FIRECRAWL)"
FIRECRAWL_SIGNATURE = "x-firecrawl-signature"  # a Firecrawl-shaped delivery's own header


def _firecrawl_headers(hook: jobs_pb2.Webhook) -> None:
    for name in hook.headers:
        if name.lower() == FIRECRAWL_SIGNATURE:
            raise InvalidArgument(
                f"webhook.headers[{name!r}]", "the webhook signature scheme sets it"
            )


async def webhook(hook: jobs_pb2.Webhook, config: ServerConfig) -> jobs_pb2.Webhook | None:
    """The webhook to register (``event_types`` merged into ``events``), or None when
    the request asks for none; ``InvalidArgument`` naming the first bad field."""
    if not hook.url:
        wants = hook.events or hook.event_types or hook.headers or hook.metadata or hook.format
        if wants or hook.include_document:  # something to deliver, nowhere to send it
            raise InvalidArgument("webhook.url", "missing")
        return None
    await validate.url(hook.url, "webhook.url", config)
    validate.webhook_payload(hook)
    if hook.format not in jobs_pb2.WebhookFormat.values():
        raise InvalidArgument("webhook.format", f"unknown webhook format {hook.format}")
    firecrawl = hook.format == jobs_pb2.WEBHOOK_FORMAT_FIRECRAWL
    if firecrawl:
        _firecrawl_headers(hook)
    for i, event in enumerate(hook.events):
        if event not in records.WEBHOOK_EVENTS:
            raise InvalidArgument(
                f"webhook.events[{i}]",
                f"unknown event {event!r} (one of {', '.join(records.WEBHOOK_EVENTS)})",
            )
        if firecrawl and event == "page_failed":
            raise InvalidArgument(f"webhook.events[{i}]", _NO_FIRECRAWL_EVENT)
    for i, kind in enumerate(hook.event_types):
        name = records.event_name(kind)
        if not name:
            raise InvalidArgument(f"webhook.event_types[{i}]", f"not a webhook event: {kind}")
        if firecrawl and name == "page_failed":
            raise InvalidArgument(f"webhook.event_types[{i}]", _NO_FIRECRAWL_EVENT)
    return registered_webhook(hook)


def registered_webhook(hook: jobs_pb2.Webhook) -> jobs_pb2.Webhook | None:
    """The webhook an accepted request registers (None: it asks for none), with its
    ``event_types`` merged into ``events``. Pure, no rule checked: ``webhook`` checks
    them first, ``stored`` derives a stored job's from its request."""
    if not hook.url:
        return None
    if not hook.event_types:
        return hook
    names = [records.event_name(kind) for kind in hook.event_types]
    merged = jobs_pb2.Webhook()
    merged.CopyFrom(hook)
    merged.ClearField("event_types")
    merged.events[:] = list(records.webhook_events([*hook.events, *filter(None, names)]))
    return merged
