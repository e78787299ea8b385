"""The domain exceptions of AdminService and the replication stream, mapped by the error table.

What it owns: the exceptions that ``pagesift.node.admin`` (Promote, Digest, Backup) and
the primary's replication stream (``pagesift.primary.replication``) raise for a refusal;
``pagesift.core.api.errortable`` maps each to its reason and status (and re-exports
them, so they are imported from there). Each carries what its row's metadata names.
"""

from __future__ import annotations

from pagesift.core.jobs.validate import InvalidArgument

__all__ = [
    "BackupFailed", "BackupInProgress", "CannotPromote", "DigestOffsetPassed",
    "HelloExpected", "NoLongerPrimary", "OffsetNotReached", "ReplicationRefused",
    "SteppedDownForPeer",
]  # fmt: skip


class CannotPromote(Exception):
    """Promote reached a node that has no promoter (and is not the primary)."""

    def __init__(self) -> None:
        super().__init__("this node cannot promote")


class DigestOffsetPassed(Exception):
    """Digest at ``offset``, which the node has already applied past (that state is gone)."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset


class OffsetNotReached(Exception):
    """Digest at ``offset``: the node stood at ``at`` when the caller's ``within``
    seconds (``timeout_seconds``) ran out."""

    def __init__(self, offset: int, at: int, within: float) -> None:
        super().__init__(f"offset {offset} not reached in {within:.1f}s (at {at})")
        self.offset = offset
        self.at = at


class BackupInProgress(Exception):
    """A second Backup while one runs (one at a time per node)."""


class BackupFailed(Exception):
    """A Backup failed on the node; the message says why (a RocksDB or file error)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"backup failed: {cause}")


class HelloExpected(InvalidArgument):
    """The replication stream's first message is not a hello (field ``hello``); its
    message is the reason alone."""

    def __init__(self) -> None:
        super().__init__("hello", "the first message must be hello")

    def __str__(self) -> str:
        return self.reason


class ReplicationRefused(Exception):
    """The primary refuses a standby's Hello; the message says why."""


class SteppedDownForPeer(Exception):
    """A Hello of the higher ``epoch`` deposed this primary (it fenced itself)."""

    def __init__(self, epoch: int, message: str) -> None:
        super().__init__(message)
        self.epoch = epoch


class NoLongerPrimary(Exception):
    """The replication stream's node was demoted or replaced while it streamed."""

    def __init__(self) -> None:
        super().__init__("this node is no longer primary")
