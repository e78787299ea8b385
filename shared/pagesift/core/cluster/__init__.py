"""Several pairs as one service (issue 23): the rules, pure, that clients and nodes share.

A cluster is N pairs registered under one etcd prefix; each pair stays one writer, one
warm standby, one log. This package holds only decisions and formats, no I/O:

- ``ids``: job ids that carry their pair (``{pair}.{uuid}``), and plain ids of a single pair;
- ``placement``: rendezvous hashing of an origin or an idempotency key onto a pair, and
  a batch split by origin;
- ``registryrules``: the key layout in etcd, a pair's registration record and which
  pairs may take new work; ``signing``: a pair's Ed25519 signing key and the check of a
  record's signature;
- ``members``: the pairs that should exist, each with its signing key and node addresses,
  from a file outside etcd (the registry's trust anchor);
- ``budgetplans``: the account limits shared through etcd (concurrency slots under
  leases, daily pages drawn in blocks by compare-and-swap), as plans a shell carries out;
- ``ownership``: who owns a host, as a node sees it; ``tenure``: whether a node's pair
  may send a request to a host now;
- ``merge``: one job and one listing over several pairs (a cluster client's merges).

Floor: imports only the standard library and ``pagesift.core.util``, so the installed
client (``pagesift.client``) may use it (tests/test_layers.py).
"""
