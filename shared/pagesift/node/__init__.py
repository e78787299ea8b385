"""The composition root: the one package that wires a pagesift node.

A node is one process of a pair, primary or standby, and may change role while it
runs (a standby is promoted, a primary is fenced). Wiring it needs both roles at
once, so this package, and only this package, imports ``pagesift.primary`` and
``pagesift.standby`` together (``tests/test_layers.py`` holds that floor):

- ``node``: ``Node``, its role state and role changes (start, promotion, fencing,
  the job runtime started and stopped with the primary role);
- ``startup``: what a node opens and checks before it runs (its id, store slot,
  replication token and credential), each refusal a ``StartRefused``;
- ``replicationparts``: ``ReplicationParts``, a node's replication pieces (store slot,
  the primary's sender, the standby's follower and promoter, fencing) wired once for
  the server, the tests and the bench;
- ``status``: the one computation of a node's role/replication figures, for both the
  metrics and the AdminService Role call;
- ``admin``: ``AdminServicer`` (Role, Promote, Digest, Backup on either role);
- ``elector``: ``Elector``, the shell that carries out the elector machine's actions
  (``pagesift.core.ha.electorstate``) against the witness (``pagesift.coord.witness``);
- ``electorwiring``: the elector's wiring (the witness and this node's addresses from
  the configuration, the pair state a primary publishes, the witness series);
- ``clustering``: a node in a cluster: its wiring to ``pagesift.coord`` (registrar,
  budgets, owned hosts) and the record it registers;
- ``looplag``: the event-loop lag monitor (one task per node, whatever its role);
- ``fdreserve``: the node's file-descriptor reserve, and the HTTP caps that never reach
  into it;
- ``grpchealth``: the role-aware ``grpc.health.v1`` statuses;
- ``reflection``: server reflection, v1 as well as v1alpha;
- ``grpcserver``: the gRPC server (services, interceptors, guards), ``run``, ``serve``;
- ``httpgateway``: ``serve --http-listen``, the Firecrawl gateway run inside the node;
- ``logs``: the process's log format.

The parts a node wires live with what they serve: the storage watcher in
``pagesift.core.api.storagewatch``, backup and the digest check in
``pagesift.core.replication``, the child launcher in ``pagesift.core.util.children``;
the command line is ``pagesift.cli``, the failover drill ``pagesift.drill``, ``make
run`` ``pagesift.demo.launcher``.
"""
