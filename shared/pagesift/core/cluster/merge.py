"""One job and one listing over several pairs, as pure rules: a cluster client's merges.

A batch scrape that spans pairs runs as parts, one per pair (``ids.composite_job_id``);
``ListJobs`` runs on every pair. This module decides how their answers read as one,
with no I/O (the client's shell, ``pagesift.client.cluster``, calls the pairs):

- **Documents of a job of parts** are in a stable order: part by part (the parts'
  order in the id), each part's documents by their index. A part's documents become
  visible once every part before it has ended (``locate``), so the sequence only ever
  grows at its end, exactly as a single job's does: paging by ``next_skip`` and
  resuming a watch at ``from_index`` see every document once, in that order.
- **State** (``merged_state``): scraping while any part scrapes, then paused while any
  part is paused, then failed if any part failed, cancelled if any was cancelled, else
  completed. Counters are the parts' sums (the shell adds them).
- **Errors of a job of parts** page part after part under one token (``errors_token``).
- **ListJobs** (``merge_lists``): every pair lists newest first by (created ms, id), so
  the merged listing is a k-way merge under a cursor, the last (created ms, id) handed
  out. One opaque page token (``list_token``) holds the cursor and each pair's own token
  of the page to read next; a pair's page is read again and cut at the cursor, so no
  job is handed out twice or skipped, and a pair that joins later is read from its
  start, cut at the cursor. The token is bounded (``MAX_LIST_TOKEN_CHARS``).

Floor: the standard library only (tests/test_layers.py), like the rest of the package.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_LIST_TOKEN_CHARS", "ListCursor", "PairPage", "Part", "errors_token", "errors_untoken",
    "list_token", "list_untoken", "locate", "merge_lists", "merged_state", "part_key",
    "renumber_field",
]  # fmt: skip

MAX_LIST_TOKEN_CHARS = 64 * 1024
_MAX_PAIR_TOKEN = 2048
#: (created ms, job uuid): the order of every listing, newest first
Key = tuple[int, str]


def merged_state(states: Sequence[str]) -> str:
    """The state of a job of parts from its parts' states (``scraping``, ``paused``,
    ``completed``, ``failed``, ``cancelled``): see the module docstring."""
    for state in ("scraping", "paused", "failed", "cancelled"):
        if state in states:
            return state
    return "completed"


@dataclass(frozen=True, slots=True)
class Part:
    """What ``locate`` needs of a part: its documents so far and whether it ended."""

    completed: int
    terminal: bool


def locate(index: int, parts: Sequence[Part]) -> tuple[int, int] | None:
    """Where document ``index`` of a job of parts is (or will be): ``(part, index in
    that part)``. None: the job has ended and ``index`` is past its last document (the
    end itself, ``index`` equal to the total, is the last part's end)."""
    offset = 0
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        if not part.terminal or index < offset + part.completed:
            return k, index - offset
        if last and index == offset + part.completed:
            return k, part.completed
        offset += part.completed
    return None


def offset_of(k: int, parts: Sequence[Part]) -> int:
    """The index of part ``k``'s first document (the parts before it have ended)."""
    return sum(p.completed for p in parts[:k])


def errors_token(part: int, token: str) -> str:
    """The page token of a job of parts' errors: part ``part``'s own ``token``."""
    raw = f"{part}\0{token}".encode()
    return "c1" + base64.urlsafe_b64encode(raw).decode()


def errors_untoken(token: str, parts: int) -> tuple[int, str]:
    """(part, its token) of an ``errors_token`` (``""``: the first part's first page);
    ``ValueError`` for anything else."""
    if not token:
        return 0, ""
    try:
        if not token.startswith("c1") or len(token) > _MAX_PAIR_TOKEN + 16:
            raise ValueError
        k, sep, rest = base64.urlsafe_b64decode(token[2:]).decode().partition("\0")
        if not sep or not k.isdigit() or not int(k) < parts:
            raise ValueError
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError("not a page token of this call") from None
    return int(k), rest


def part_key(key: str, pair: str) -> str:
    """The idempotency key of a job's part on ``pair``, derived from the caller's
    ``key``: a retried start sends the same keys, and finds the same parts."""
    return f"{key}@{pair}"


_URLS_FIELD = re.compile(r"\burls\[(\d+)\]")


def renumber_field(text: str, indexes: Sequence[int]) -> str:
    """``urls[j]`` of a part's request, in ``text``, as the caller's ``urls[indexes[j]]``."""

    def sub(m: re.Match[str]) -> str:
        j = int(m.group(1))
        return f"urls[{indexes[j]}]" if j < len(indexes) else m.group(0)

    return _URLS_FIELD.sub(sub, text)


# ---------------------------------------------------------------- ListJobs


@dataclass(frozen=True, slots=True)
class ListCursor:
    """Where a merged listing is: the last key handed out (None: the start) and, per
    pair, the token of its page to read next (None: that pair is done; a pair not
    named: read it from its start)."""

    after: Key | None
    tokens: Mapping[str, str | None]


def list_token(cursor: ListCursor) -> str:
    """The one opaque page token of ``cursor``; ``ValueError`` when it would be longer
    than ``MAX_LIST_TOKEN_CHARS``."""
    data = {"a": list(cursor.after) if cursor.after else None, "t": dict(cursor.tokens)}
    raw = zlib.compress(json.dumps(data, separators=(",", ":"), sort_keys=True).encode())
    token = "m1" + base64.urlsafe_b64encode(raw).decode()
    if len(token) > MAX_LIST_TOKEN_CHARS:
        raise ValueError(f"a listing's page token of {len(token)} characters")
    return token


def list_untoken(token: str) -> ListCursor:
    """The cursor of a ``list_token`` (``""``: the start); ``ValueError`` otherwise."""
    if not token:
        return ListCursor(None, {})
    try:
        if not token.startswith("m1") or len(token) > MAX_LIST_TOKEN_CHARS:
            raise ValueError
        z = zlib.decompressobj()
        raw = z.decompress(base64.urlsafe_b64decode(token[2:]), 4 * MAX_LIST_TOKEN_CHARS)
        if z.unconsumed_tail:
            raise ValueError
        data = json.loads(raw)
        after = data["a"]
        tokens = data["t"]
        if after is not None:
            ms, uid = after
            if not isinstance(ms, int) or not isinstance(uid, str) or len(uid) > 64:
                raise ValueError
            after = (ms, uid)
        if not isinstance(tokens, dict) or not all(
            isinstance(p, str) and (t is None or (isinstance(t, str) and len(t) <= _MAX_PAIR_TOKEN))
            for p, t in tokens.items()
        ):
            raise ValueError
    except (ValueError, TypeError, KeyError, binascii.Error, zlib.error, UnicodeDecodeError):
        raise ValueError("not a page token of this call") from None
    return ListCursor(after, tokens)


@dataclass(frozen=True, slots=True)
class PairPage:
    """One pair's page, read with ``token``: its jobs' keys in its order (newest first)
    and its ``next`` token ("" at its end)."""

    token: str
    keys: Sequence[Key]
    next: str


def merge_lists(
    cursor: ListCursor, pages: Mapping[str, PairPage], size: int
) -> tuple[list[tuple[str, int]], ListCursor | None]:
    """One merged page of at most ``size`` jobs: ``[(pair, index in its page), ...]``
    newest first, and the cursor of the next page (None: the listing is done).

    A job at or before ``cursor.after`` is not handed out again. The merge stops early
    when a pair with more pages has none of its jobs left to compare (its next page is
    read next time): a page may hold fewer jobs while more follow, as AIP-158 allows."""
    heads = {
        pair: [i for i, k in enumerate(page.keys) if cursor.after is None or k < cursor.after]
        for pair, page in pages.items()
    }
    taken: list[tuple[str, int]] = []
    used = dict.fromkeys(pages, 0)
    after = cursor.after
    while len(taken) < size:
        if any(used[p] == len(heads[p]) and pages[p].next for p in pages):
            break  # a pair with more to read has nothing left here to compare
        live = [p for p in pages if used[p] < len(heads[p])]
        if not live:
            break
        best = max(live, key=lambda p: pages[p].keys[heads[p][used[p]]])
        index = heads[best][used[best]]
        taken.append((best, index))
        after = pages[best].keys[index]
        used[best] += 1
    tokens: dict[str, str | None] = dict(cursor.tokens)
    for pair, page in pages.items():
        if used[pair] == len(heads[pair]):  # its page is spent: the next one
            tokens[pair] = page.next or None
        else:
            tokens[pair] = page.token
    if all(tokens[p] is None for p in pages):
        return taken, None  # every pair that answered is done (a pair down is left out)
    return taken, ListCursor(after, tokens)
