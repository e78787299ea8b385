"""Firecrawl's routes the gateway does not serve, each refused with a reason.

What it owns
------------
``UNSERVED``: the Firecrawl API's routes (v0, v1, v2) that pagesift has nothing behind
(search, agents, interactive browsers, monitors, uploads, Firecrawl's cloud features,
and v0's extract: the gateway serves extract on v1 and v2 only), each a path pattern
with the feature's name and why pagesift lacks it, and
``refusal_for(method, path)``: the refusal of such a route, 501 ``NOT_IMPLEMENTED`` in
Firecrawl's error shape, or None for any other path. ``handling.unrouted`` asks it for
every request no route takes, so a client of Firecrawl's API (an SDK's ``search``,
LangChain's loader in search mode) reads why, instead of a 404 that looks like a
wrong URL.

Invariants
----------
- Pure: a function of the method and path. A route the gateway serves never gets
  here (the router answers it first): this table only ever turns a 404 or 405 into a
  clearer refusal.
- 501 is not a 5xx any SDK retries (firecrawl-py retries 502, the JS SDK 502 and 503),
  and no 404: a client that reads the status sees "not implemented here", not "no such page".
"""

from __future__ import annotations

import re

from pagesift.gateway.httperrors import HttpError

__all__ = ["UNSERVED", "refusal_for"]

_LLM = "it needs an LLM agent, which pagesift does not run"
_CLOUD = "a Firecrawl cloud feature pagesift does not have"
_V = r"/v[0-2]"

#: (path pattern, the feature's name, why pagesift does not serve it)
UNSERVED: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(pattern if pattern.startswith("/v0/") else f"{_V}{pattern}"), feature, why)
    for pattern, feature, why in (
        (
            r"/search(/.*)?",
            "search",
            "pagesift has no web search engine: list a site's URLs with POST /v2/map "
            "(its search ranks matching URLs first) or scrape URLs you know",
        ),
        (
            r"/v0/extract(/.*)?",  # v1 and v2 extract are routes (gateway.extractroutes)
            "v0 extract",
            "pagesift serves extract on Firecrawl's v1 and v2 API: POST /v2/extract "
            "(or /v1/extract), then GET /v2/extract/{id}",
        ),
        (r"/agent(/.*)?", "agent", _LLM),
        (r"/deep-research(/.*)?", "deep research", _LLM),
        (r"/(generate-)?llmstxt(/.*)?", "llms.txt generation", _LLM),
        (r"/research(/.*)?", "research", _LLM),
        (
            r"/(browser|interact)(/.*)?",
            "browser sessions",
            "pagesift keeps no interactive browser sessions: send actions with a scrape",
        ),
        (
            r"/scrape/[^/]+/interact",
            "interactive scrapes",
            "pagesift keeps no browser open after a scrape: send actions with the scrape",
        ),
        (
            r"/scrape/[^/]+",
            "scrape results by id",
            "pagesift keeps no scrape by id: POST /v2/scrape answers the document itself",
        ),
        (
            r"/monitor(/.*)?",
            "monitors",
            "pagesift runs no scheduled checks: scrape with the changeTracking format "
            "when you want one",
        ),
        (
            r"/parse(/.*)?",
            "file parsing",
            "pagesift takes no uploads; it converts the documents it fetches (PDF, Word, "
            "PowerPoint...): scrape the file's URL",
        ),
        (r"/exchange(/.*)?", "the exchange", _CLOUD),
        (r"/feedback", "feedback", _CLOUD),
        (r"/team/(activity|threat-protection|siem)(/.*)?", "team settings", _CLOUD),
        (r"/slack(/.*)?", "Slack", _CLOUD),
        (r"/keyless(/.*)?", "keyless access", _CLOUD),
    )
)


def refusal_for(method: str, path: str) -> HttpError | None:
    """The 501 of a Firecrawl route pagesift does not serve (``UNSERVED``), else None."""
    for pattern, feature, why in UNSERVED:
        if pattern.fullmatch(path):
            message = f"{method} {path}: Firecrawl's {feature} is not offered by pagesift: {why}"
            return HttpError(501, message, "NOT_IMPLEMENTED")
    return None
