"""Page errors: why a page could not be scraped, as both roles and the API see it.

The primary's engine raises ``PageError``; ``JobService`` (shared by both roles) turns
it into a status for a Scrape call; the job runtime stores it as a page error whose
``code`` ``GetJobErrors`` returns. The codes are part of the API (docs/api.md).
``status`` and ``retry_after`` carry what the retry policy
(``pagesift.primary.engine.retrypolicy``) needs to decide on another attempt.

``duplicate`` and ``robots_noindex`` are not fetch failures but outcomes of a crawl's
URL identity rules, recorded by the job runtime (never raised by the engine): the
page is one already recorded under another URL (a redirect's final URL or its
rel=canonical was done; the message names it), or meta robots / X-Robots-Tag said
noindex (not stored; GetJobErrors lists it among the robots-blocked URLs too).
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Why a page failed; stored with the page error and shown by GetJobErrors."""

    ROBOTS_DISALLOWED = "robots_disallowed"
    HTTP_STATUS = "http_status"
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    UNSUPPORTED_CONTENT = "unsupported_content"
    CONNECT = "connect"
    DNS = "dns"
    REDIRECT_LOOP = "redirect_loop"
    BLOCKED_ADDRESS = "blocked_address"
    INVALID_URL = "invalid_url"
    DUPLICATE = "duplicate"
    ROBOTS_NOINDEX = "robots_noindex"
    # a 429/503 asked for a pause beyond the server's ``max_retry_after``
    RETRY_AFTER_TOO_LONG = "retry_after_too_long"
    # the site's TLS certificate was not accepted (options.skip_tls_verification accepts it)
    TLS = "tls"
    # a PDF or office document that could not be read: broken, truncated, encrypted,
    # unsupported inside, or its conversion outlived ``document_timeout``
    PARSE_FAILED = "parse_failed"
    # one of the request's browser actions failed (the message names its index), or the
    # actions together ran past ``max_actions_time``
    ACTION_FAILED = "action_failed"
    # the page needed a browser and none could render it (not installed, failed to
    # start), or the browser crashed on it past the job's retries
    RENDER_FAILED = "render_failed"
    # in a cluster: the page's host (a crawl's link, a redirect's target) belongs to
    # another pair (``pagesift.core.cluster.ownership``): left to it, never fetched here
    HOST_OWNED_ELSEWHERE = "host_owned_elsewhere"


class PageError(Exception):
    """A page that could not be scraped, with a code a client can act on."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        worker_lost: bool = False,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status  # the HTTP status, for HTTP_STATUS errors
        self.retry_after = retry_after  # seconds the server asked to wait (Retry-After)
        # the page's own extraction worker died or was killed on it (a crash, its memory
        # cap, its deadline): the job runtime counts these to quarantine a poison job
        self.worker_lost = worker_lost

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles whole (an extraction worker raises it across a process boundary)."""
        return (_page_error, (self.code, self.message, self.status, self.retry_after,
                              self.worker_lost))  # fmt: skip


def _page_error(
    code: ErrorCode, message: str, status: int | None, retry_after: float | None, lost: bool
) -> PageError:
    return PageError(code, message, status=status, retry_after=retry_after, worker_lost=lost)
