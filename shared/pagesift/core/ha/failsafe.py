"""Failsafe: a primary keeps writing through a witness outage while its standbys vouch for it.

What it owns
------------
The rule that lets a primary write past its witness lease (Patroni's ``failsafe_mode``,
for a pair), as pure functions, and ``StandbyPromise``: a standby's promise not to
campaign, the one mutable fact the rule shares between a node's follower (which gives
promises) and its elector (which must keep them). No I/O, no clock: the shells pass
``time.monotonic()`` in.

The protocol (over the replication stream, ``proto/pagesift/v1/replication.proto``)
--------------------------------------------------------------------------------------
1. While the witness answers, the primary publishes in its pair state the standbys it
   streams to (``PairState.standbys``): the members whose word it will need. A pair
   state that names members lets no other node campaign (``election.may_campaign``),
   so a standby that is not connected cannot be forgotten.
2. Every heartbeat carries a grant request (a sequence number and the ttl), sent at
   ``sent_at`` on the primary's monotonic clock (``replication.sender``).
3. A standby that answers (``Ack.failsafe_grant``) first records, on its own clock,
   ``StandbyPromise.until = answer time + ttl``; until then its elector does not
   campaign, even if it reaches the witness and finds the leader key vacant. It
   refuses to answer while its elector is campaigning (``StandbyPromise.granting``)
   or for a ttl above its own (what its restart wait covers, see below).
4. The primary may write until ``failsafe_deadline``: the oldest ``sent_at`` among
   the members' latest answered requests, plus ttl, less the lease margin. Its write
   deadline is the later of that and its lease's (``elector``); a member that does
   not answer (stream cut, standby gone) lets the deadline pass within a ttl.
5. When the witness answers again the lease is renewed, or, if it lapsed, the primary
   re-takes the vacant key while a grant still covers it, without stopping its writes
   (``elector``). Its log keeps its epoch: the new key's create revision is higher,
   but no node held the key in between (every member was bound by its promise, no
   other node may campaign, and a campaign that finds the key taken stops the writes
   at once), so nothing needs fencing; a later takeover promotes above the revision.

The invariant, and why it holds
-------------------------------
**Never two nodes accepting writes in overlapping intervals.** A node writes only
under a deadline. Under the lease's: ``election``'s rule. Under a grant's: every
member answered a request sent at ``s`` or later, so each promised, from an instant at
or after ``s``, not to campaign for ``ttl`` of its clock; the primary stops at ``s +
ttl - margin`` of its clock, before any promise ends as long as the two clocks' rates
differ by less than ``ttl / (ttl - margin)`` (11 % at the smallest margin: far beyond
an NTP-slewed clock's 500 ppm). No non-member may campaign while members are named,
and a campaign starts only after the standby stopped granting and found no promise
outstanding, in one step of the event loop (``elector``: ``StopGranting`` precedes
``Campaign``, with no await between the check and it). A standby that restarts has
forgotten its promises: it waits one ttl of its own (at least any promise it gave)
before it campaigns (``ElectorState.restart_promise``).
**An acknowledged write is never lost.** Nothing changes for replication: in sync mode
a write the standby did not confirm must still be recorded in the witness before it
is acknowledged (``Elector.record_out_of_sync``); during an outage it cannot be, so it
is not acknowledged (``NotWritable``) while confirmed writes go on.

What is covered, and what is not
--------------------------------
Covered: monotonic clocks of different rates within the bound above, a witness
stopped, killed or reachable by one node only, the stream cut (the primary stops
within a ttl of its last answered request), a standby restarted mid-outage. Not
covered: a host suspended (``CLOCK_MONOTONIC`` stops while time passes; the lease
has the same limit), a manual promotion (``AdminService.Promote``) of a standby that
promised, and a pair whose nodes disagree on ``witness_ttl`` beyond the standby's
refusal in step 3 (a primary with the larger ttl simply gets no grant).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pagesift.core.ha import election

#: A deadline nobody vouches for (no write on its account).
NONE = float("-inf")


def failsafe_deadline(members: Iterable[str], grants: Mapping[str, float], ttl: float) -> float:
    """Until when (the primary's monotonic clock) every one of ``members`` vouches for
    the primary: the oldest of their answered requests' send times, plus ttl, less the
    lease margin. ``NONE`` without members or when one of them never answered."""
    sent = [grants.get(member, NONE) for member in members]
    if not sent:
        return NONE
    return election.write_deadline(min(sent), ttl)


@dataclass(slots=True)
class StandbyPromise:
    """A node's promise not to campaign for the witness lease (step 3 of the protocol).

    The follower calls ``grant`` before it answers a request; the elector reads
    ``until`` before it campaigns and closes ``granting`` in the same step."""

    own_ttl: float  # this node's witness ttl: the longest promise it gives
    until: float = NONE  # no campaign before this instant (monotonic)
    granting: bool = True  # False while this node campaigns or holds the lease
    given: int = 0  # promises given (a counter for the metrics)

    def grant(self, now: float, ttl: float) -> bool:
        """Promise not to campaign until ``now + ttl``; False (no promise, no answer)
        while campaigning or for a ttl longer than this node's own."""
        if not self.granting or ttl <= 0 or ttl > self.own_ttl:
            return False
        self.until = max(self.until, now + ttl)
        self.given += 1
        return True
