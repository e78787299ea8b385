"""Replication: the primary's log and the stream that keeps a standby in step with it.

Pure decisions are apart from I/O. This package knows nothing of jobs: it ships write
groups, whatever they hold.

- ``protocol``: the session rules as pure functions (no sockets, no disk, no clock);
- ``senderstate``, ``followerstate``: the primary's and the standby's steady state as
  pure machines (sync mode, linger, heartbeats; when to ack, the lag);
- ``framing``: the messages built from bytes and split back, by hand;
- ``log``: every write group as an entry (epoch, offset, ops), on disk; ``backlog``:
  the recent entries kept, bounded in bytes;
- ``identity``: a node's history, epoch, role and fencing; ``slot``: the current store
  and its log, switched on a full resync;
- ``backup``: ``BackupSource``, AdminService.Backup's server side (a consistent copy,
  streamed); ``verify``: ``verify_digests``, the client side comparing both nodes'
  digests at one offset;
- ``writetrace``: the opt-in trace of committed writes, for fault-injection checks.
"""
