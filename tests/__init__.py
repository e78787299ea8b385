"""pagesift test suite: real RocksDB, gRPC servers, aiohttp sites and processes on loopback."""
