"""The job routes both API versions share: status pages, cancel and the errors list.

What it owns
------------
``status_route(kind, prefix)``, ``cancel_route(kind)`` and ``errors_route(kind)``: the
handlers of ``GET|DELETE {prefix}/{id}`` and ``GET {prefix}/{id}/errors`` for a job of
``kind`` (crawl or batch scrape). v1 and v2 answer these in the same shape, so ``v1``
and ``v2`` register these same handlers under their own paths.

Invariants
----------
- A job of the other kind is unknown here (404, ``handling.job_of``).
- A status page holds the app's page documents unless ``?limit=`` asks for another
  number (at most ``MAX_LIMIT``), its JSON is bounded by the app's page bytes, and
  ``next`` is an absolute URL under ``prefix`` pointing at the first document left out.
- A cancel of a job that already finished is 409, naming its state.
"""

from __future__ import annotations

from aiohttp import web

from pagesift.gateway import translate
from pagesift.gateway.errors import HttpError
from pagesift.gateway.handling import (
    MAX_LIMIT,
    PAGING,
    Handler,
    base_url,
    client_of,
    int_query,
    job_of,
    json_answer,
)
from pagesift.v1 import jobs_pb2

__all__ = ["cancel_route", "errors_route", "status_route"]


def status_route(kind: int, prefix: str) -> Handler:
    """``GET {prefix}/{id}``: one status page (``prefix`` as ``/v2/crawl``)."""

    async def status(request: web.Request) -> web.StreamResponse:
        documents, max_bytes = request.app[PAGING]
        skip = int_query(request, "skip", 0)
        asked = int_query(request, "limit", 0) or None
        limit = min(asked or documents, MAX_LIMIT)
        resp = await job_of(request, kind, skip=skip, limit=limit)
        url = f"{base_url(request)}{prefix}/{request.match_info['id']}"
        return await json_answer(lambda: translate.status_page(resp, skip, url, max_bytes, asked))

    return status


def cancel_route(kind: int) -> Handler:
    """``DELETE {prefix}/{id}``."""

    async def cancel(request: web.Request) -> web.StreamResponse:
        await job_of(request, kind, status_only=True)
        state = await client_of(request).cancel(request.match_info["id"])
        if state != jobs_pb2.JOB_STATE_CANCELLED:
            status = translate.STATES.get(state, "scraping")
            raise HttpError(409, f"The job already finished ({status})", "CONFLICT")
        return web.json_response({"success": True, "status": "cancelled"})

    return cancel


def errors_route(kind: int) -> Handler:
    """``GET {prefix}/{id}/errors``."""

    async def errors(request: web.Request) -> web.StreamResponse:
        await job_of(request, kind, status_only=True)
        job_id = request.match_info["id"]
        resp = await client_of(request).errors(job_id)
        return web.json_response(translate.errors_body(resp, job_id))

    return errors
