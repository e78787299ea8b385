"""Coordination: the one package that speaks etcd (issue 29).

A pair's witness and a cluster's registry, budgets and view all live in one etcd; this
package is everything that talks to it, so the layout, the deadlines and the
credentials are decided once:

- ``etcd``: the one client (endpoints, a deadline per call, rotation to the next
  endpoint on an error, user/password with re-authentication, per-endpoint health);
- ``keys``: every key path, pair and cluster, with who reads and writes each;
- ``witness``: a pair's leader key and pair state (the elector's ``Witness`` port);
- ``registry``: a node's ``NodeRecord`` under its lease, the registrar loop, the reading
  of every record (a cluster client's view reads through it);
- ``budgets``: the account limits held cluster-wide (slot keys, the daily pages counter),
  the ``ClusterLimits`` port a clustered node hands its job runtime;
- ``owners``: the hosts a node's pair owns, read from the registry (the shell of
  ``pagesift.core.cluster.ownership``);
- ``access``: who may touch which keys (one etcd role per pair, one for readers);
  ``etcdauth``: turning etcd's auth on with those roles (the deploy kit's bootstrap).

The rules these carry out are pure and live beside them: ``pagesift.core.ha.election``
(the witness records), ``pagesift.core.cluster`` (records, placement, budget plans).

Floor (tests/test_layers.py): nothing outside this package imports ``aetcd``, and this
package imports no role and not the composition root. The client reaches ``etcd``,
``keys`` and ``registry`` only, and lazily (``pagesift.client.registryview``), so a
client-only install without aetcd imports and names the extra when asked for a cluster.
"""
