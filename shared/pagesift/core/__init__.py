"""Code both roles run, one subpackage per subsystem; nothing lives at this top level.

- ``util``: small mechanisms with no domain (backoff, cancellation, cross-thread wakeups,
  fsync of names, node-to-node channels, optional tracing);
- ``config``: ``ServerConfig`` (``schema``) and its loader from file, env and flags
  (``settings``);
- ``store``: RocksDB and the one write path (``db``), write groups and their ops
  (``groups``), the key layout (``layout``), storage errors (``errors``), consistent
  cuts (``cuts``);
- ``replication``: the log and its stream (protocol, sender and follower machines, log,
  backlog, identity, framing, the store slot), backup and the digest check;
- ``ha``: who may write (role machine, witness rules, the elector machine, failsafe);
- ``cluster``: several pairs as one service, the pure rules (job ids, placement, the
  registry's records and their signatures, members, budget plans, host ownership);
- ``jobs``: the job domain (records, events, quota, accounts, URL rules and crawl
  scope, caller regexes, request validation and specs, page errors, quarantine);
- ``api``: ``JobService`` and what every handler shares (paging, watch bounds, the
  error table and rich errors, interceptors, TLS, metrics, the storage watcher).

Floors (``tests/test_layers.py``): nothing here imports a role or ``pagesift.node``;
``replication`` and ``ha`` import nothing from ``jobs`` or ``api``.
"""
