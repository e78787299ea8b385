"""Request validation: one check per field, each raising ``InvalidArgument`` naming it.

What it owns: the field rules (URLs and the address guard, scrape options, request
control, webhook payloads, concurrency, retries, regex bounds, paging; a selector
schema's rules are ``selectorschemas``', raised here as ``InvalidArgument``) and the two
request exceptions every rule raises, ``InvalidArgument`` and ``PermissionDenied``,
each carrying its field path and reason as attributes (no caller parses a message).
``pagesift.core.jobs.specs`` runs these checks, one call per request kind, and
gathers every violation; the error table (``pagesift.core.api.errortable``) turns the
exceptions into statuses.

Why it is safe: validation runs before anything is written, so a rejected request
leaves nothing half-created in the store. The checks that need the network (the
address guard resolves host names) are async; the rest are pure.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence

from selectolax.lexbor import LexborHTMLParser

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import blockedaddresses, patterns, selectorschemas, urls
from pagesift.core.jobs.accounts import Account
from pagesift.v1 import jobs_pb2


class InvalidArgument(ValueError):
    """A request field that cannot be accepted: ``field`` (its path) and ``reason``;
    ``str()`` is ``"field: reason"``, the status message.

    ``violations`` are the ``(field path, description)`` pairs for the status's
    ``BadRequest`` details: this one field, or each bad element (``urls[3]``...).
    ``causes`` holds each violation's stable reason (``FieldViolation.reason``:
    ``BLOCKED_ADDRESS`` for a URL the address guard refuses), "" where the words are all."""

    def __init__(
        self,
        field: str,
        reason: str,
        violations: Sequence[tuple[str, str]] = (),
        cause: str = "",
    ) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.violations: list[tuple[str, str]] = list(violations) or [(field, reason)]
        self.causes: list[str] = [cause] * len(self.violations)

    @classmethod
    def combined(cls, errors: Sequence[InvalidArgument]) -> InvalidArgument:
        """One exception for several bad fields (in the order found): the first one's
        field and reason lead (the status message, the ErrorInfo's ``field``), the
        message names the others, and every violation goes into the BadRequest."""
        if len(errors) == 1:
            return errors[0]
        first, rest = errors[0], errors[1:]
        others = ", ".join(e.field for e in rest)
        out = cls(
            first.field,
            f"{first.reason} (and {len(rest)} more: {others})",
            [v for e in errors for v in e.violations],
        )
        out.causes = [c for e in errors for c in e.causes]
        return out


class PermissionDenied(PermissionError):
    """A request field the caller's account may not use: ``field`` and ``reason``;
    ``str()`` is ``"field: reason"``. A ``PermissionError``, so the job runtime's
    handlers of that catch it too."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def job_id(value: str, field: str = "id") -> str:
    try:
        uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"{value[:64]!r} is not a job id") from None
    return value


#: ``FieldViolation.reason`` of a URL the address guard refuses (a wire constant:
#: ``pagesift.client.errors.BLOCKED_ADDRESS`` is the same, tests/test_gateway_translate.py)
BLOCKED_ADDRESS = "BLOCKED_ADDRESS"


async def _guard(url: str, field: str, config: ServerConfig) -> None:
    if config.allow_private_networks:
        return
    reason = await blockedaddresses.blocked_reason(url)
    if reason is not None:
        raise InvalidArgument(field, f"{url[:200]} is refused: {reason}", cause=BLOCKED_ADDRESS)


async def url(value: str, field: str, config: ServerConfig) -> str:
    problem = urls.validate(value, config.max_url_length)
    if problem is not None:
        raise InvalidArgument(field, problem)
    await _guard(value, field, config)
    return value


def options(opts: jobs_pb2.ScrapeOptions, config: ServerConfig, field: str = "options") -> None:
    """What shapes the document (formats, max_pages, the selector schema:
    ``selectorschemas.check``); request control is ``request_control``'s."""
    for i, f in enumerate(opts.formats):
        if f not in jobs_pb2.Format.values() or f == jobs_pb2.FORMAT_UNSPECIFIED:
            raise InvalidArgument(f"{field}.formats[{i}]", f"unknown format {f}")
    tag_selectors(opts, field)
    try:
        selectorschemas.check(opts, field)
    except selectorschemas.SchemaError as e:
        raise InvalidArgument(e.field, e.reason) from None
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


def regex_limits(config: ServerConfig) -> patterns.Limits:
    """The bounds on a crawl's ``include_paths``/``exclude_paths`` (each list)."""
    return patterns.Limits(
        count=config.max_regexes, length=config.max_regex_length, memory=config.max_regex_memory
    )


async def path_filters(
    req: jobs_pb2.StartCrawlRequest | jobs_pb2.MapRequest, config: ServerConfig
) -> None:
    """``include_paths``/``exclude_paths`` of a crawl or a Map call: bounded, then
    compiled by RE2 on the pattern pool, off the event loop."""
    try:
        await patterns.compile_filter(req.include_paths, req.exclude_paths, regex_limits(config))
    except patterns.PatternError as e:
        field = f"{e.which}_paths" + ("" if e.index is None else f"[{e.index}]")
        raise InvalidArgument(field, e.reason) from None


def sitemap(mode: int) -> None:
    if mode not in jobs_pb2.SitemapMode.values():
        raise InvalidArgument("sitemap", f"unknown sitemap mode {mode}")


def crawl_limit(limit: int, config: ServerConfig) -> None:
    """A crawl's ``limit`` (the effective one is the account's business: ``quota``)."""
    if limit < 0 or limit > config.max_crawl_limit:
        raise InvalidArgument(
            "limit", f"{limit} is outside 0..{config.max_crawl_limit} (0 = default)"
        )


def max_depth(depth: int) -> None:
    if depth < 0 or depth > 10_000:
        raise InvalidArgument("max_depth", f"{depth} is outside 0..10000 (0 = unlimited)")


def delay(seconds: float) -> None:
    if not 0 <= seconds <= 60:
        raise InvalidArgument("delay", f"{seconds} is outside 0..60 seconds")


def page(skip: int, limit: int, config: ServerConfig) -> int:
    if skip < 0:
        raise InvalidArgument("skip", f"{skip} is negative")
    if limit < 0 or limit > config.max_page_size:
        raise InvalidArgument("limit", f"{limit} is outside 0..{config.max_page_size}")
    return limit or config.default_page_size


MAX_MAP_SEARCH = 1_000  # characters of a Map call's search text


def map_limit(limit: int, config: ServerConfig) -> None:
    if not 0 <= limit <= config.max_map_urls:
        raise InvalidArgument("limit", f"{limit} is outside 0..{config.max_map_urls} (0 = default)")


def search(text: str) -> None:
    """A Map call's search text: bounded, printable."""
    if len(text) > MAX_MAP_SEARCH:
        raise InvalidArgument("search", f"{len(text)} characters, at most {MAX_MAP_SEARCH}")
    if not text.isprintable():
        raise InvalidArgument("search", "holds a control character")
