"""``make run``: a local primary + standby pair under ./data, and a demo site to crawl.

Starts the bundled demo site (``pagesift.demo.site``) on loopback, a
primary on 127.0.0.1:50051 and a standby on 127.0.0.1:50052 as child processes, each
with the Firecrawl HTTP gateway (``--http-listen``: 127.0.0.1:3002, 127.0.0.1:3003)
(stores under ``DATA/primary`` and ``DATA/standby``; the pair's replication token,
made on first run, in ``DATA/replication.token``), prints the commands to try,
and stops everything on Ctrl-C. Each child is a plain ``pagesift serve``, so
what you see here is what production runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

from pagesift.core.api.tls import write_new_token
from pagesift.demo.site import CALENDAR_EXCLUDE, build_site, serve_site

PRIMARY = "127.0.0.1:50051"
STANDBY = "127.0.0.1:50052"
GATEWAY = "127.0.0.1:3002"  # the primary's Firecrawl gateway (--http-listen)
STANDBY_GATEWAY = "127.0.0.1:3003"


def _serve(role: str, listen: str, data: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    data.mkdir(parents=True, exist_ok=True)
    log = (data / "server.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "pagesift.cli", "serve", "--role", role, "--listen", listen,
         "--data", str(data), "--allow-private-networks", *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


async def main_async(data: Path, pages: int, site_port: int) -> int:
    token_file = data / "replication.token"
    if not token_file.exists():
        write_new_token(token_file)
    token = ["--replication-token-file", str(token_file)]
    site = build_site(pages)
    runner, root = await serve_site(site, port=site_port)
    procs = [
        _serve("primary", PRIMARY, data / "primary", [*token, "--http-listen", GATEWAY]),
        _serve(
            "standby",
            STANDBY,
            data / "standby",
            ["--primary", PRIMARY, *token, "--http-listen", STANDBY_GATEWAY],
        ),
    ]
    cli = Path(sys.executable).parent / "pagesift"
    print(
        f"""
pagesift demo
  demo site : {root}  ({pages} pages, robots.txt, sitemap, redirects, traps)
  primary   : {PRIMARY}   (log: {data / "primary" / "server.log"})
  standby   : {STANDBY}   (log: {data / "standby" / "server.log"})
  gateway   : http://{GATEWAY}  (Firecrawl's HTTP API; the standby's: {STANDBY_GATEWAY})

Try, in another shell (the CLI is {cli}; or `source .venv/bin/activate` first):
  pagesift crawl {root} --exclude '{CALENDAR_EXCLUDE}' --wait
  pagesift jobs
  pagesift status JOB_ID
  pagesift errors JOB_ID
  pagesift scrape {root}about.html
  pagesift batch {root} {root}about.html --wait
  pagesift role --server {STANDBY}        # replication: role, offsets, lag
  pagesift verify --primary {PRIMARY} --standby {STANDBY}
  pagesift status JOB_ID --server {STANDBY}   # reads answered by the standby
  pagesift promote --server {STANDBY} --admin-key "$(cat {token_file})"   # promote by hand
  pagesift drill --local --auto    # a whole failover rehearsal on a pair (and etcd) of its own
  curl -s http://{GATEWAY}/v2/scrape -H 'Content-Type: application/json' \\
    -d '{{"url": "{root}about.html"}}'    # the Firecrawl gateway (docs/gateway.md)

Ctrl-C stops the pair and the site; the data stays in {data}.
""",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            for p in procs:
                if p.poll() is not None:
                    print(f"a server exited with status {p.returncode}; see its log", flush=True)
                    stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        await runner.cleanup()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=Path("./data"))
    ap.add_argument("--pages", type=int, default=120)
    ap.add_argument("--site-port", type=int, default=8080)
    args = ap.parse_args()
    return asyncio.run(main_async(args.data, args.pages, args.site_port))


if __name__ == "__main__":
    raise SystemExit(main())
