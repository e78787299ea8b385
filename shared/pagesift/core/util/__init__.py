"""Mechanisms with no pagesift domain in them, used by every other subpackage.

- ``backoff``: the one capped, jittered exponential backoff;
- ``channels``: the one way a gRPC channel to another node is opened;
- ``children``: ``Child``, the one launcher of ``pagesift serve`` (and etcd, and shell
  commands) children, each in its own process group and always stopped: the drill's,
  the tests' and the bench's;
- ``tasks``: stopping child tasks without swallowing the caller's own cancellation;
  ``loopwake``: a callback run on an event loop from any thread;
- ``fsync``: durable names (``fsync_dir``);
- ``machine``: how the pure state machines declare their events and actions;
- ``connlimits``: a listener's bounds and its open connections (pure);
  ``listeners``: every HTTP listener's timeouts, caps and quiet logs;
  ``descriptors``: RLIMIT_NOFILE raised, and a reserve HTTP cannot take;
- ``logthrottle``: how often a line an outsider can trigger may be written (pure);
  ``quietlog``: the throttled loggers every listener writes through;
- ``tracing``: optional OpenTelemetry tracing, off unless the environment asks.
"""
