"""Which calls may be sent twice, and how long the client sleeps before it tries again.

What it owns
------------
- The JobService methods by how they may be repeated: reads (``READ_METHODS``) and
  idempotent writes (``IDEMPOTENT_WRITES``, ``CONTROL_WRITES``) always; StartCrawl,
  StartBatchScrape, AppendBatchScrape and StartExtract (``KEYED_WRITES``) only with an
  idempotency key (``is_retryable``).
- ``with_idempotency_key``: the client gives every such request without a key a fresh
  uuid4 one, so one method call never registers two jobs (the server stores the key
  with the job and replicates it, so a promoted standby that has the registration
  answers a retry with the same job id).
- ``RetryPolicy``: the sleeps between failed rounds, ``budget`` seconds in all (~10 s
  by default: enough for a standby to be promoted), through the one jittered backoff
  (``pagesift.core.util.backoff.budgeted_delays``).

Invariants
----------
Everything here is pure: randomness is a source handed in (``rng``), so tests pin
exact schedules. A method not listed is never retried (a new write is unsafe to
repeat until someone classifies it).
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable
from typing import TypeVar

from pagesift.core.util.backoff import budgeted_delays
from pagesift.v1 import jobs_pb2

__all__ = [
    "CONTROL_WRITES",
    "IDEMPOTENT_WRITES",
    "KEYED_WRITES",
    "READ_METHODS",
    "RetryPolicy",
    "backoff_delays",
    "is_retryable",
    "with_idempotency_key",
]

READ_METHODS = frozenset(
    {"GetJob", "WatchJob", "GetJobErrors", "ListJobs", "GetAccountUsage", "GetExtract"}
)
IDEMPOTENT_WRITES = frozenset({"Scrape", "CancelJob"})
KEYED_WRITES = frozenset({"StartCrawl", "StartBatchScrape", "AppendBatchScrape", "StartExtract"})
#: idempotent, and the owner must be able to stop a job while the pair fails over:
#: tried through a failover (``pagesift.client.failover.keeps_trying``)
CONTROL_WRITES = frozenset({"CancelJob", "ResumeJob"})

KeyedRequest = TypeVar(
    "KeyedRequest",
    jobs_pb2.StartCrawlRequest,
    jobs_pb2.StartBatchScrapeRequest,
    jobs_pb2.AppendBatchScrapeRequest,
    jobs_pb2.StartExtractRequest,
)


def is_retryable(method: str, idempotency_key: str = "") -> bool:
    """May ``method`` be sent again (to this or another address) after UNAVAILABLE?"""
    if method in READ_METHODS or method in IDEMPOTENT_WRITES or method in CONTROL_WRITES:
        return True
    return method in KEYED_WRITES and bool(idempotency_key)


def with_idempotency_key(request: KeyedRequest) -> KeyedRequest:
    """``request`` itself when it has a key, else a copy with a fresh uuid4 key."""
    if request.idempotency_key:
        return request
    keyed = type(request)()
    keyed.CopyFrom(request)
    keyed.idempotency_key = str(uuid.uuid4())
    return keyed


def backoff_delays(
    budget: float = 10.0,
    *,
    first: float = 0.1,
    cap: float = 2.0,
    rng: Callable[[], float] = random.random,
) -> list[float]:
    """Sleeps between retry rounds: ``first`` doubling up to ``cap``, each jittered
    (between half and all of it, drawn from ``rng``), summing to ``budget`` (the last
    one is trimmed to fit). See ``pagesift.core.util.backoff.budgeted_delays``."""
    return budgeted_delays(budget, base=first, cap=cap, rng=rng)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a retryable call is tried again after a failed round: sleeps of ``first``
    seconds doubling up to ``cap``, each jittered (between half and all of it, drawn
    from ``rng``), ``budget`` seconds of sleep in all (0: no retry). The defaults are
    the client's (~10 s: enough for a standby to be promoted)."""

    budget: float = 10.0
    first: float = 0.1
    cap: float = 2.0
    rng: Callable[[], float] = random.random

    def delays(self) -> list[float]:
        """One call's schedule of sleeps (a fresh jitter draw each time)."""
        return backoff_delays(self.budget, first=self.first, cap=self.cap, rng=self.rng)
