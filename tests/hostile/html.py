"""Hostile HTML (issue 19, finding 5): pages whose parse time grows faster than their size.

lexbor's tree builder walks its stack of open elements for every tag, so a page's
parse time grows with tags x depth:

- ``deep_divs``: ``depth`` nested ``<div>`` never closed (200,000: 1 MB, minutes of
  parse on the code of the finding);
- ``many_elements``: ``count`` empty ``<i></i>`` (past ``MAX_HTML_ELEMENTS`` by
  default, within the default 10 MiB body cap);
- ``deep_and_wide``: the worst page the caps let through: ``depth`` open ``<div>``
  around ``count`` empty elements, for measuring what a page just under the caps costs.

``ROUTES`` serves each default under ``/html/...`` as ``text/html``, built once per
process on first request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from aiohttp import web

from tests.hostile import Handler, Routes

__all__ = ["ROUTES", "deep_and_wide", "deep_divs", "many_elements"]

_HEAD = "<!doctype html><html><head><title>hostile</title></head><body>"


def deep_divs(depth: int = 200_000) -> str:
    """``depth`` nested ``<div>`` elements, never closed, around one word."""
    return _HEAD + "<div>" * depth + "deep"


def many_elements(count: int = 1_200_000) -> str:
    """``count`` empty ``<i></i>`` elements side by side (depth 3)."""
    return _HEAD + "<i></i>" * count + "</body></html>"


def deep_and_wide(depth: int = 990, count: int = 990_000) -> str:
    """``depth`` open ``<div>`` around ``count`` empty ``<i></i>``: the caps' worst case."""
    return _HEAD + "<div>" * depth + "<i></i>" * count + "</div>" * depth + "</body></html>"


def _route(make: Callable[[], str]) -> Handler:
    build = functools.cache(lambda: make().encode())

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=build(), content_type="text/html", charset="utf-8")

    return handler


ROUTES: Routes = [
    ("/html/deep", _route(deep_divs)),
    ("/html/many-elements", _route(many_elements)),
    ("/html/deep-and-wide", _route(deep_and_wide)),
]
