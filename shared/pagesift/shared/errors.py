"""Page errors: why a page could not be scraped, as both roles and the API see it.

The primary's engine raises ``PageError``; ``JobService`` (shared by both roles) turns
it into a status for a Scrape call; the job runtime stores it as a page error whose
``code`` ``GetJobErrors`` returns. The codes are part of the API (see the README).
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


class PageError(Exception):
    """A page that could not be scraped, with a code a client can act on."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
