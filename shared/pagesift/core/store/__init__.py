"""The store: RocksDB with one write path (``db``), the write groups it commits
(``groups``), its key layout (``layout``), its storage errors (``errors``) and
consistent cuts of it (``cuts``)."""
