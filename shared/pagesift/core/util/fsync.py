"""Durable names: ``fsync_dir`` makes the entries created or renamed in a directory
survive a power loss (the file's own fsync does not cover its name).

Kept apart, with no import beyond the standard library, so that client code (the
``backup`` command) and the store slot share it without loading the store.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
