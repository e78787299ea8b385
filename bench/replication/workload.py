"""The replication bench's workload: page-shaped write groups.

Owns the shape of one *page group* (a ~16 KB page pushed, its key inserted, and
``LINKS_PER_PAGE`` seen inserts + frontier pushes) and ``PageGen``, which builds them
deterministically. The raw limits (``limits``) write these groups straight into RocksDB or
stream their serialized ``LogEntry`` sizes; the primary driver (``driver``) writes them
through the real write path.
"""

from __future__ import annotations

import random
import string

from bench.common import MB

PAGE_BYTES = 16 * 1024
LINKS_PER_PAGE = 5
OPS_PER_GROUP = 2 + 2 * LINKS_PER_PAGE  # push + insert + 5 x (insert + push)


class PageGen:
    """Deterministic page-shaped groups: ~16 KB of Markdown-like text, a page key, and
    ``LINKS_PER_PAGE`` new links (seen key, frontier entry). Text is sliced from a 2 MB
    pool of pseudo-words so it compresses like prose, not like random bytes."""

    def __init__(self, seed: int = 7, prefix: str = "http://127.0.0.1:8000/") -> None:
        rng = random.Random(seed)
        vocab = [
            "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 11)))
            for _ in range(4000)
        ]
        lines: list[str] = []
        size = 0
        while size < 2 * MB:
            line = " ".join(rng.choice(vocab) for _ in range(rng.randint(4, 16)))
            if rng.random() < 0.1:
                line = "## " + line
            lines.append(line)
            size += len(line) + 1
        self.pool = "\n".join(lines).encode()
        self.prefix = prefix

    def page(self, n: int) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]]:
        size = PAGE_BYTES + (n * 7919) % 4097 - 2048
        off = (n * 104729) % (len(self.pool) - size)
        doc = self.pool[off : off + size]
        key = f"{self.prefix}ref/{n % 97}/page-{n}.html".encode()
        links = []
        for i in range(LINKS_PER_PAGE):
            link = f"{self.prefix}topics/{(n + i) % 89}/link-{n * LINKS_PER_PAGE + i}.html"
            links.append((link.encode(), f"2 {link}".encode()))
        return doc, key, links

    def entry_bytes(self, n: int, epoch: int = 1) -> bytes:
        """The serialized ``LogEntry`` the real write path logs for page ``n``."""
        from pagesift.v1 import replication_pb2, store_pb2

        doc, key, links = self.page(n)
        job = "job/00000000-0000-0000-0000-000000000000"
        ops = [
            store_pb2.Op(list_push=store_pb2.ListPush(list=f"{job}/pages", seq=n, item=doc)),
            store_pb2.Op(set_insert=store_pb2.SetInsert(set=f"{job}/done", member=key, size=n + 1)),
        ]
        for i, (seen, entry) in enumerate(links):
            seen_size = n * LINKS_PER_PAGE + i + 1
            ops.append(
                store_pb2.Op(
                    set_insert=store_pb2.SetInsert(set=f"{job}/seen", member=seen, size=seen_size)
                )
            )
            ops.append(
                store_pb2.Op(
                    list_push=store_pb2.ListPush(
                        list=f"{job}/frontier", seq=n * LINKS_PER_PAGE + i, item=entry
                    )
                )
            )
        return replication_pb2.LogEntry(epoch=epoch, offset=n + 1, ops=ops).SerializeToString()
