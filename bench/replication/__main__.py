"""Entry of the replication bench's helper processes, which the section starts itself.

``python -m bench.replication primary ADDR DATA [BACKLOG_MB]``: the primary driver
(``driver.serve``, spawned by ``procs.start_driver``). ``python -m bench.replication
raw-server ADDR``: the far end of the raw stream limit (``limits.raw_server``, spawned by
``limits.raw_stream``). Both run until SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bench.replication.driver import serve
from bench.replication.limits import raw_server


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "raw-server":
        asyncio.run(raw_server(argv[1]))
        return 0
    if len(argv) >= 3 and argv[0] == "primary":
        backlog = int(argv[3]) if len(argv) > 3 else 512
        asyncio.run(serve(argv[1], Path(argv[2]), backlog))
        return 0
    print("usage: python -m bench.replication raw-server ADDR | primary ADDR DATA [BACKLOG_MB]")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
