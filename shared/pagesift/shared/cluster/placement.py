"""Where new work goes: rendezvous (highest-random-weight) hashing onto healthy pairs.

Rules
-----
- A crawl goes to the pair that owns its **origin** (``scheme://host:port``), so every
  crawl of one site shares that pair's per-host slots and Retry-After pauses.
- A batch scrape is split by origin (``split_by_origin``): each part goes to the pair
  that owns its origin, keeping each URL's index in the request (a stable page order).
- A start with an **idempotency key** but no origin to place by goes to the pair that
  owns the key, so a retried start reaches the pair that holds its job.

Why rendezvous hashing
----------------------
Every client computes the same owner from the same set of pairs with no shared state,
and when a pair joins or leaves only the keys it wins or held move (about 1/N of them);
no ring, no virtual nodes, no table to keep in step. Running work never moves: the
job id carries its pair (``ids``), and placement is consulted for new work only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

__all__ = ["origin_of", "owner", "split_by_origin"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``, lower-cased, the default port written out;
    ``ValueError`` when it has no scheme or host."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if not scheme or not host:
        raise ValueError(f"{url[:200]!r} has no scheme or host")
    port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def _score(pair: str, key: str) -> int:
    digest = hashlib.blake2b(f"{pair}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(key: str, pairs: Iterable[str]) -> str:
    """The pair that owns ``key`` among ``pairs`` (ties, which need equal 64-bit
    hashes, go to the smaller name); ``ValueError`` when there is no pair."""
    best = max(pairs, key=lambda p: (_score(p, key), [-ord(c) for c in p]), default=None)
    if best is None:
        raise ValueError("no pair can take new work")
    return best


def split_by_origin(urls: Sequence[str], pairs: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
    """Each pair's part of a batch: ``[(index in urls, url), ...]`` in request order,
    by the owner of each URL's origin (hashed once per origin). A URL without an origin
    (the node will refuse it by its field) goes with the first URL's pair, so it is
    reported under one job."""
    parts: dict[str, list[tuple[int, str]]] = {}
    fallback: str | None = None
    stray: list[tuple[int, str]] = []
    owners: dict[str, str] = {}  # origin -> its pair: hashed once per site, not per URL
    for i, url in enumerate(urls):
        try:
            origin = origin_of(url)
            pair = owners.get(origin) or owners.setdefault(origin, owner(origin, pairs))
        except ValueError:
            if not pairs:
                raise
            stray.append((i, url))
            continue
        fallback = fallback or pair
        parts.setdefault(pair, []).append((i, url))
    if stray:
        home = fallback or owner("", pairs)
        parts[home] = sorted([*parts.get(home, []), *stray])
    return parts
