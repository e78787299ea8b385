"""Replication: the primary's log and the stream that keeps a standby in step with it.

Pure decisions (``protocol``, ``sender``, ``follower``) are apart from I/O (``log``,
``backlog``, ``identity``, ``slot``); ``framing`` builds and splits the messages by hand.
This package knows nothing of jobs: it ships write groups, whatever they hold.
"""
