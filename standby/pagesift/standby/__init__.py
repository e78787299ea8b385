"""The standby: the follower that applies the primary's log, promotion, and the admin service."""
