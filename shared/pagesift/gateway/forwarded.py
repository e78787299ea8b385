"""The origin (``scheme://host``) of the gateway's absolute URLs, behind a proxy or not.

What it owns
------------
``origin(headers, scheme, host, trust)``: pure. Without ``trust`` it is the request's
own scheme and ``Host``: a client cannot make the gateway write another site into
``next`` or a crawl's ``url`` by sending a header. With ``trust`` (``--trust-forwarded``:
the operator says a proxy in front sets these headers), RFC 7239 ``Forwarded``
(``proto=``, ``host=``) is read first, then ``X-Forwarded-Proto`` / ``X-Forwarded-Host``.

Invariants
----------
- Of a list (several proxies appended to the header), the LAST value is used: the one
  the proxy next to the gateway wrote; values before it came from further away, the
  client included.
- A proto other than ``http``/``https`` or a host that is not ``name[:port]`` (no
  ``/``, ``@``, space or quote) is ignored, field by field, for the request's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["origin"]

_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::\d{1,5})?$")
_PROTOS = frozenset({"http", "https"})


def _last(value: str) -> str:
    return value.rsplit(",", 1)[-1].strip()


def _forwarded_pairs(value: str) -> dict[str, str]:
    """The ``key=value`` pairs of the last element of a ``Forwarded`` header."""
    out: dict[str, str] = {}
    for pair in _last(value).split(";"):
        key, sep, val = pair.partition("=")
        if sep:
            out[key.strip().lower()] = val.strip().strip('"')
    return out


def origin(headers: Mapping[str, str], scheme: str, host: str, trust: bool) -> str:
    """``scheme://host`` for the answer's absolute URLs (see the module docstring)."""
    if trust:
        fwd = _forwarded_pairs(headers.get("Forwarded", ""))
        proto = (fwd.get("proto") or _last(headers.get("X-Forwarded-Proto", ""))).lower()
        fhost = fwd.get("host") or _last(headers.get("X-Forwarded-Host", ""))
        if proto in _PROTOS:
            scheme = proto
        if fhost and _HOST.match(fhost):
            host = fhost
    return f"{scheme}://{host}"
