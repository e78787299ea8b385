"""Storage errors: what a failed RocksDB read or write means to pagesift.

Disk full is a state, not an accident. RocksDB reports every I/O failure as a plain
``Exception`` whose text names the file ("IO error: No space left on device: While
appending to file: /data/db/000009.log"); ``storage_error`` turns one into
``StorageUnavailable`` with a ``reason`` (``NO_SPACE`` / ``IO_ERROR``) and a message
that names no path, because clients see it (``STORAGE_UNAVAILABLE``) and a path is
the operator's business (``db.Store`` logs the original once). What the store does
after one (refuse writes until the storage watcher reopens it) is ``db``'s.
"""

from __future__ import annotations

import errno

NO_SPACE = "no_space"
IO_ERROR = "io_error"
_REASON_TEXT = {
    NO_SPACE: "the data volume is full",
    IO_ERROR: "the data volume failed a read or a write",
}


class StorageUnavailable(Exception):
    """The store refuses writes: ``reason`` is ``NO_SPACE`` or ``IO_ERROR``. The
    message never names a path (clients see it: ``STORAGE_UNAVAILABLE``). Nothing of
    the group that raised it was written."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"the store refuses writes: {_REASON_TEXT.get(reason, reason)}; "
            "they resume by themselves once the node can write again"
        )


def storage_error(exc: BaseException) -> StorageUnavailable | None:
    """The ``StorageUnavailable`` a RocksDB error stands for, or None when it is no
    storage error. RocksDB's statuses are text: "IO error: ..." for every failed
    file operation, with the errno's text after it ("No space left on device")."""
    if isinstance(exc, StorageUnavailable):
        return exc
    text = str(exc)
    if isinstance(exc, OSError):
        return StorageUnavailable(NO_SPACE if exc.errno == errno.ENOSPC else IO_ERROR)
    if "No space left on device" in text or "ENOSPC" in text:
        return StorageUnavailable(NO_SPACE)
    if text.startswith("IO error") or "IO error:" in text:
        return StorageUnavailable(IO_ERROR)
    return None
