"""Job ids that carry their pair, so a cluster client routes by the id with no lookup.

Format
------
A pair's name is 1..32 characters of ``[a-z0-9-]``, starting and ending with a letter
or digit (``PAIR_NAME``). A job placed in a cluster has the id ``{pair}.{uuid}``; a job
of a single pair (no cluster) has a bare UUID. The dot cannot occur in
a UUID or a pair name, so ``split_job_id`` is unambiguous.

Guarantees
----------
- ``split_job_id(cluster_job_id(p, u)) == (p, u)`` for every valid pair and UUID.
- A malformed id is ``ValueError`` naming what is wrong, never a guess at a pair.
"""

from __future__ import annotations

import re
import uuid

__all__ = ["PAIR_NAME", "check_pair_name", "cluster_job_id", "pair_of", "split_job_id"]

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
