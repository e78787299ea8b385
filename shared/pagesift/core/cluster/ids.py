"""Job ids that carry their pair, so a cluster client routes by the id with no lookup.

Format
------
A pair's name is 1..32 characters of ``[a-z0-9-]``, starting and ending with a letter
or digit (``PAIR_NAME``). A job placed in a cluster has the id ``{pair}.{uuid}``; a job
of a single pair (no cluster) has a bare UUID. The dot cannot occur in
a UUID or a pair name, so ``split_job_id`` is unambiguous. The node mints the bare
UUID; a cluster client adds the pair when it hands the id out, and strips it when it
calls the pair.

A batch scrape whose URLs span several pairs is one job of several parts, one per pair
(``placement.split_by_host``): its id is the parts' ids joined by ``_``
(``{p1}.{uuid1}_{p2}.{uuid2}``, ``composite_job_id``), in the order of the parts' first
URLs, at most ``MAX_PARTS`` of them. ``_`` occurs in no part (and is unreserved in a
URL path), so ``job_parts`` is unambiguous too.

Guarantees
----------
- ``split_job_id(cluster_job_id(p, u)) == (p, u)`` for every valid pair and UUID.
- ``job_parts(composite_job_id(parts)) == parts`` (2..``MAX_PARTS`` parts, distinct
  pairs); ``job_parts`` of a one-part id is ``[split_job_id(id)]``.
- A malformed id is ``ValueError`` naming what is wrong, never a guess at a pair.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

__all__ = [
    "MAX_PARTS", "PAIR_NAME", "PART_SEPARATOR", "check_pair_name", "cluster_job_id",
    "composite_job_id", "job_parts", "pair_of", "split_job_id",
]  # fmt: skip

MAX_PARTS = 32
PART_SEPARATOR = "_"
PAIR_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?")


def check_pair_name(name: str) -> str:
    """``name`` when it is a valid pair (or cluster) name, else ``ValueError``."""
    if not PAIR_NAME.fullmatch(name):
        raise ValueError(
            f"{name[:40]!r} is not a pair name: 1-32 of a-z, 0-9 and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def cluster_job_id(pair: str, job_uuid: str) -> str:
    """The id of job ``job_uuid`` placed on ``pair``."""
    return f"{check_pair_name(pair)}.{uuid.UUID(job_uuid)}"


def split_job_id(job_id: str) -> tuple[str | None, str]:
    """(pair, uuid) of a cluster id; (None, uuid) of a single pair's bare UUID."""
    pair, dot, rest = job_id.rpartition(".")
    try:
        canonical = str(uuid.UUID(rest))
    except ValueError:
        raise ValueError(f"{job_id[:80]!r} is not a job id") from None
    if not dot:
        return None, canonical
    return check_pair_name(pair), canonical


def pair_of(job_id: str) -> str | None:
    """The pair in ``job_id`` (None for a single pair's id); ``ValueError`` if malformed."""
    return split_job_id(job_id)[0]


def composite_job_id(parts: Sequence[tuple[str, str]]) -> str:
    """The id of a job of several parts ``[(pair, uuid), ...]`` (in part order); one
    part is simply ``cluster_job_id``."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"a job has 1..{MAX_PARTS} parts, not {len(parts)}")
    if len({p for p, _ in parts}) != len(parts):
        raise ValueError("a job has at most one part per pair")
    return PART_SEPARATOR.join(cluster_job_id(p, u) for p, u in parts)


def job_parts(job_id: str) -> list[tuple[str | None, str]]:
    """The parts ``[(pair, uuid), ...]`` of an id: one for a bare UUID or a cluster id,
    several for a job spanning pairs (each with its pair, pairs distinct)."""
    texts = job_id.split(PART_SEPARATOR, MAX_PARTS)
    if len(texts) > MAX_PARTS:
        raise ValueError(f"a job id has at most {MAX_PARTS} parts")
    if len(texts) == 1:
        return [split_job_id(job_id)]
    parts = [split_job_id(t) for t in texts]
    if any(p is None for p, _ in parts):
        raise ValueError(f"{job_id[:80]!r}: every part of a job id names its pair")
    if len({p for p, _ in parts}) != len(parts):
        raise ValueError(f"{job_id[:80]!r}: two parts on one pair")
    return parts
