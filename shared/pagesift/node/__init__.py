"""The composition root: the one package that wires a pagesift node.

A node is one process of a pair, primary or standby, and may change role while it
runs (a standby is promoted, a primary is fenced). Wiring it needs both roles at
once, so this package, and only this package, imports ``pagesift.primary`` and
``pagesift.standby`` together (``tests/test_layers.py`` holds that floor):

- ``node``: ``Node``, its role state and role changes (start, promotion, fencing,
  the job runtime started and stopped with the primary role);
- ``startup``: what a node opens and checks before it runs (its id, store slot,
  replication token and credential), each refusal a ``StartRefused``;
- ``replication``: ``ReplicationParts``, a node's replication pieces (store slot,
  the primary's sender, the standby's follower and promoter, fencing) wired once for
  the server, the tests and the bench;
- ``status``: the one computation of a node's role/replication figures, for both the
  metrics and the AdminService Role call;
- ``admin``: ``AdminServicer`` (Role, Promote, Digest, Backup on either role);
- ``backup``: ``BackupSource``, Backup's server side (a consistent copy, streamed);
- ``verify``: ``verify_digests``, the client side comparing both nodes at one offset;
- ``witness``: ``Witness``, the etcd lease and leader key that decide who is primary;
- ``elector``: ``Elector``, the shell that carries out the elector machine's actions
  (``pagesift.core.ha.electorstate``) against the witness;
- ``storage``: the storage watcher and its reserve (disk full is a state), and the
  interceptor that answers STORAGE_UNAVAILABLE;
- ``looplag``: the event-loop lag monitor (one task per node, whatever its role);
- ``health``: the role-aware ``grpc.health.v1`` statuses;
- ``reflection``: server reflection, v1 as well as v1alpha;
- ``grpcserver``: the gRPC server (services, interceptors, guards), ``run``, ``serve``;
- ``logs``: the process's log format;
- ``cli``: the ``pagesift`` command (``python -m pagesift.cli``), a package with
  one module per concern;
- ``procs``: ``Child``, the one launcher of ``pagesift serve`` (and etcd) children,
  each in its own process group and always stopped: the drill's, the tests' and the
  bench's;
- ``drill``: ``pagesift drill``, a failover drill that kills a node and judges what
  survived;
- ``demo``: ``make run`` (a local pair and the demo site).
"""
