"""High availability: which node may take writes, and until when.

The machines are pure, of the one ``step(state, event, now) -> (state, actions)`` shape;
their shells (the node, the elector in ``pagesift.node.elector``) carry out the actions:

- ``rolestate``: a node's role machine (start, auto-promotion, promotion, fencing);
- ``electorstate``: the elector machine (when to look, campaign, keep the lease alive,
  publish, write);
- ``election``: the witness's rules (who may campaign, until when a lease lets a
  primary write);
- ``fencingrules``: who stops taking writes on a higher epoch, who may write again, and
  what a former primary's answer to a fencing hello means;
- ``failsafe``: a primary writing through a witness outage while its standbys vouch;
- ``roles``: the role names.
"""
