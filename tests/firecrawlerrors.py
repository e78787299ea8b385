"""What a Firecrawl error body's ``details`` name, for the gateway's tests.

The gateway's ``details`` are zod-like issues (``pagesift.gateway.httperrors.issue``):
``{code, path, message}``, ``path`` a list of keys and indices, an unknown key named in
``keys`` under its object's ``path``. ``named(issue)`` is the dotted field an issue is
about (``scrapeOptions.formats[0].bogus``, the unknown key included), ``names(body)``
every issue's, in order, so a test reads them as the error text writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagesift.gateway.httperrors import dotted

__all__ = ["named", "names"]


def named(issue: Mapping[str, Any]) -> str:
    """The dotted field ``issue`` is about (its path, then its first unknown key)."""
    return dotted([*issue["path"], *issue.get("keys", ())[:1]])


def names(body: Mapping[str, Any]) -> list[str]:
    """The field of every issue of an error body's ``details`` (none: [])."""
    details = body.get("details") or []
    return [named(d) for d in details if isinstance(d, Mapping)]
