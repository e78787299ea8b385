"""The drill's fixed choices, with no imports: the ``pagesift drill`` parser reads them
(``pagesift.cli.drill``), so that building the command line needs none of the
drill's server-side code (aiohttp, the store), which only a run imports."""

from __future__ import annotations

__all__ = ["FIELDS", "KILL_TARGETS", "MODES"]

#: the kill targets
KILL_TARGETS = ("primary", "standby", "witness")
#: the replication modes a drill runs in
MODES = ("async", "sync")
#: the placeholders of a remote drill's --kill-cmd / --start-cmd
FIELDS = frozenset({"node", "address", "host", "port", "role", "primary"})
