"""Where new work goes: rendezvous (highest-random-weight) hashing onto healthy pairs.

Rules
-----
- A crawl goes to the pair that owns its **host** (``host_of``: the URL's host name,
  canonical, without scheme or port, a leading ``www.`` dropped: ``site_key``). The
  engine's per-host slots and Retry-After pauses key on the host (``engine.hops``:
  ``urls.host_of``), so every slot key has exactly one owner: one host served on two
  ports or on http and https is one owner's, under one per-host limit (keying on the
  origin gave each port its own pair and its own slots). A host and its ``www.`` twin
  share an owner because a crawl's scope takes them for one site (``scope``): a crawl
  of ``example.com`` that redirects to ``www.example.com`` stays on its pair.
- A batch scrape is split by host (``split_by_host``): each part goes to the pair
  that owns its host, keeping each URL's index in the request (a stable page order).
- A start with an **idempotency key** but no host to place by goes to the pair that
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

__all__ = ["host_of", "owner", "owner_of_url", "site_key", "split_by_host"]


def site_key(host: str) -> str:
    """What placement hashes for a host (an engine slot key): the host, one leading
    ``www.`` dropped."""
    return host[4:] if host.startswith("www.") and len(host) > 4 else host


def host_of(url: str) -> str:
    """The placement key of ``url``: its host as the engine's per-host slots key it
    (``urls.host_of``: lower-case, no trailing dot, no port, an IPv6 address without
    brackets, a non-ASCII name in A-labels) under ``site_key``; ``ValueError`` when
    it has no scheme or host. (The
    slots' own parser lives with the jobs, which a client does not ship; the spellings
    this one reads differently, such as ``http://2130706433/``, are refused by the
    node that does not own them, naming the owner the client then follows.)"""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").rstrip(".")
    if not parts.scheme or not host:
        raise ValueError(f"{url[:200]!r} has no scheme or host")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as e:
            raise ValueError(f"{url[:200]!r}: host {host!r} is not a valid name") from e
    return site_key(host)


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


def owner_of_url(url: str, pairs: Iterable[str]) -> str:
    """The pair that owns ``url``'s host (``ValueError``: no host, or no pair)."""
    return owner(host_of(url), pairs)


def split_by_host(urls: Sequence[str], pairs: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
    """Each pair's part of a batch: ``[(index in urls, url), ...]`` in request order,
    by the owner of each URL's host (hashed once per host). A URL without a host (the
    node will refuse it by its field) goes with the first URL's pair, so it is
    reported under one job."""
    parts: dict[str, list[tuple[int, str]]] = {}
    fallback: str | None = None
    stray: list[tuple[int, str]] = []
    owners: dict[str, str] = {}  # host -> its pair: hashed once per host, not per URL
    for i, url in enumerate(urls):
        try:
            host = host_of(url)
            pair = owners.get(host) or owners.setdefault(host, owner(host, pairs))
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
