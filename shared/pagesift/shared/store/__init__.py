"""The store: RocksDB with one write path (``db``) and consistent cuts of it (``cuts``)."""
