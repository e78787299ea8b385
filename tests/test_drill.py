"""``pagesift drill``: the verdict's rules on plain values, then real drills.

The unit tests feed ``pagesift.drill.verdict`` hand-made observations (no
process, no clock) and pin every definition the drill reports by: which re-send is an
acknowledged one and which the one in flight, what a lost page and an undone event
are, the sync and async pass rules. The end-to-end tests run the real command as a
child process (``python -m pagesift.cli drill ... --json``) with ``TMPDIR`` inside
the test's ``tmp_path``, so they can check afterwards that the drill left neither a
directory nor a process behind: a local manual drill in async and in sync mode, a
witness (etcd) outage (the drill whose witness promotes runs in ``make bench``), a remote
drill whose nodes are killed and started by shell commands acting on pid files, a
remote drill whose start command fails (exit 2, the surviving node untouched), and a
drill interrupted by SIGINT (everything it started is stopped). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pagesift import cli
from pagesift.cli import drill as drill_cli
from pagesift.drill import runner
from pagesift.drill.report import drill_json, run_lines, summary_line
from pagesift.drill.verdict import (
    Delivery,
    DocKey,
    FinalJob,
    Observation,
    Probe,
    duplicate_urls,
    judge,
    kill_point,
    pages_lost,
    resends,
    rto,
    site_check,
    summarize,
    webhook_tally,
    write_outage,
)
from tests.helpers import ADMIN_KEY, ALICE, PAIR_TOKEN_FILE, free_port, write_accounts

ROOT = "http://127.0.0.1:9000"

# ---------------------------------------------------------------- building observations


def doc(i: int, path: str | None = None, fetched: int | None = None) -> DocKey:
    return DocKey(i, f"{ROOT}/{path or f'p{i}'}", fetched if fetched is not None else 1000 + i)


def delivery(seq: int, event: str = "page", eid: str = "", **data: Any) -> Delivery:
    if event == "page" and not data:
        data = {"index": seq - 1, "url": f"{ROOT}/p{seq - 1}"}
    return Delivery(eid or f"e{seq}", "job", seq, event, data, acked=True, signed=True)


def stream(n_pages: int) -> list[Delivery]:
    """started, n pages, completed: each once, in order (seqs 0..n+1)."""
    return [delivery(0, "started"), *(delivery(s) for s in range(1, n_pages + 1)),
            delivery(n_pages + 1, "completed")]  # fmt: skip


def final(n_pages: int, state: str = "completed") -> FinalJob:
    return FinalJob(state, [doc(i) for i in range(n_pages)], [])


def observation(mode: str = "async", **kw: Any) -> Observation:
    values: dict[str, Any] = {
        "run": 1, "mode": mode, "auto": False, "kill": "primary", "killed": "a:1",
        "survivor": "b:2", "kill_after_pages": 3, "job_id": "job", "kill_at": 10.0,
        "probes": [Probe(10.2, False, "FAILED_PRECONDITION"), Probe(10.5, True)],
        "shown": [doc(i) for i in range(4)], "final": final(5),
        "deliveries": stream(5), "digests_equal": True, "digest_offset": 99,
        "resync": "continue", "discarded": 0, "rejoined": "a:1",
    }  # fmt: skip
    values.update(kw)
    return Observation(**values)


# ---------------------------------------------------------------- pages


def test_a_shown_document_is_lost_when_the_final_job_no_longer_holds_that_very_document() -> None:
    shown = [doc(0), doc(1), doc(2)]
    # index 2 was redone by the new primary: another page at 2, and p2 fetched again later
    after = [doc(0), doc(1), doc(2, "p7", 2000), doc(3, "p2", 3000)]
    assert pages_lost(shown, after) == [doc(2)]
    assert pages_lost(shown, [*shown, doc(3)]) == []


def test_duplicates_and_the_site_check_compare_page_keys() -> None:
    docs = [doc(0, "a"), doc(1, "b/"), doc(2, "b"), doc(3, "c#frag")]
    assert duplicate_urls(docs) == {f"{ROOT}/b": 2}
    required = frozenset({f"{ROOT}/a", f"{ROOT}/b", f"{ROOT}/c", f"{ROOT}/d"})
    check = site_check(docs, required, optional=frozenset())
    assert check.missing == (f"{ROOT}/d",) and check.unexpected == () and not check.ok
    extra = site_check([*docs, doc(4, "slow"), doc(5, "x")], required, frozenset({f"{ROOT}/slow"}))
    assert extra.unexpected == (f"{ROOT}/x",)


def test_rto_is_kill_to_first_accepted_write_and_a_witness_outage_is_refusal_to_acceptance() -> (
    None
):
    probes = [Probe(9.0, True), Probe(10.1, False), Probe(10.3, False), Probe(11.0, True)]
    assert rto(10.0, probes) == pytest.approx(1.0)
    assert rto(10.0, probes[:3]) is None
    read_only, outage = write_outage(10.0, probes)
    assert read_only == pytest.approx(0.1) and outage == pytest.approx(0.9)
    assert write_outage(10.0, [Probe(10.5, True)]) == (None, None)  # never refused
    assert write_outage(10.0, probes[:3])[1] is None  # never back


def test_kill_points_fall_between_ten_and_seventy_percent() -> None:
    assert kill_point(100, 0.0) == 10
    assert kill_point(100, 0.999999) == 70
    assert all(10 <= kill_point(100, d / 100) <= 70 for d in range(100))
    assert kill_point(5, 0.0) == 1 and kill_point(5, 0.999) == 3


# ---------------------------------------------------------------- webhooks


def test_an_acknowledged_event_resent_after_a_later_one_arrived_is_resent_not_in_flight() -> None:
    # the old primary delivered 0..9 (all 2xx) and died; the new primary resumes at 7:
    # 7 and 8 had been passed (8 and 9 arrived after their 2xx): their acks were recorded
    # and lost with the failover. 9 was the last one: its 2xx may never have been seen.
    old = [delivery(s, "started" if s == 0 else "page") for s in range(10)]
    again = [delivery(7), delivery(8), delivery(9), delivery(10)]
    assert resends([*old, *again]) == (2, 1)
    # a retry of an event that never got a 2xx is neither
    unacked = Delivery("e3", "job", 3, "page", {}, acked=False, signed=True)
    assert resends([*old[:3], unacked, delivery(3)]) == (0, 0)
    # a restart that resumes exactly at the event in flight
    assert resends([*old, delivery(9)]) == (0, 1)


def test_webhook_tally_counts_lost_and_undone_events() -> None:
    complete = stream(5)
    tally = webhook_tally(final(5), complete)
    assert (tally.expected, tally.lost, tally.undone, tally.resent) == (7, 0, 0, 0)
    # page 3's event never came: lost
    assert webhook_tally(final(5), [d for d in complete if d.seq != 4]).lost == 1
    # an event about a page that the failover undid (another page holds its index now)
    ghost = delivery(9, eid="ghost", index=2, url=f"{ROOT}/gone")
    assert webhook_tally(final(5), [*complete, ghost]).undone == 1
    # the same page event issued twice under two ids (before and after a failover)
    twin = delivery(4, eid="twin")
    assert webhook_tally(final(5), [*complete, twin]).undone == 1
    bad = Delivery("e1", "job", 1, "page", complete[1].data, acked=True, signed=False)
    assert webhook_tally(final(5), [*complete, bad]).bad_signatures == 1
    failed = FinalJob("completed", [doc(0)], [f"{ROOT}/404"])
    events = [delivery(0, "started"), delivery(1), delivery(2, "completed")]
    assert webhook_tally(failed, events).lost == 1  # its page_failed never came
    pf = delivery(3, "page_failed", url=f"{ROOT}/404")
    assert webhook_tally(failed, [*events, pf]).lost == 0


# ---------------------------------------------------------------- the verdict


def test_a_clean_run_passes_in_both_modes() -> None:
    for mode in ("async", "sync"):
        report = judge(observation(mode))
        assert report.passed, report.failures
        assert report.rto_s == pytest.approx(0.5)
        assert (report.pages_lost, report.duplicates, report.webhooks.lost) == (0, 0, 0)


def test_sync_mode_fails_on_one_lost_page_or_one_acknowledged_resend() -> None:
    lost = observation("sync", final=FinalJob("completed", [doc(0), doc(1), doc(5)], []))
    assert not judge(lost).passed
    assert any("shown pages lost" in f for f in judge(lost).failures)
    resent = observation("sync", deliveries=[*stream(5), delivery(2)])
    r = judge(resent)
    assert r.webhooks.resent == 1 and not r.passed
    assert any("acknowledged webhook events re-sent" in f for f in r.failures)
    in_flight = observation("sync", deliveries=[*stream(5), delivery(6, "completed")])
    assert judge(in_flight).passed  # the one event in flight may come twice
    twice = observation("sync", deliveries=[*stream(5), *[delivery(6, "completed")] * 2])
    assert not judge(twice).passed
    assert not judge(observation("sync", sync_degraded=True)).passed


def test_async_mode_allows_exactly_what_the_lag_window_held() -> None:
    # shown p3 lost, and acknowledged event 2 re-sent: two writes the standby lacked
    lossy: dict[str, Any] = {
        "final": FinalJob("completed", [doc(0), doc(1), doc(2), doc(3, "p3", 5000), doc(4)], []),
        "deliveries": [*stream(5), delivery(2)],
    }
    report = judge(observation("async", discarded=2, **lossy))
    assert (report.pages_lost, report.webhooks.resent, report.allowed) == (1, 1, 2)
    assert report.passed, report.failures
    over = judge(observation("async", discarded=1, **lossy))
    assert not over.passed and any("exceed" in f for f in over.failures)
    assert not judge(observation("sync", discarded=2, **lossy)).passed


def test_every_general_check_fails_the_run() -> None:
    assert not judge(observation(digests_equal=False)).passed
    assert not judge(observation(digests_equal=None)).passed
    assert not judge(observation(resync="unknown")).passed
    assert not judge(observation(probes=[Probe(10.2, False)])).passed
    assert not judge(observation(final=final(5, "failed"))).passed
    dup = FinalJob("completed", [*final(5).documents, doc(5, "p1")], [])
    assert judge(observation(final=dup)).duplicates == 1
    assert not judge(observation(final=dup)).passed
    missing = observation(required_urls=frozenset({f"{ROOT}/p{i}" for i in range(6)}))
    assert not judge(missing).passed
    assert judge(observation(required_urls=frozenset({f"{ROOT}/p{i}" for i in range(5)}))).passed
    lost_event = observation(deliveries=[d for d in stream(5) if d.seq != 3])
    assert judge(lost_event).webhooks.lost == 1 and not judge(lost_event).passed
    assert not judge(observation(problems=["the crawl did not end in time"])).passed


def test_a_witness_kill_must_make_the_primary_read_only_within_its_ttl() -> None:
    base: dict[str, Any] = {"kill": "witness", "auto": True, "witness_ttl": 2.0, "resync": "none"}
    ok = [Probe(10.1, True), Probe(11.5, False), Probe(14.0, True)]
    report = judge(observation(probes=ok, **base))
    assert report.passed, report.failures
    assert report.read_only_after_s == pytest.approx(1.5) and report.rto_s == pytest.approx(2.5)
    slow = [Probe(10.1, True), Probe(13.5, False), Probe(14.0, True)]
    assert not judge(observation(probes=slow, **base)).passed
    never = [Probe(10.1, True), Probe(14.0, True)]
    assert not judge(observation(probes=never, **base)).passed


def test_the_report_prints_one_json_object_and_a_text_summary() -> None:
    reports = [judge(observation()), judge(observation(digests_equal=False))]
    out = drill_json(reports, summarize(reports))
    assert json.loads(json.dumps(out)) == out
    run = out["runs"][0]
    for key in ("rto_s", "lag_at_kill", "pages_lost", "duplicates", "webhook_events_lost",
                "webhook_events_resent", "digests_equal", "resync", "passed"):  # fmt: skip
        assert key in run, key
    assert out["summary"]["passed"] == 1 and out["summary"]["all_passed"] is False
    assert run_lines(reports[0], 2)[0].endswith("PASSED")
    assert any("FAILED: digests differ" in line for line in run_lines(reports[1], 2))
    assert "1 FAILED" in summary_line(summarize(reports))


# ---------------------------------------------------------------- usage


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give either --local or --primary"),
        (["--local", "--kill", "witness"], "--kill witness needs --auto"),
        (["--local", "--kill-cmd", "true"], "are for a remote drill"),
        (["--primary", "127.0.0.1:1", "--standby", "127.0.0.1:2"], "a remote drill needs"),
        (
            [
                "--primary",
                "127.0.0.1:1",
                "--standby",
                "127.0.0.1:2",
                "--kill-cmd",
                "kill {pid}",
                "--start-cmd",
                "true",
            ],
            "unknown placeholder {pid}",
        ),
        (["--local", "--pages", "5"], "--pages must be at least 20"),
    ],
)
def test_usage_errors_exit_2_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["drill", *argv]) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- real drills

DRILL_TIMEOUT = 120.0  # each drill below takes 10-25 s


def _ours(tmp: Path) -> list[int]:
    """Live processes whose command line mentions ``tmp`` (what a test started)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if str(tmp) in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _assert_clean(tmp: Path) -> None:
    deadline = time.monotonic() + 10
    while _ours(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _ours(tmp), "the drill left processes behind"
    assert not list(tmp.glob("pagesift-drill-*")), "the drill left its directory behind"


@pytest.fixture
def drill_tmp(tmp_path: Path) -> Path:
    """The drill's TMPDIR: what it creates lands here, and is checked gone after."""
    d = tmp_path / "drilltmp"
    d.mkdir()
    return d


def drill(drill_tmp: Path, *argv: str) -> tuple[int, dict[str, Any], str]:
    env = dict(os.environ, TMPDIR=str(drill_tmp), PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, "-m", "pagesift.cli", "drill", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=DRILL_TIMEOUT,
    )
    out: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, out, done.stderr


def check_run(run: dict[str, Any], *, kill: str) -> None:
    """What every run of a healthy pair shows, whatever the mode."""
    assert run["passed"], (run["failures"], run)
    assert run["kill"] == kill and run["job_state"] == "completed"
    site = run["site"]
    assert site is not None and not site["missing"] and not site["unexpected"]
    assert 0.1 * site["expected"] - 1 <= run["kill_after_pages"] <= 0.7 * site["expected"]
    assert run["pages_shown"] >= run["kill_after_pages"]  # the watcher saw the crawl
    assert run["duplicates"] == 0 and run["webhook_events_lost"] == 0
    hooks = run["webhook_events"]
    assert hooks["signatures_verified"] and hooks["bad_signatures"] == 0
    assert hooks["expected"] >= site["expected"] + 2  # started, every page, completed
    assert run["digests_equal"] is True and run["digest_offset"] > 0
    assert run["rto_s"] is not None and 0 < run["rto_s"] < 30
    assert isinstance(run["lag_at_kill"]["offsets"], int)


# One retry of a page's transient failure (the demo site's slow and failing pages): the
# server's default three, 0.5 s apart and doubling, would add seconds to each crawl's end.
RETRIES = ("--page-retries", "1")
LOCAL = ("--local", "--pages", "60", *RETRIES, "--json")


@pytest.mark.system
def test_a_local_async_drill_kills_the_primary_promotes_and_rejoins(drill_tmp: Path) -> None:
    code, out, err = drill(drill_tmp, *LOCAL, "--seed", "5", "--repeat", "2")
    assert code == 0, err[-3000:]
    runs = out["runs"]
    assert len(runs) == 2 and out["summary"]["all_passed"] and out["summary"]["seed"] == 5
    for run in runs:
        check_run(run, kill="primary")
        assert run["resync"] in ("continue", "full") and run["discarded"] >= 0
        assert run["allowed"] == run["discarded"]  # async: the lag window is the bound
        assert run["pages_lost"] + run["webhook_events_resent"] <= run["discarded"]
    # the roles alternate: the second run kills the node the first one promoted
    assert runs[1]["killed"] == runs[0]["survivor"] and runs[1]["survivor"] == runs[0]["killed"]
    assert "promoted" in err
    _assert_clean(drill_tmp)


@pytest.mark.system
def test_a_local_sync_drill_loses_no_shown_page_and_resends_no_acknowledged_event(
    drill_tmp: Path,
) -> None:
    code, out, err = drill(drill_tmp, *LOCAL, "--mode", "sync", "--seed", "8")
    assert code == 0, err[-3000:]
    (run,) = out["runs"]
    check_run(run, kill="primary")
    assert run["mode"] == "sync" and run["allowed"] is None
    assert run["pages_lost"] == 0 and run["webhook_events_resent"] == 0
    assert run["webhook_events"]["undone"] == 0
    assert run["webhook_events"]["in_flight_resent"] <= 1
    _assert_clean(drill_tmp)


# The drill whose witness elects the standby after a SIGKILL of the primary (``--auto
# --kill primary``) runs in ``make bench`` (the failover section's witness kind: 20 runs
# that must all pass the drill's checks, and "promoted" never in its stderr): the pair's
# takeover and rejoin stay covered here by tests/test_witness.py's SIGKILL test, and the
# drill's ``--auto`` pair (etcd, witness command lines, clean-up) by the dead-witness
# drill below.


@pytest.mark.system
def test_auto_drill_a_dead_witness_makes_the_primary_read_only_until_it_returns(
    drill_tmp: Path,
) -> None:
    code, out, err = drill(
        drill_tmp, *LOCAL, "--auto", "--kill", "witness", "--witness-ttl", "2", "--seed", "4"
    )
    assert code == 0, err[-3000:]
    (run,) = out["runs"]
    check_run(run, kill="witness")
    assert run["read_only_after_s"] is not None and run["read_only_after_s"] <= 2 + 1
    _assert_clean(drill_tmp)


# ---------------------------------------------------------------- remote: operator commands


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two nodes run by shell scripts on pid files, as an operator's would be: start.sh
    NODE ROLE PRIMARY starts NODE in the background, kill.sh NODE SIGKILLs it. Every
    node still running at the end is SIGKILLed (by its pid file)."""
    d = tmp_path / "deploy"
    d.mkdir()
    accounts = write_accounts(d / "accounts.toml", [ALICE])
    addresses = {}
    for node in ("primary", "standby"):
        addresses[node] = f"127.0.0.1:{free_port()}"
        (d / f"{node}.addr").write_text(addresses[node])
        (d / f"{node}.toml").write_text(
            "[server]\nallow_private_networks = true\nread_timeout = 1.0\n"
            "connect_timeout = 1.0\nmax_body_bytes = 1048576\nextract_processes = 1\n"
            f'accounts_file = "{accounts}"\nreplication_token_file = "{PAIR_TOKEN_FILE}"\n'
            "webhook_base_delay = 0.05\nwebhook_max_delay = 0.5\nwebhook_max_attempts = 100\n"
        )
    py = shlex.quote(sys.executable)
    (d / "start.sh").write_text(
        'd=$(dirname "$0"); node=$1; role=$2; primary=$3\n'
        'follow=""; [ "$role" = standby ] && follow="--primary $primary"\n'
        f'{py} -m pagesift.cli serve --role "$role" $follow --listen "$(cat "$d/$node.addr")"'
        ' --data "$d/$node" --config "$d/$node.toml" >> "$d/$node.log" 2>&1 &\n'
        'echo $! > "$d/$node.pid"\n'
    )
    (d / "kill.sh").write_text('d=$(dirname "$0"); kill -9 "$(cat "$d/$1.pid")"\n')
    start = ["sh", str(d / "start.sh")]
    subprocess.run([*start, "primary", "primary", ""], check=True, timeout=10)
    subprocess.run([*start, "standby", "standby", addresses["primary"]], check=True, timeout=10)
    try:
        yield {"dir": d, **addresses}
    finally:
        for pidfile in d.glob("*.pid"):
            pid = int(pidfile.read_text())
            if pid in _ours(d):
                os.kill(pid, signal.SIGKILL)


def remote_args(dep: dict[str, Any], start_cmd: str) -> list[str]:
    d = dep["dir"]
    return [
        "--primary", dep["primary"], "--standby", dep["standby"],
        "--kill-cmd", f"sh {shlex.quote(str(d / 'kill.sh'))} {{node}}",
        "--start-cmd", start_cmd,
        "--api-key", ALICE.key, "--admin-key", ADMIN_KEY, "--webhook-secret", ALICE.secret,
        "--pages", "60", *RETRIES, "--json",
    ]  # fmt: skip


@pytest.mark.system
def test_a_remote_drill_kills_and_restarts_nodes_with_the_operators_commands(
    deployment: dict[str, Any], drill_tmp: Path
) -> None:
    d = deployment["dir"]
    start = f"sh {shlex.quote(str(d / 'start.sh'))} {{node}} {{role}} {{primary}}"
    old_pid = int((d / "primary.pid").read_text())
    code, out, err = drill(drill_tmp, *remote_args(deployment, start), "--seed", "2")
    assert code == 0, err[-3000:]
    (run,) = out["runs"]
    check_run(run, kill="primary")
    assert run["killed"] == deployment["primary"] and run["survivor"] == deployment["standby"]
    assert run["resync"] in ("continue", "full")
    # the kill command really killed it (SIGKILL by its pid), the start command restarted it
    new_pid = int((d / "primary.pid").read_text())
    assert new_pid != old_pid and old_pid not in _ours(d) and new_pid in _ours(d)
    assert "--role standby --primary" in " ".join(
        (Path("/proc") / str(new_pid) / "cmdline").read_bytes().decode().split("\0")
    )
    assert not list(drill_tmp.glob("pagesift-drill-*"))  # the deployment runs on: not ours


@pytest.mark.system
def test_a_remote_drill_whose_start_command_fails_exits_5_and_leaves_the_survivor_alone(
    deployment: dict[str, Any], drill_tmp: Path
) -> None:
    d = deployment["dir"]
    standby_pid = int((d / "standby.pid").read_text())
    code, out, err = drill(drill_tmp, *remote_args(deployment, "exit 3"), "--seed", "2")
    assert code == 5, err[-3000:]  # EXIT_FAILED: the drill could not set up
    assert out["error"]["code"] == "FAILED" and out["error"]["exit"] == 5  # --json
    assert "start command (primary) exited with status 3" in out["error"]["message"]
    assert standby_pid in _ours(d)  # never touched but through the commands
    assert not list(drill_tmp.glob("pagesift-drill-*"))


@pytest.mark.system
def test_an_interrupted_drill_stops_everything_it_started(drill_tmp: Path) -> None:
    env = dict(os.environ, TMPDIR=str(drill_tmp), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagesift.cli", "drill", *LOCAL, "--pace", "0.2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        line = ""
        while "crawl" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()  # "run 1: crawl ... on node a; ..."
        assert "crawl" in line, "the drill never started its crawl"
        assert len(_ours(drill_tmp)) >= 2  # both nodes (and their workers) are up
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    _assert_clean(drill_tmp)


def test_a_drill_whose_step_swallows_the_cancel_still_ends_interrupted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal that lands while a step waits in code that ends quietly on cancellation
    (so ``run_drill`` returns) still ends the drill as interrupted, not with a verdict."""

    async def swallowing(settings: Any, say: Any) -> list[Any]:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        return []

    monkeypatch.setattr(runner, "run_drill", swallowing)

    async def main() -> None:
        task = asyncio.create_task(drill_cli._drill(None))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        task.cancel()  # what the SIGINT/SIGTERM handlers do
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)

    asyncio.run(main())
