"""The engine: how a URL becomes a ``Page``; job code sees only ``protocol.Engine``."""
