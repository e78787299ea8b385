"""The expiry sweep: finished jobs past their TTL, stale quota buckets, old cache entries.

The runtime (``runtime.Jobs``) runs ``sweep`` once at start and then every
``interval(config)`` seconds while it is the primary. Every delete is a write group
(``Store.write``), so it replicates like any other write and a standby never keeps what
the primary dropped:

- a finished job whose ``expires_ms`` passed (or whose meta is missing) is deleted
  whole in one group (``records.delete_job``: lists dropped, sets cleared, its idempotency
  key and index entries); a running or paused job is never expired;
- the quota buckets that left the rolling day (``quota.prune_all``);
- page cache and change-tracking entries older than ``page_cache_ttl`` /
  ``change_tracking_ttl`` (``pagecache.sweep``, which reads only their stamps).

A store refusing writes (a full volume) raises ``StorageUnavailable`` out of ``sweep``;
the next round tries again, nothing is half-deleted (each job is one group).
"""

from __future__ import annotations

import logging
from functools import partial

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quota, records
from pagesift.core.store.db import Store
from pagesift.primary.jobs import pagecache

__all__ = ["interval", "sweep"]

logger = logging.getLogger("pagesift.jobs")


def interval(config: ServerConfig) -> float:
    """Seconds between two sweeps: a quarter of the job TTL, within [0.2, 60]."""
    return max(0.2, min(60.0, config.job_ttl_seconds / 4))


def sweep(store: Store, config: ServerConfig, now: float) -> list[str]:
    """One round at unix time ``now``; returns the ids of the jobs it expired."""
    now_ms = int(now * 1000)
    removed: list[str] = []
    for job_id in records.all_job_ids(store):
        meta = records.load_meta(store, job_id)
        if meta is None or (meta.terminal and meta.expires_ms <= now_ms):
            owner = meta.owner if meta else ""
            logger.info(
                "job %s expired (account %s)",
                job_id,
                owner or "-",
                extra={"job": job_id, "account": owner},
            )
            store.write(partial(records.delete_job, job_id=job_id, meta=meta))
            removed.append(job_id)
    quota.prune_all(store, now)
    pagecache.sweep(
        store, now_ms, int(config.page_cache_ttl * 1000), int(config.change_tracking_ttl * 1000)
    )
    return removed
