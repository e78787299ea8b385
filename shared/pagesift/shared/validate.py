"""Request validation: every bad field becomes INVALID_ARGUMENT naming the field.

Validation runs before anything is written, so a rejected request leaves nothing
half-created in the store. The checks that need the network (the address guard
resolves host names) are async; the rest are pure.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from selectolax.lexbor import LexborHTMLParser

from pagesift.shared import patterns, urls
from pagesift.shared.accounts import Account
from pagesift.shared.config import ServerConfig
from pagesift.v1 import jobs_pb2


class InvalidArgument(ValueError):
    """A request field that cannot be accepted; ``str()`` names the field.

    ``violations`` are the ``(field path, description)`` pairs for the status's
    ``BadRequest`` details: this one field, or each bad element (``urls[3]``...)."""

    def __init__(
        self, field: str, message: str, violations: Sequence[tuple[str, str]] = ()
    ) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.violations: list[tuple[str, str]] = list(violations) or [(field, message)]


class PermissionDenied(Exception):
    """A request field the caller's account may not use; ``str()`` names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def job_id(value: str, field: str = "id") -> str:
    try:
        uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"{value[:64]!r} is not a job id") from None
    return value


async def _guard(url: str, field: str, config: ServerConfig) -> None:
    if config.allow_private_networks:
        return
    reason = await urls.blocked_reason(url)
    if reason is not None:
        raise InvalidArgument(field, f"{url[:200]} is refused: {reason}")


async def url(value: str, field: str, config: ServerConfig) -> str:
    problem = urls.validate(value, config.max_url_length)
    if problem is not None:
        raise InvalidArgument(field, problem)
    await _guard(value, field, config)
    return value


def options(opts: jobs_pb2.ScrapeOptions, config: ServerConfig, field: str = "options") -> None:
    """What shapes the document (formats, max_pages); request control is
    ``request_control``'s."""
    for i, f in enumerate(opts.formats):
        if f not in jobs_pb2.Format.values() or f == jobs_pb2.FORMAT_UNSPECIFIED:
            raise InvalidArgument(f"{field}.formats[{i}]", f"unknown format {f}")
    tag_selectors(opts, field)
    if opts.HasField("max_age"):
        age = opts.max_age.seconds + opts.max_age.nanos / 1e9
        if not 0 <= age <= config.page_cache_ttl:
            raise InvalidArgument(
                f"{field}.max_age",
                f"{age:g} s is outside 0..{config.page_cache_ttl:g} (page_cache_ttl)",
            )
    if opts.change_tracking_diff and jobs_pb2.FORMAT_CHANGE_TRACKING not in opts.formats:
        raise InvalidArgument(
            f"{field}.change_tracking_diff", "needs FORMAT_CHANGE_TRACKING in formats"
        )
    if not 0 <= opts.max_pages <= config.max_document_pages:
        raise InvalidArgument(
            f"{field}.max_pages",
            f"{opts.max_pages} is outside 0..{config.max_document_pages} (0 = the server's max)",
        )


MAX_TAG_SELECTORS = 50  # per list (include_tags, exclude_tags)
MAX_TAG_SELECTOR_LENGTH = 256  # characters
_SELECTOR_PROBE = LexborHTMLParser("<p></p>")


def tag_selectors(opts: jobs_pb2.ScrapeOptions, field: str = "options") -> None:
    """``include_tags``/``exclude_tags``: bounded in count and length, and each a CSS
    selector selectolax (the extractor's parser) can parse."""
    for name, selectors in (
        ("include_tags", opts.include_tags),
        ("exclude_tags", opts.exclude_tags),
    ):
        if len(selectors) > MAX_TAG_SELECTORS:
            raise InvalidArgument(
                f"{field}.{name}", f"{len(selectors)} selectors, at most {MAX_TAG_SELECTORS}"
            )
        for i, selector in enumerate(selectors):
            where = f"{field}.{name}[{i}]"
            if len(selector) > MAX_TAG_SELECTOR_LENGTH:
                raise InvalidArgument(
                    where, f"{len(selector)} characters, at most {MAX_TAG_SELECTOR_LENGTH}"
                )
            try:
                _SELECTOR_PROBE.css(selector)
            except Exception:  # selectolax raises SelectolaxError (a ValueError) today
                raise InvalidArgument(
                    where, f"{selector[:64]!r} is not a CSS selector selectolax can parse"
                ) from None


# Request headers a job may not set (lowercase): hop-by-hop and framing headers (RFC 9110
# 7.6.1, RFC 9112) and what the proxy layer owns; Accept-Encoding (the engine decodes
# only what it announces); and two with a field of their own.
DENIED_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive",
    "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer",
    "upgrade", "expect", "accept-encoding", "http2-settings", "cookie", "user-agent",
})  # fmt: skip
_HEADER_FIELDS = {"cookie": "cookies", "user-agent": "user_agent"}
MAX_HEADERS = 50
MAX_HEADER_BYTES = 16 * 1024  # every name and value together
MAX_COOKIES = 50
MAX_USER_AGENT = 512
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_COOKIE_VALUE = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*")  # RFC 6265 cookie-octet
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # no CR, LF, NUL or other controls


def headers(
    values: Mapping[str, str],
    field: str,
    *,
    hints: Mapping[str, str] | None = None,
    reserved: Callable[[str], str | None] | None = None,
) -> None:
    """Headers a job has sent (``field`` names the map, e.g. ``options.headers``): at
    most ``MAX_HEADERS``, ``MAX_HEADER_BYTES`` together, RFC 9110 token names, values
    without control characters, none of ``DENIED_HEADERS`` (``hints``: lowercase name
    -> what to use instead) and none ``reserved(lowercase name)`` gives a reason for."""
    if len(values) > MAX_HEADERS:
        raise InvalidArgument(field, f"{len(values)} headers, at most {MAX_HEADERS}")
    size = 0
    for name, value in sorted(values.items()):
        where = f"{field}[{name[:64]!r}]"
        if not _TOKEN.fullmatch(name):
            raise InvalidArgument(where, "not a valid header name")
        if name.lower() in DENIED_HEADERS:
            hint = (hints or {}).get(name.lower(), "a hop-by-hop or framing header")
            raise InvalidArgument(where, f"{name} may not be set by a job ({hint})")
        why = reserved(name.lower()) if reserved is not None else None
        if why is not None:
            raise InvalidArgument(where, f"{name} may not be set ({why})")
        if not _FIELD_VALUE.fullmatch(value):
            raise InvalidArgument(where, "the value holds a control character (CR, LF, NUL...)")
        size += len(name) + len(value.encode())
    if size > MAX_HEADER_BYTES:
        raise InvalidArgument(field, f"{size} bytes, at most {MAX_HEADER_BYTES}")


async def request_control(
    opts: jobs_pb2.ScrapeOptions, account: Account, config: ServerConfig, field: str = "options"
) -> None:
    """The request-control options of ``opts`` (headers, cookies, user agent, timeout,
    proxy, robots): INVALID_ARGUMENT naming the field for a bad value,
    ``PermissionDenied`` for what ``account`` may not use."""
    hints = {name: f"use {field}.{instead}" for name, instead in _HEADER_FIELDS.items()}
    headers(opts.headers, f"{field}.headers", hints=hints)
    if len(opts.cookies) > MAX_COOKIES:
        raise InvalidArgument(
            f"{field}.cookies", f"{len(opts.cookies)} cookies, at most {MAX_COOKIES}"
        )
    for name, value in sorted(opts.cookies.items()):
        where = f"{field}.cookies[{name[:64]!r}]"
        if not _TOKEN.fullmatch(name):
            raise InvalidArgument(where, "not a valid cookie name")
        if len(value) > 4096 or not _COOKIE_VALUE.fullmatch(value):
            raise InvalidArgument(
                where, "not a valid cookie value (RFC 6265 cookie-octets, <= 4096)"
            )
    agent = opts.user_agent
    if len(agent) > MAX_USER_AGENT or not _FIELD_VALUE.fullmatch(agent) or agent != agent.strip():
        raise InvalidArgument(
            f"{field}.user_agent", f"at most {MAX_USER_AGENT} printable characters, no edge spaces"
        )
    if opts.HasField("timeout"):
        seconds = opts.timeout.seconds + opts.timeout.nanos / 1e9
        if not 0 < seconds <= config.max_request_timeout:
            raise InvalidArgument(
                f"{field}.timeout",
                f"{seconds:g} s is outside (0, {config.max_request_timeout:g}] "
                "(max_request_timeout; unset = the server's timeouts)",
            )
    if opts.proxy and opts.proxy != "pool" and opts.proxy not in config.proxies:
        known = ", ".join(sorted(config.proxies)) or "none"
        raise InvalidArgument(
            f"{field}.proxy", f"no proxy {opts.proxy[:64]!r} (the server has: {known})"
        )
    if opts.proxy == "pool" and not config.proxies:
        raise InvalidArgument(f"{field}.proxy", "the server has no proxy pool")
    if opts.proxy_url:
        if not account.allow_proxy_url:
            raise PermissionDenied(
                f"{field}.proxy_url", f"account {account.name!r} may not use its own proxy"
            )
        bare = urls.strip_userinfo(opts.proxy_url)  # credentials are the proxy's own
        problem = urls.validate(bare, config.max_url_length)
        if problem is not None:
            raise InvalidArgument(f"{field}.proxy_url", problem)
        await _guard(bare, f"{field}.proxy_url", config)
    if opts.ignore_robots_txt and not account.allow_ignore_robots:
        raise PermissionDenied(
            f"{field}.ignore_robots_txt", f"account {account.name!r} may not ignore robots.txt"
        )


# Headers of a webhook delivery the signature scheme owns (lowercase); every
# ``pagesift-`` header is the sender's too (event, delivery, event id, timestamp,
# signature, and whatever comes next).
WEBHOOK_OWNED_HEADERS = frozenset({"content-type"})
WEBHOOK_HEADER_PREFIX = "pagesift-"
MAX_WEBHOOK_METADATA = 50  # keys
MAX_WEBHOOK_METADATA_KEY = 128  # characters
MAX_WEBHOOK_METADATA_VALUE = 2048  # characters
MAX_WEBHOOK_METADATA_BYTES = 16 * 1024  # every key and value together, UTF-8


def _webhook_owned(name: str) -> str | None:
    if name in WEBHOOK_OWNED_HEADERS or name.startswith(WEBHOOK_HEADER_PREFIX):
        return "the webhook signature scheme sets it"
    return None


def webhook_payload(hook: jobs_pb2.Webhook, field: str = "webhook") -> None:
    """A webhook's ``headers`` (``headers``' rules, and none the signature scheme owns:
    Content-Type, pagesift-*) and ``metadata`` (bounded in keys, lengths and bytes;
    keys without control characters): INVALID_ARGUMENT naming the field."""
    hints = {"cookie": "not sent with deliveries", "user-agent": "the sender's own"}
    headers(hook.headers, f"{field}.headers", hints=hints, reserved=_webhook_owned)
    meta = hook.metadata
    if len(meta) > MAX_WEBHOOK_METADATA:
        raise InvalidArgument(
            f"{field}.metadata", f"{len(meta)} keys, at most {MAX_WEBHOOK_METADATA}"
        )
    size = 0
    for key, value in sorted(meta.items()):
        where = f"{field}.metadata[{key[:64]!r}]"
        if not 0 < len(key) <= MAX_WEBHOOK_METADATA_KEY or not key.isprintable():
            raise InvalidArgument(
                where, f"a key is 1..{MAX_WEBHOOK_METADATA_KEY} characters, none a control one"
            )
        if len(value) > MAX_WEBHOOK_METADATA_VALUE:
            raise InvalidArgument(
                where, f"{len(value)} characters, at most {MAX_WEBHOOK_METADATA_VALUE}"
            )
        size += len(key.encode()) + len(value.encode())
    if size > MAX_WEBHOOK_METADATA_BYTES:
        raise InvalidArgument(
            f"{field}.metadata", f"{size} bytes, at most {MAX_WEBHOOK_METADATA_BYTES}"
        )


def concurrency(value: int, config: ServerConfig) -> None:
    if value < 0 or value > config.max_concurrency:
        raise InvalidArgument(
            "max_concurrency", f"{value} is outside 0..{config.max_concurrency} (0 = default)"
        )


def max_retries(
    req: jobs_pb2.StartBatchScrapeRequest | jobs_pb2.StartCrawlRequest, config: ServerConfig
) -> None:
    if req.HasField("max_retries") and not 0 <= req.max_retries <= config.max_retries_limit:
        raise InvalidArgument(
            "max_retries",
            f"{req.max_retries} is outside 0..{config.max_retries_limit} (unset = server default)",
        )


@dataclass
class BatchPlan:
    urls: list[str]
    invalid: list[str]


async def batch(req: jobs_pb2.StartBatchScrapeRequest, config: ServerConfig) -> BatchPlan:
    if not req.urls:
        raise InvalidArgument("urls", "must list at least one URL")
    if len(req.urls) > config.max_batch_urls:
        raise InvalidArgument(
            "urls", f"{len(req.urls)} URLs exceed the cap of {config.max_batch_urls}"
        )
    options(req.options, config)
    concurrency(req.max_concurrency, config)
    max_retries(req, config)
    bad: list[int] = []
    problems: dict[int, str] = {}
    checked_hosts: dict[str, str | None] = {}
    for i, u in enumerate(req.urls):
        problem = urls.validate(u, config.max_url_length)
        if problem is None and not config.allow_private_networks:
            origin = urlsplit(u).netloc.lower()
            if origin not in checked_hosts:
                checked_hosts[origin] = await urls.blocked_reason(u)
            reason = checked_hosts[origin]
            problem = f"refused: {reason}" if reason else None
        if problem is not None:
            bad.append(i)
            problems[i] = problem
    if bad and not req.ignore_invalid_urls:
        shown = "; ".join(f"urls[{i}]: {problems[i]}" for i in bad[:10])
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise InvalidArgument(
            "urls",
            f"invalid URLs at indices {bad[:50]}{more}: {shown}",
            [(f"urls[{i}]", problems[i]) for i in bad[:100]],
        )
    keep = [u for i, u in enumerate(req.urls) if i not in problems]
    if not keep:
        raise InvalidArgument("urls", "no valid URL left after skipping the invalid ones")
    return BatchPlan(urls=keep, invalid=[req.urls[i] for i in bad])


def regex_limits(config: ServerConfig) -> patterns.Limits:
    """The bounds on a crawl's ``include_paths``/``exclude_paths`` (each list)."""
    return patterns.Limits(
        count=config.max_regexes, length=config.max_regex_length, memory=config.max_regex_memory
    )


async def path_filters_and_sitemap(
    req: jobs_pb2.StartCrawlRequest | jobs_pb2.MapRequest, config: ServerConfig
) -> None:
    """``include_paths``/``exclude_paths`` (bounded, then compiled by RE2 on the pattern
    pool, off the event loop) and the ``sitemap`` mode of a crawl or a Map call."""
    try:
        await patterns.compile_filter(req.include_paths, req.exclude_paths, regex_limits(config))
    except patterns.PatternError as e:
        field = f"{e.which}_paths" + ("" if e.index is None else f"[{e.index}]")
        raise InvalidArgument(field, e.reason) from None
    if req.sitemap not in jobs_pb2.SitemapMode.values():
        raise InvalidArgument("sitemap", f"unknown sitemap mode {req.sitemap}")


async def crawl(req: jobs_pb2.StartCrawlRequest, config: ServerConfig) -> None:
    """Validates a crawl request (the effective limit is the account's business)."""
    await url(req.url, "url", config)
    if req.limit < 0 or req.limit > config.max_crawl_limit:
        raise InvalidArgument(
            "limit", f"{req.limit} is outside 0..{config.max_crawl_limit} (0 = default)"
        )
    if req.max_depth < 0 or req.max_depth > 10_000:
        raise InvalidArgument("max_depth", f"{req.max_depth} is outside 0..10000 (0 = unlimited)")
    await path_filters_and_sitemap(req, config)
    concurrency(req.max_concurrency, config)
    max_retries(req, config)
    if not 0 <= req.delay <= 60:
        raise InvalidArgument("delay", f"{req.delay} is outside 0..60 seconds")
    options(req.options, config)


def page(skip: int, limit: int, config: ServerConfig) -> int:
    if skip < 0:
        raise InvalidArgument("skip", f"{skip} is negative")
    if limit < 0 or limit > config.max_page_size:
        raise InvalidArgument("limit", f"{limit} is outside 0..{config.max_page_size}")
    return limit or config.default_page_size


MAX_MAP_SEARCH = 1_000  # characters of a Map call's search text


async def map_request(req: jobs_pb2.MapRequest, config: ServerConfig) -> None:
    """Validates a Map request: the URL (and the address guard), the limit, the search
    text, the regexes (as a crawl's) and the sitemap mode."""
    await url(req.url, "url", config)
    if not 0 <= req.limit <= config.max_map_urls:
        raise InvalidArgument(
            "limit", f"{req.limit} is outside 0..{config.max_map_urls} (0 = default)"
        )
    if len(req.search) > MAX_MAP_SEARCH:
        raise InvalidArgument("search", f"{len(req.search)} characters, at most {MAX_MAP_SEARCH}")
    if not req.search.isprintable():
        raise InvalidArgument("search", "holds a control character")
    await path_filters_and_sitemap(req, config)
