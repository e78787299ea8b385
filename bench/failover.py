"""Section ``failover``: recovery time of a failover, manual promote vs the etcd witness.

Both are ``pagesift drill --local --repeat N --json`` (``pagesift.drill``): a real
pair of ``pagesift serve`` children on loopback, a crawl of the bundled demo site with
a signed webhook, the primary SIGKILLed at a seeded random point of the crawl, then

- ``manual``: the drill promotes the standby at once (``AdminService.Promote``), the
  best an operator with a script could do;
- ``witness``: the drill promotes nothing; the standby takes the etcd lease once the
  dead primary's lapses (``--witness-ttl``, default 5 s), etcd from Debian's
  ``etcd-server`` on loopback.

``rto_s`` is kill -> first write the new primary accepted (a probe every 50 ms). The
killed node restarts and rejoins between runs, so the roles alternate. Every run must
pass the drill's checks (nothing lost beyond what async lag allowed, no duplicate,
digests equal); the section fails otherwise. Results: ``bench/out/failover.json`` and
``bench/out/failover.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from bench.common import OUT_DIR, say

KINDS: dict[str, list[str]] = {"manual": [], "witness": ["--auto"]}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("failover")
    g.add_argument("--failover-runs", type=int, default=20, help="drills per kind (default 20)")
    g.add_argument("--failover-ttl", type=int, default=5, help="witness ttl, s (default 5)")
    g.add_argument("--failover-pages", type=int, default=120, help="demo site pages")


def _drill(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "pagesift.cli", "drill", "--local", *KINDS[kind],
        "--repeat", str(args.failover_runs), "--pages", str(args.failover_pages),
        "--witness-ttl", str(args.failover_ttl), "--seed", "20261130", "--json",
    ]  # fmt: skip
    say(f"failover {kind}: {' '.join(cmd[2:])}")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60 * 60, check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"drill {kind} exited {done.returncode}: {done.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(done.stdout)
    # the witness kind is also the suite's check of ``drill --auto --kill primary`` (moved
    # here from tests/test_drill.py): nobody but the witness made the survivor primary
    if kind == "witness" and "promoted" in done.stderr:
        raise RuntimeError(f"drill {kind}: a node was promoted by the drill, not the witness")
    return doc


def _figures(doc: dict[str, Any]) -> dict[str, Any]:
    runs = doc["runs"]
    rtos = [float(r["rto_s"]) for r in runs if r.get("rto_s") is not None]
    return {
        "runs": len(runs),
        "passed": sum(bool(r["passed"]) for r in runs),
        "rto_median_s": statistics.median(rtos) if rtos else None,
        "rto_worst_s": max(rtos) if rtos else None,
        "rto_best_s": min(rtos) if rtos else None,
        "pages_lost": sum(int(r["pages_lost"]) for r in runs),
        "duplicates": sum(int(r["duplicates"]) for r in runs),
        "webhook_events_resent": sum(int(r["webhook_events_resent"]) for r in runs),
    }


def run(args: argparse.Namespace) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    results = {kind: _figures(_drill(kind, args)) for kind in KINDS}
    (OUT_DIR / "failover.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "| kind | runs passed | RTO median | RTO worst | RTO best | pages lost | duplicates "
        "| acked events re-sent |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, f in results.items():
        lines.append(
            f"| {kind} | {f['passed']}/{f['runs']} | {f['rto_median_s']:.2f} s "
            f"| {f['rto_worst_s']:.2f} s | {f['rto_best_s']:.2f} s | {f['pages_lost']} "
            f"| {f['duplicates']} | {f['webhook_events_resent']} |"
        )
    (OUT_DIR / "failover.md").write_text("\n".join(lines) + "\n")
    for line in lines:
        say(line)
    failed = [k for k, f in results.items() if f["passed"] != f["runs"]]
    if failed:
        raise RuntimeError(f"failover drills failed: {failed}")
