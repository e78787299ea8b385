"""A node's role, by name; the one vocabulary both roles, the metrics and the CLI use."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """``primary``: writable log, job runtime running. ``standby``: a follower applies
    the primary's log; reads only. ``fenced``: a higher epoch deposed this primary
    (job runtime stopped, reads only) until it is restarted as a standby, or, with a
    witness, until it follows the lease's holder (a standby) or wins the lease itself.

    A ``StrEnum``: each member equals its name as a string (``Role.PRIMARY == "primary"``).
    """

    PRIMARY = "primary"
    STANDBY = "standby"
    FENCED = "fenced"
