"""The public API served by both roles: ``JobService`` and what every handler shares.

``service`` holds the handlers; ``errortable`` maps every refusal to one gRPC status and
reason (``rpcerrors`` builds the rich details); ``paging`` and ``streams`` bound what a
read returns; ``interceptors``, ``tls`` and ``metrics`` wrap every call.
"""
