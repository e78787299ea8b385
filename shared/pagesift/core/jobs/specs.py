"""Request specs: one validation call per request kind, returning what the handler registers.

What it owns: ``scrape``, ``batch``, ``crawl`` and ``map_spec`` each take a request
and the caller's ``Permissions`` (the account, its limits and what it may use) and
return a typed spec (the validated request plus what was derived from it: the URLs
kept, the effective crawl limit, the webhook as registered), or raise. The field
rules are ``pagesift.core.jobs.validate``'s; this module only runs them, in the order
a request's fields are documented, and gathers what they refuse.

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

from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quota, records, renderoptions, urls, validate
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.validate import InvalidArgument, PermissionDenied
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
    urls: list[str]  # the valid URLs, in order (the handler empties it once stored)
    invalid: list[str]  # those skipped (``ignore_invalid_urls``), listed back
    webhook: jobs_pb2.Webhook | None


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
    limit: int  # the effective page limit (``quota.crawl_limit_for``)
    webhook: jobs_pb2.Webhook | None


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
    kept: tuple[list[str], list[str]] = ([], [])
    if counted:
        with v:
            kept = await _batch_urls(req, config)
    with v:
        await validate.request_control(req.options, caller.account, config)
    hook: jobs_pb2.Webhook | None = None
    with v:
        hook = await webhook(req.webhook, config)
    v.settle()
    _can_render(req.options, config, renders)
    _can_sign(hook, caller)
    return BatchSpec(urls=kept[0], invalid=kept[1], webhook=hook)


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
    kept: tuple[list[str], list[str]] = ([], [])
    with v:
        _batch_size(req, config)
        kept = await _batch_urls(req, config)
    if req.HasField("options") and req.options != job.options:
        with v:
            raise InvalidArgument("options", _NOT_THE_JOBS.format("scrape options"))
    if req.max_concurrency and req.max_concurrency != job.max_concurrency:
        with v:
            raise InvalidArgument("max_concurrency", _NOT_THE_JOBS.format("max_concurrency"))
    v.settle()
    digest = records.request_hash("append", req.SerializeToString(deterministic=True))
    return AppendSpec(req.id, caller.account.name, *kept, req.idempotency_key, digest)


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
    return CrawlSpec(limit=limit, webhook=hook)


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


async def _batch_urls(req: _Batch, config: ServerConfig) -> tuple[list[str], list[str]]:
    """(the valid URLs, the invalid ones) of a batch, each bad URL a violation of its
    own (``urls[3]``) unless ``ignore_invalid_urls`` skips them. The address guard
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
                checked_hosts[origin] = await urls.blocked_reason(u)
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
    keep = [u for i, u in enumerate(req.urls) if i not in problems]
    if not keep:
        raise InvalidArgument("urls", "no valid URL left after skipping the invalid ones")
    return keep, [req.urls[i] for i in bad]


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
    if not hook.event_types:
        return hook
    names: list[str] = []
    for i, kind in enumerate(hook.event_types):
        name = records.event_name(kind)
        if not name:
            raise InvalidArgument(f"webhook.event_types[{i}]", f"not a webhook event: {kind}")
        if firecrawl and name == "page_failed":
            raise InvalidArgument(f"webhook.event_types[{i}]", _NO_FIRECRAWL_EVENT)
        names.append(name)
    merged = jobs_pb2.Webhook()
    merged.CopyFrom(hook)
    merged.ClearField("event_types")
    merged.events[:] = list(records.webhook_events([*hook.events, *names]))
    return merged
