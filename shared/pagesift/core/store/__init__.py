"""The store: RocksDB with one write path, and the write groups it commits.

- ``db``: ``Store``, the one write path;
- ``groups``: write groups and their ops;
- ``layout``: the key layout;
- ``errors``: storage errors (what a failed RocksDB read or write means; disk full);
- ``cuts``: consistent cuts of the store.
"""
