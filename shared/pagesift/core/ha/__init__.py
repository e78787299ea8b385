"""High availability: which node may take writes, and until when.

``rolestate`` (start, promotion, fencing) and ``elector`` (the witness lease) are pure
machines of the one ``step(state, event, now) -> (state, actions)`` shape; ``election``
holds the witness's rules; ``roles`` the role names.
"""
