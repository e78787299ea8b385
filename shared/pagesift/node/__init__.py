"""The composition root: the one package that wires a pagesift node.

A node is one process of a pair, primary or standby, and may change role while it
runs (a standby is promoted, a primary is fenced). Wiring it needs both roles at
once, so this package, and only this package, imports ``pagesift.primary`` and
``pagesift.standby`` together (``tests/test_layers.py`` holds that floor):

- ``node``: ``Node``, its role state and role changes (start, promotion, fencing,
  the job runtime started and stopped with the primary role);
- ``replication``: ``ReplicationParts``, a node's replication pieces (store slot,
  the primary's sender, the standby's follower and promoter, fencing) wired once for
  the server, the tests and the bench;
- ``status``: the one computation of a node's role/replication figures, for both the
  metrics and the AdminService Role call;
- ``admin``: ``AdminServicer`` (Role, Promote, Digest on either role);
- ``grpcserver``: the gRPC server (services, interceptors, guards), ``run``, ``serve``;
- ``logs``: the process's log format;
- ``cli``: the ``pagesift`` command (``python -m pagesift.node.cli``), a package with
  one module per concern;
- ``demo``: ``make run``.
"""
