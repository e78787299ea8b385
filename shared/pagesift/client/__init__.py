"""The pagesift client: the public import path for calling a pagesift pair.

``from pagesift.client import JobClient, SyncJobClient`` is what a caller writes; the
names below are the whole public surface. One module per concern:

- ``aio``: ``JobClient``, the asyncio client (channels, the call loop, watch, paging);
- ``sync``: ``SyncJobClient``, the same client for code without an event loop;
- ``failover``: the pure rules of which address a call goes to next;
- ``retry``: which calls may be repeated, idempotency keys, the sleeps between rounds;
- ``auth``: bearer keys and TLS credentials;
- ``transport``: the channel of one address (the name its certificate must carry, no
  key in plaintext off loopback in cluster mode);
- ``errors``: the client's exceptions, and the reading of a server's rich error details;
- ``registryview``: ``ClusterView``, the registry read from etcd (aetcd, the ``cluster``
  extra), for cluster mode (``JobClient(cluster="etcd://HOST:PORT[,...]/NAME")``);
- ``cluster``: the router of cluster mode (calls by job id, placement, merged ListJobs);
  ``clusterbatch``: a batch started across pairs, part by part; ``composite``: a batch
  spanning pairs, as one job; ``pairs``: what those share.

Floor (tests/test_layers.py): the client imports only ``pagesift.v1``, the small pure
helpers ``pagesift.core.util.backoff`` and ``pagesift.core.util.channels``, and the
cluster's pure rules ``pagesift.core.cluster``, so a client-only install (no ``server``
extra) imports it.
"""

from pagesift.client.aio import JobClient
from pagesift.client.errors import ClientError, Unreachable
from pagesift.client.failover import (
    DEFAULT_ADDRESS,
    FAILOVER_CODES,
    Failover,
    choose_primary,
    follow_primary,
    keeps_trying,
    parse_addresses,
    pick_error,
    primary_named,
    should_try_next,
)
from pagesift.client.registryview import ClusterUnavailable, ClusterView
from pagesift.client.retry import RetryPolicy, backoff_delays, is_retryable, with_idempotency_key
from pagesift.client.sync import SyncJobClient

__all__ = [
    "DEFAULT_ADDRESS",
    "FAILOVER_CODES",
    "ClientError",
    "ClusterUnavailable",
    "ClusterView",
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
