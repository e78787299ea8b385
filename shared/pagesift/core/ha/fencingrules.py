"""Fencing's rules: who stops taking writes, who may take them again, and what a former
primary's answer to a fencing hello means.

What it owns
------------
- ``must_fence(our_epoch, peer_epoch)``: a primary that meets a peer (or entries) of a
  higher epoch stops taking writes;
- ``may_accept_writes(epoch, fenced_epoch)``: a node fenced by epoch F writes again only
  once it adopted an epoch >= F (by following the newer primary), never by a restart;
- ``fencing_verdict``: after a promotion the new primary says hello (its new epoch) to
  the primary it used to follow, until that one has stepped down; this judges each
  answer as a ``FencingVerdict`` (``pagesift.standby.fencing`` is the shell).

Why it is safe
--------------
Pure functions of epochs: no I/O, no clock. The role machine
(``pagesift.core.ha.rolestate``) and the log's identity
(``pagesift.core.replication.identity``) ask the same two questions here, so a node's
role and its log cannot disagree on whether it may write; a verdict of DEPOSED needs an
answer of a strictly higher epoch, so two nodes of one epoch never depose each other.
"""

from __future__ import annotations

from enum import StrEnum


def must_fence(our_epoch: int, peer_epoch: int) -> bool:
    """A primary that meets a peer (or entries) of a higher epoch stops taking writes."""
    return peer_epoch > our_epoch


def may_accept_writes(epoch: int, fenced_epoch: int) -> bool:
    """A node fenced by epoch F may write again only once it adopted an epoch >= F
    (by following the newer primary), never by a plain restart."""
    return fenced_epoch <= epoch


class FencingVerdict(StrEnum):
    """What a promoted node makes of its former primary's answer to a fencing hello
    (a hello with the promoted node's epoch), and so what it does next."""

    #: The stream was refused (FAILED_PRECONDITION): it stepped down just now, or it is
    #: not a writable primary anyway (fenced, or a standby already). Stop asking.
    DONE = "done"
    #: It answered with a decision of a HIGHER epoch: it is the newer primary and we
    #: are the stale one. Step down.
    DEPOSED = "deposed"
    #: A decision of an epoch not above ours: a primary that did not step down for our
    #: epoch (two primaries of one epoch, which two nodes cannot produce); only an
    #: operator can settle it. Keep asking, loudly.
    CONFLICT = "conflict"
    #: No answer (unreachable, timed out, refused credentials). Keep asking.
    RETRY = "retry"
    #: Never returned by ``fencing_verdict``: the shell stopped asking because this node
    #: is no primary any more.
    STOPPED = "stopped"


def fencing_verdict(our_epoch: int, *, refused: bool, decision_epoch: int | None) -> FencingVerdict:
    """Judge one answer to a fencing hello (see ``FencingVerdict``)."""
    if refused:
        return FencingVerdict.DONE
    if decision_epoch is None:
        return FencingVerdict.RETRY
    if decision_epoch > our_epoch:
        return FencingVerdict.DEPOSED
    return FencingVerdict.CONFLICT
