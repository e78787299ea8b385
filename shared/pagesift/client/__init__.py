"""The pagesift client: the public import path for calling a pagesift pair.

``from pagesift.client import JobClient, SyncJobClient`` is what a caller writes; the
names below are the whole public surface.
"""

from pagesift.client.aio import (
    DEFAULT_ADDRESS,
    FAILOVER_CODES,
    ClientError,
    Failover,
    JobClient,
    RetryPolicy,
    SyncJobClient,
    Unreachable,
    backoff_delays,
    choose_primary,
    follow_primary,
    is_retryable,
    keeps_trying,
    parse_addresses,
    pick_error,
    primary_named,
    should_try_next,
    with_idempotency_key,
)

__all__ = [
    "DEFAULT_ADDRESS",
    "FAILOVER_CODES",
    "ClientError",
    "Failover",
    "JobClient",
    "RetryPolicy",
    "SyncJobClient",
    "Unreachable",
    "backoff_delays",
    "choose_primary",
    "follow_primary",
    "is_retryable",
    "keeps_trying",
    "parse_addresses",
    "pick_error",
    "primary_named",
    "should_try_next",
    "with_idempotency_key",
]
