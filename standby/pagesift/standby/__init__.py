"""The standby: the follower that applies the primary's log, promotion, fencing.

- ``follower``: ``Follower``, the loop that follows the primary's log into the local
  store (apply, full resync);
- ``promotion``: a standby becoming the primary, durably, before it takes a write;
- ``fencing``: deposing the former primary after a promotion.
"""
