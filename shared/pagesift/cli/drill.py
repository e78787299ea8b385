"""``pagesift drill``: rehearse a failover and print a verdict.

Owns the ``drill`` flags (``add_drill_command``), their mapping to ``DrillSettings``
(``drill_settings``: a usage error is reported before anything starts, exit 2) and the
handler, which runs ``pagesift.drill.runner.run_drill`` in its own event loop
and prints the text report (per run, then a summary line) or, with ``--json``, exactly
one object ``{"runs": [...], "summary": {...}}`` on stdout; progress goes to stderr.
With ``--pairs N`` (and ``--local``) or ``--cluster URL`` it runs the cluster drill
instead (``pagesift.drill.clusterrun``: one report, a line or object per pair).
Exit 0 when every run passed, 1 when one failed, 2 when it was given something
unusable, 5 when the drill could not set up, 130 when interrupted (``common``).
SIGINT and SIGTERM cancel the drill, which stops everything it started and removes its
working directory; any child still alive after the event loop is gone is SIGKILLed
(``procs.kill_leftovers``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
from typing import TYPE_CHECKING, Any

from pagesift.cli.args import credentials_parent, host_port, nonneg_float, nonneg_int, positive_int
from pagesift.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO,
    EXIT_OK,
    dump,
    fail,
    server_extra_missing,
)
from pagesift.drill.choices import FIELDS as FIELDS
from pagesift.drill.choices import KILL_TARGETS as KILL_TARGETS
from pagesift.drill.choices import MODES as MODES

# The drill itself (pagesift.drill's runner, fixture, ...) needs the server extra
# (aiohttp, the store): imported by the handler only, so that the pagesift command of
# a client-only install (pip install pagesift) builds its parser without it.
if TYPE_CHECKING:
    from pagesift.drill.clusterrun import ClusterDrillSettings
    from pagesift.drill.runner import DrillSettings

EXIT_RUN_FAILED = EXIT_NO

DESCRIPTION = """\
Run a failover drill and print a verdict.

--local starts its own pair on temporary directories (and etcd with --auto), crawls
the bundled demo site (or --site URL) with a signed webhook to its own receiver,
SIGKILLs the --kill target after a random 10-70 % of the crawl was shown, recovers
(promotes the standby, or waits for the witness with --auto), restarts the killed
node so it rejoins, waits for the crawl to end and checks: pages a client was shown
and lost, duplicates, every page of the site once, webhook events lost or re-sent
after their acknowledgement, equal digests on both nodes, how the killed node
resynced, and the time from the kill to the first write accepted (rto_s). It makes
its own token, keys and accounts file (--api-key, --admin-key, --tls-ca and
--webhook-secret are for a remote drill) and removes everything it started on exit.

--primary P --standby S --kill-cmd CMD --start-cmd CMD does the same against a real
deployment, with the operator's commands (run by /bin/sh -c). Placeholders, each
substituted shell-quoted: {node} = primary or standby (the flag that named the node,
its identity even after the roles swapped) or witness; {address}, {host}, {port} = that
node's address; start command only: {role} = primary|standby to start it as (empty
with --auto), {primary} = the address it must follow as a standby. A command must
return once done (start the node in the background, as systemctl start or kubectl
do). The demo site and the webhook receiver run in this process on --callback-host:
the remote nodes must reach that host (and allow private networks if it is one).
Nothing of the deployment is touched but through these commands and the API (one
crawl and small probe jobs per run, under --api-key; Promote without --auto).

--local --pairs N (or --cluster etcd://HOST:PORT/NAME with --kill-cmd/--start-cmd, a
running cluster's pairs) is the cluster drill: one site per pair (local: on loopback
hosts 127.0.0.1..N, per_host_concurrency --per-host-limit), one crawl of each through a
cluster client, the primary of one pair SIGKILLed mid-crawl and its standby promoted by
the witness; it reports per pair the RTO, pages lost, duplicates and the most requests
its site had in flight at once against the per-host limit (politeness held or not).
The limit is the per_host_concurrency the nodes publish in their registry records, the
smallest of them (the report names nodes that disagree or publish none); with --cluster,
--per-host-limit N judges by N instead. When no node publishes one and no N is given,
politeness is not judged and the drill fails saying so.
With --cluster, name the node in the commands by {address}, {host} or {port} ({node} is
only primary or standby, the same in every pair).

Exit 0 when every run passed, 1 when one failed, 2 on a usage error, 5 on a setup
error, 130 when interrupted.
"""


def drill_settings(args: argparse.Namespace) -> DrillSettings:
    """The settings ``args`` ask for; ValueError names what is wrong with them."""
    from pagesift.drill.fixture import DrillKeys, SetupError
    from pagesift.drill.remote import check_template
    from pagesift.drill.runner import DrillSettings

    local = bool(args.local)
    if local == bool(args.primary or args.standby):
        raise ValueError("give either --local or --primary P --standby S")
    if not local:
        missing = [
            flag
            for flag, value in (
                ("--primary", args.primary),
                ("--standby", args.standby),
                ("--kill-cmd", args.kill_cmd),
                ("--start-cmd", args.start_cmd),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"a remote drill needs {', '.join(missing)}")
        if args.primary == args.standby:
            raise ValueError("--primary and --standby name the same node")
        try:
            check_template("--kill-cmd", args.kill_cmd)
            check_template("--start-cmd", args.start_cmd)
        except SetupError as err:
            raise ValueError(str(err)) from None
    elif args.kill_cmd or args.start_cmd:
        raise ValueError("--kill-cmd/--start-cmd are for a remote drill (--primary/--standby)")
    if args.kill == "witness" and not args.auto:
        raise ValueError("--kill witness needs --auto (there is no witness otherwise)")
    if args.pages < 20:
        raise ValueError("--pages must be at least 20 (the kill lands at 10-70 % of the crawl)")
    keys = (
        DrillKeys.fresh() if local else DrillKeys(args.api_key, args.admin_key, args.webhook_secret)
    )
    return DrillSettings(
        kill=args.kill,
        auto=args.auto,
        repeat=args.repeat,
        mode=args.mode,
        seed=args.seed if args.seed is not None else secrets.randbelow(1 << 31),
        pages=args.pages,
        timeout=args.timeout,
        site=args.site or "",
        pace=args.pace,
        page_retries=args.page_retries,
        concurrency=args.concurrency,
        witness_ttl=args.witness_ttl,
        primary=args.primary or "",
        standby=args.standby or "",
        kill_cmd=args.kill_cmd or "",
        start_cmd=args.start_cmd or "",
        command_timeout=args.command_timeout,
        keys=keys,
        tls_ca=args.tls_ca,
        callback_host=args.callback_host,
        keep=args.keep,
    )


def cluster_settings(args: argparse.Namespace) -> ClusterDrillSettings:
    """The cluster drill ``args`` ask for (``--local --pairs N`` or ``--cluster URL``);
    ValueError names what is wrong with them."""
    from pagesift.core.cluster.registryrules import parse_cluster_url
    from pagesift.drill.clusterrun import ClusterDrillSettings
    from pagesift.drill.fixture import DrillKeys, SetupError
    from pagesift.drill.remote import check_template

    if args.cluster:
        if args.local or args.primary or args.standby or args.pairs:
            raise ValueError("--cluster drills a running cluster: no --local, --pairs, --primary")
        try:
            parse_cluster_url(args.cluster)
        except ValueError as err:
            raise ValueError(f"--cluster: {err}") from None
        if not args.kill_cmd or not args.start_cmd:
            raise ValueError("a --cluster drill needs --kill-cmd and --start-cmd")
        try:
            check_template("--kill-cmd", args.kill_cmd)
            check_template("--start-cmd", args.start_cmd)
        except SetupError as err:
            raise ValueError(str(err)) from None
    elif not args.local:
        raise ValueError("--pairs goes with --local")
    if args.kill != "primary" or args.repeat != 1:
        raise ValueError("a cluster drill kills one primary once (no --kill, --repeat)")
    if args.pages < 20:
        raise ValueError("--pages must be at least 20 (the kill lands at 10-70 % of the crawl)")
    keys = (
        DrillKeys(args.api_key, args.admin_key, args.webhook_secret)
        if args.cluster
        else DrillKeys.fresh()
    )
    return ClusterDrillSettings(
        pairs=args.pairs or 3,
        cluster=args.cluster or "",
        mode=args.mode,
        seed=args.seed if args.seed is not None else secrets.randbelow(1 << 31),
        pages=args.pages,
        timeout=args.timeout,
        pace=args.pace,
        concurrency=args.concurrency,
        per_host=args.per_host_limit or 2,
        per_host_limit=args.per_host_limit if args.cluster else None,
        page_retries=args.page_retries,
        witness_ttl=args.witness_ttl,
        kill_cmd=args.kill_cmd or "",
        start_cmd=args.start_cmd or "",
        command_timeout=args.command_timeout,
        keys=keys,
        tls_ca=args.tls_ca,
        callback_host=args.callback_host,
        keep=args.keep,
    )


def _cmd_cluster_drill(args: argparse.Namespace) -> int:
    from pagesift.core.util.children import kill_leftovers
    from pagesift.drill.clusterrun import run_cluster_drill
    from pagesift.drill.clusterverdict import cluster_json, cluster_lines
    from pagesift.drill.fixture import SetupError

    try:
        settings = cluster_settings(args)
    except ValueError as err:
        return fail(str(err))

    async def drill() -> Any:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await run_cluster_drill(settings, _say)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        report = asyncio.run(drill())
    except SetupError as err:
        return fail(f"drill: {err}", exit=EXIT_FAILED)
    except asyncio.CancelledError:
        return fail("drill: interrupted", exit=EXIT_INTERRUPTED, code="INTERRUPTED")
    finally:
        kill_leftovers()
    if args.json:
        out = cluster_json(report)
        out["seed"] = settings.seed
        dump(out)
    else:
        for line in cluster_lines(report):
            print(line)
        print(f"(seed {settings.seed})")
    return EXIT_OK if report.passed else EXIT_RUN_FAILED


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _drill(settings: DrillSettings) -> list[Any]:
    from pagesift.drill.runner import run_drill

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        reports = await run_drill(settings, _say)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    if task is not None and task.cancelling():
        # a SIGINT or SIGTERM landed while a step waited inside code that ends quietly
        # on cancellation: the drill was still interrupted, and its verdict is not one
        raise asyncio.CancelledError
    return reports


def _cmd_drill(args: argparse.Namespace) -> int:
    missing = server_extra_missing("drill")
    if missing:
        return fail(missing, exit=EXIT_FAILED)
    if args.cluster or args.pairs:
        return _cmd_cluster_drill(args)
    from pagesift.core.util.children import kill_leftovers
    from pagesift.drill.fixture import SetupError
    from pagesift.drill.report import drill_json, run_lines, summary_line
    from pagesift.drill.verdict import summarize

    try:
        settings = drill_settings(args)
    except ValueError as err:
        return fail(str(err))
    try:
        reports = asyncio.run(_drill(settings))
    except SetupError as err:
        return fail(f"drill: {err}", exit=EXIT_FAILED)
    except asyncio.CancelledError:  # SIGTERM
        return fail("drill: interrupted", exit=EXIT_INTERRUPTED, code="INTERRUPTED")
    finally:
        kill_leftovers()
    summary = summarize(reports)
    if args.json:
        out = drill_json(reports, summary)
        out["summary"]["seed"] = settings.seed
        dump(out)
    else:
        for report in reports:
            for line in run_lines(report, settings.repeat):
                print(line)
        print(summary_line(summary) + f" (seed {settings.seed})")
    return EXIT_OK if summary.all_passed else EXIT_RUN_FAILED


def add_drill_command(sub: Any) -> None:
    p = sub.add_parser(
        "drill",
        parents=[credentials_parent()],
        help="rehearse a failover (kill, promote, rejoin) and print a verdict",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_argument_group("where")
    where.add_argument(
        "--local", action="store_true", help="start a pair of our own (temporary directories)"
    )
    where.add_argument(
        "--pairs", type=positive_int, metavar="N", help="--local: N pairs in one cluster"
    )
    where.add_argument(
        "--cluster", metavar="etcd://HOST:PORT/NAME", help="drill a running cluster of pairs"
    )
    where.add_argument(
        "--per-host-limit",
        type=positive_int,
        metavar="N",
        help="cluster drill: per_host_concurrency (--local: set on the nodes, default 2; "
        "--cluster: judge by N instead of what the nodes publish); the verdict reads the "
        "limit each node publishes in its registry record, the smallest of them",
    )
    where.add_argument("--primary", type=host_port, metavar="HOST:PORT", help="remote: primary")
    where.add_argument("--standby", type=host_port, metavar="HOST:PORT", help="remote: standby")
    where.add_argument(
        "--kill-cmd",
        metavar="CMD",
        help="remote: SIGKILLs {node}; placeholders: " + ", ".join(sorted(FIELDS)),
    )
    where.add_argument("--start-cmd", metavar="CMD", help="remote: starts {node} as {role}")
    where.add_argument(
        "--command-timeout",
        type=nonneg_float,
        default=120.0,
        metavar="S",
        help="remote: seconds a command may take (default 120)",
    )
    where.add_argument(
        "--webhook-secret",
        default=os.environ.get("PAGESIFT_WEBHOOK_SECRET", ""),
        help="remote: the --api-key account's webhook_secret, to verify signatures "
        "(default: $PAGESIFT_WEBHOOK_SECRET; none: not verified)",
    )
    where.add_argument(
        "--callback-host",
        default="127.0.0.1",
        metavar="HOST",
        help="where the demo site and the webhook receiver listen (default 127.0.0.1)",
    )
    what = p.add_argument_group("what")
    what.add_argument(
        "--auto", action="store_true", help="the witness (etcd) promotes, not the drill"
    )
    what.add_argument("--kill", choices=KILL_TARGETS, default="primary")
    what.add_argument("--repeat", type=positive_int, default=1, metavar="N")
    what.add_argument(
        "--mode",
        choices=MODES,
        default="async",
        help="replication mode (local: the pair runs in it; remote: what it runs)",
    )
    what.add_argument("--seed", type=int, metavar="N", help="the kill points' seed")
    what.add_argument(
        "--site", metavar="URL", help="crawl this site instead of the demo site (limit --pages)"
    )
    what.add_argument(
        "--pages", type=positive_int, default=100, metavar="N", help="demo site size (100)"
    )
    what.add_argument(
        "--pace",
        type=nonneg_float,
        default=0.03,
        metavar="S",
        help="the crawl's delay between two requests (default 0.03)",
    )
    what.add_argument("--concurrency", type=positive_int, default=8, metavar="N")
    what.add_argument(
        "--page-retries",
        type=nonneg_int,
        metavar="N",
        help="the crawl's retries of a page's transient failures (default: the server's)",
    )
    what.add_argument(
        "--witness-ttl",
        type=nonneg_float,
        default=5.0,
        metavar="S",
        help="--local --auto: the lease's ttl (default 5)",
    )
    what.add_argument(
        "--timeout",
        type=nonneg_float,
        default=180.0,
        metavar="S",
        help="bound on one run (default 180)",
    )
    what.add_argument("--keep", action="store_true", help="keep the working directory")
    what.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_drill, uses_client=False)
