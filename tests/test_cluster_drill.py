"""The cluster drill (``pagesift drill --local --pairs N``): its verdict, then a real one.

The unit tests feed ``pagesift.drill.clusterverdict`` hand-made observations (no
process, no clock): what fails a pair (a lost page outside the killed pair's lag
window, a duplicate, a breach of the per-host limit, no write after the kill). The
system test runs the real command as a child process with ``TMPDIR`` in the test's
``tmp_path``: three pairs (six nodes and an etcd), the primary of one SIGKILLed
mid-crawl, and checks the verdict's fields, then that nothing was left behind; and the
same drill against running pairs (``--cluster``), whose nodes shell scripts start and
SIGKILL by their port, as an operator's commands would.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pagesift import cli
from pagesift.client.registryview import ClusterView
from pagesift.core.util.children import free_port
from pagesift.drill.clusterverdict import (
    NO_LIMIT,
    PairObservation,
    choose_limit,
    cluster_json,
    cluster_lines,
    judge_cluster,
    judge_pair,
)
from pagesift.drill.fixture import Etcd
from pagesift.drill.verdict import DocKey, FinalJob, Probe
from tests.helpers import PAIR_TOKEN_FILE, eventually
from tests.test_drill import _assert_clean, _ours

URLS = [f"http://127.0.0.1:9/p{i}" for i in range(4)]
DOCS = [DocKey(i, u, 100 + i) for i, u in enumerate(URLS)]


def _obs(pair: str = "a", **kw: Any) -> PairObservation:
    base: dict[str, Any] = {
        "site": "http://127.0.0.1:9/",
        "limit": 2,
        "peak": 2,
        "job_id": f"{pair}.u",
        "required": frozenset(URLS),
        "shown": DOCS[:2],
        "final": FinalJob("completed", DOCS, []),
    }
    base.update(kw)
    return PairObservation(pair, **base)


def _killed(**kw: Any) -> PairObservation:
    base: dict[str, Any] = {
        "killed": True,
        "kill_at": 10.0,
        "probes": [Probe(9.0, True), Probe(11.5, True)],
        "rejoined": True,
        "discarded": 1,
    }
    return _obs("k", **{**base, **kw})


def test_a_clean_cluster_run_passes_and_reports_rto_for_the_killed_pair_only() -> None:
    report = judge_cluster([_obs("a"), _killed(), _obs("b")], "async")
    assert report.passed and report.politeness_held and report.killed_pair == "k"
    out = cluster_json(report)
    assert [p["rto_s"] for p in out["pairs"]] == [None, 1.5, None]
    assert {p["max_concurrent_per_host"] for p in out["pairs"]} == {2}
    assert cluster_lines(report)[-1].startswith("cluster drill: PASS (3 pairs")


def test_a_site_seeing_more_than_the_per_host_limit_fails_politeness() -> None:
    report = judge_cluster([_obs("a", peak=3), _killed()], "async")
    assert not report.politeness_held and not report.passed
    assert "politeness: 3 requests at once" in report.pairs[0].failures[0]


def test_the_killed_pair_may_lose_its_lag_window_and_no_other_pair_may_lose_a_page() -> None:
    shown_then_gone = [*DOCS[:2], DocKey(2, URLS[2], 1)]  # index 2 was re-fetched
    assert judge_pair(_killed(shown=shown_then_gone), "async").passed  # 1 <= discarded 1
    assert not judge_pair(_killed(shown=shown_then_gone), "sync").passed
    other = judge_pair(_obs(shown=shown_then_gone), "async")
    assert other.pages_lost == 1 and not other.passed


def test_a_duplicate_a_missing_page_or_no_write_after_the_kill_fails_the_pair() -> None:
    dup = FinalJob("completed", [*DOCS, DocKey(4, URLS[0], 9)], [])
    assert judge_pair(_obs(final=dup), "async").duplicates == 1
    assert not judge_pair(_obs(final=dup), "async").passed
    short = FinalJob("completed", DOCS[:3], [])
    assert judge_pair(_obs(final=short), "async").missing == 1
    never = judge_pair(_killed(probes=[Probe(11.0, False)]), "async")
    assert never.rto_s is None and "no write was accepted after the kill" in never.failures
    assert not judge_pair(_killed(rejoined=False), "async").passed
    assert not judge_pair(_obs(final=FinalJob("failed", DOCS, [])), "async").passed


# ---------------------------------------------------------------- the per-host limit


def test_the_limit_judged_is_the_smallest_the_nodes_publish_and_disagreement_is_reported() -> None:
    same = choose_limit({"a/1": 2, "a/2": 2, "b/1": 2})
    assert (same.limit, same.source, same.notes, same.disagree) == (2, "nodes", (), False)
    mixed = choose_limit({"a/1": 8, "a/2": 2, "b/1": 4, "b/2": 0})
    assert mixed.limit == 2 and mixed.source == "nodes" and mixed.disagree
    assert mixed.unpublished == ("b/2",) and "b/2" not in mixed.published
    disagree, silent = mixed.notes
    assert "disagree" in disagree and "2 on a/2; 4 on b/1; 8 on a/1" in disagree
    assert "1 node(s) publish no per_host_concurrency" in silent and "b/2" in silent
    # the strictest node bounds every pair: a site at 3 breaks it, though a/1 allows 8
    obs = [_obs("a", peak=3, limit=None), _obs("b", peak=2, limit=None)]
    report = judge_cluster(obs, "async", mixed)
    assert [p.limit for p in report.pairs] == [2, 2]
    assert [p.polite for p in report.pairs] == [False, True] and not report.passed
    lines = cluster_lines(report)
    assert "per-host limit 2 (as the nodes publish it)" in lines
    assert any("disagree" in line for line in lines) and "politeness BROKEN" in lines[-1]
    out = cluster_json(report)["per_host_limit"]
    assert out["limit"] == 2 and out["source"] == "nodes" and out["nodes_disagree"]
    assert out["published"] == {"a/1": 8, "a/2": 2, "b/1": 4}
    assert out["unpublished"] == ["b/2"]


def test_an_explicit_limit_overrides_what_the_nodes_publish_and_the_report_says_so() -> None:
    given = choose_limit({"a/1": 2, "a/2": 2}, override=8)
    assert (given.limit, given.source) == (8, "override")
    assert given.notes == ("--per-host-limit 8 overrides the nodes' 2",)
    report = judge_cluster([_obs("a", peak=5, limit=None)], "async", given)
    assert report.passed and report.pairs[0].limit == 8
    assert "per-host limit 8 (from --per-host-limit)" in cluster_lines(report)
    assert choose_limit({"a/1": 2}, override=2).notes == ()  # agrees: nothing to say
    assert choose_limit({}, override=3).limit == 3  # older nodes, the operator knows
    with pytest.raises(ValueError):
        choose_limit({"a/1": 2}, override=0)


def test_without_a_published_or_given_limit_politeness_is_not_judged_and_fails() -> None:
    none = choose_limit({"a/1": 0, "a/2": 0})
    assert none.limit is None and none.source == "none"
    assert none.unpublished == ("a/1", "a/2") and NO_LIMIT in none.notes
    assert choose_limit({}).limit is None
    report = judge_cluster([_obs("a", limit=None), _killed(limit=None)], "async", none)
    assert report.politeness_held is None and not report.passed
    assert all(p.polite is None and NO_LIMIT in p.failures for p in report.pairs)
    lines = cluster_lines(report)
    assert "per-host limit unknown" in lines and "politeness not judged" in lines[-1]
    assert "(limit -)" in lines[0]
    assert cluster_json(report)["politeness_held"] is None
    # one pair broken and one unknown: broken
    mixed = judge_cluster([_obs("a", peak=3), _obs("b", limit=None)], "async")
    assert mixed.politeness_held is False


@pytest.mark.parametrize(
    ("argv", "override", "nodes_limit"),
    [
        (["--local", "--pairs", "2"], None, 2),
        (["--local", "--pairs", "2", "--per-host-limit", "3"], None, 3),  # set on the nodes
        (["--cluster", "etcd://127.0.0.1:2379/c", "--kill-cmd", "k", "--start-cmd", "s"], None, 2),
        (
            ["--cluster", "etcd://127.0.0.1:2379/c", "--kill-cmd", "k", "--start-cmd", "s",
             "--per-host-limit", "4"],
            4,
            4,
        ),
    ],
)  # fmt: skip
def test_the_per_host_limit_flag_overrides_only_a_remote_drills_verdict_and_only_if_given(
    argv: list[str], override: int | None, nodes_limit: int
) -> None:
    from pagesift.cli.drill import cluster_settings

    args = cli.build_parser().parse_args(["drill", *argv])
    settings = cluster_settings(args)
    assert settings.per_host_limit == override and settings.per_host == nodes_limit


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pairs", "3"], "--pairs goes with --local"),
        (["--cluster", "etcd://127.0.0.1:2379/c", "--local"], "no --local, --pairs"),
        (["--cluster", "etcd://127.0.0.1:2379/c"], "needs --kill-cmd and --start-cmd"),
        (
            ["--cluster", "http://127.0.0.1:2379/c", "--kill-cmd", "x", "--start-cmd", "y"],
            "--cluster:",
        ),
        (["--local", "--pairs", "3", "--kill", "standby"], "kills one primary once"),
        (["--local", "--pairs", "3", "--pages", "5"], "--pages must be at least 20"),
    ],
)
def test_cluster_drill_usage_errors_exit_2_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["drill", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.system
def test_a_local_three_pair_drill_kills_one_primary_and_every_pair_completes_politely(
    tmp_path: Path,
) -> None:
    drill_tmp = tmp_path / "drilltmp"
    drill_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(drill_tmp), PYTHONUNBUFFERED="1")
    argv = ["--local", "--pairs", "3", "--pages", "30", "--witness-ttl", "3", "--seed", "4"]
    argv += ["--page-retries", "1", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "pagesift.cli", "drill", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["passed"] and out["politeness_held"] and out["seed"] == 4
    pairs = out["pairs"]
    assert len(pairs) == 3 and len({p["pair"] for p in pairs}) == 3
    (killed,) = [p for p in pairs if p["killed"]]
    assert out["killed_pair"] == killed["pair"]
    assert killed["rto_s"] is not None and 0 < killed["rto_s"] < 30
    assert killed["pages_lost"] <= killed["allowed_lost"]
    for p in pairs:
        assert p["job_id"].startswith(p["pair"] + ".")  # placed on the pair that owns it
        assert p["job_state"] == "completed" and p["duplicates"] == 0
        assert p["missing"] == 0 and p["unexpected"] == 0 and p["documents"] > 20
        assert p["max_concurrent_per_host"] == p["per_host_limit"] == 2
        if not p["killed"]:
            assert p["rto_s"] is None and p["pages_lost"] == 0
    limit = out["per_host_limit"]  # what the nodes published: the --per-host-limit they ran
    assert limit["source"] == "nodes" and limit["limit"] == 2 and not limit["nodes_disagree"]
    assert len(limit["published"]) >= 3 and set(limit["published"].values()) == {2}
    assert "SIGKILL of its primary" in done.stderr
    _assert_clean(drill_tmp)
    assert not _ours(drill_tmp)
    assert not list(drill_tmp.glob("pagesift-cluster-drill-*"))


@pytest.fixture
def cluster_deployment(etcd: Etcd, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Three pairs of two ``serve --witness … --cluster drilled`` nodes, run by shell
    scripts on pid files: start.sh PORT (re)starts the node listening on PORT with its
    saved command line, kill.sh PORT SIGKILLs it. Every node still running at the end
    is SIGKILLed (by its pid file)."""
    d = tmp_path / "deploy"
    d.mkdir()
    config = d / "node.toml"
    config.write_text(
        "[server]\nallow_private_networks = true\nread_timeout = 1.0\nconnect_timeout = 1.0\n"
        "max_body_bytes = 1048576\nextract_processes = 1\nper_host_concurrency = 2\n"
        f'storage_reserve_bytes = 0\nreplication_token_file = "{PAIR_TOKEN_FILE}"\n'
    )
    py = shlex.quote(sys.executable)
    ports = []
    for pair in ("east", "west", "north"):
        for _ in range(2):
            port = free_port()
            ports.append(port)
            args = [
                "serve", "--witness", etcd.endpoint, "--pair", pair, "--cluster", "drilled",
                "--witness-ttl", "3", "--listen", f"127.0.0.1:{port}",
                "--advertise", f"127.0.0.1:{port}", "--data", str(d / str(port)),
                "--config", str(config),
            ]  # fmt: skip
            (d / f"{port}.args").write_text(shlex.join(args))
    (d / "start.sh").write_text(
        'd=$(dirname "$0")\n'
        f'{py} -m pagesift.cli $(cat "$d/$1.args") >> "$d/$1.log" 2>&1 &\n'
        'echo $! > "$d/$1.pid"\n'
    )
    (d / "kill.sh").write_text('d=$(dirname "$0"); kill -9 "$(cat "$d/$1.pid")"\n')
    for port in ports:
        subprocess.run(["sh", str(d / "start.sh"), str(port)], check=True, timeout=10)
    url = f"{etcd.endpoint}/drilled"
    try:

        async def up() -> bool | None:  # the deployment runs: three pairs, each of two
            view = ClusterView(url)
            try:
                await view.reread()
            finally:
                await view.close()
            pairs = view.pairs.values()
            return (
                True if len(pairs) == 3 and all(p.primary and p.standbys for p in pairs) else None
            )

        asyncio.run(eventually(up, "three pairs of two nodes", timeout=60))
        yield {"dir": d, "url": url}
    finally:
        for pidfile in d.glob("*.pid"):
            pid = int(pidfile.read_text())
            if pid in _ours(d):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.system
def test_a_cluster_drill_of_running_pairs_kills_and_restarts_with_the_operators_commands(
    cluster_deployment: dict[str, Any], tmp_path: Path
) -> None:
    d = cluster_deployment["dir"]
    drill_tmp = tmp_path / "drilltmp"
    drill_tmp.mkdir()
    pids = {p.stem: int(p.read_text()) for p in d.glob("*.pid")}
    argv = [
        "--cluster", cluster_deployment["url"],
        "--kill-cmd", f"sh {shlex.quote(str(d / 'kill.sh'))} {{port}}",
        "--start-cmd", f"sh {shlex.quote(str(d / 'start.sh'))} {{port}}",
        "--pages", "30", "--witness-ttl", "3", "--seed", "6",
        "--page-retries", "1", "--json",
    ]  # fmt: skip
    env = dict(os.environ, TMPDIR=str(drill_tmp), PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, "-m", "pagesift.cli", "drill", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["passed"] and out["politeness_held"]
    # no --per-host-limit: the verdict judges by the per_host_concurrency = 2 the nodes
    # run with and publish (the CLI's old default judged by 8)
    limit = out["per_host_limit"]
    assert limit["source"] == "nodes" and limit["limit"] == 2 and limit["notes"] == []
    assert set(limit["published"].values()) == {2}
    assert {name.split("/")[0] for name in limit["published"]} == {"east", "north", "west"}
    assert sorted(p["pair"] for p in out["pairs"]) == ["east", "north", "west"]
    (killed,) = [p for p in out["pairs"] if p["killed"]]
    assert killed["rto_s"] is not None and killed["pages_lost"] <= killed["allowed_lost"]
    for p in out["pairs"]:
        assert p["job_state"] == "completed" and p["duplicates"] == p["missing"] == 0
        assert p["max_concurrent_per_host"] <= p["per_host_limit"] == 2
    # exactly one node was killed by the command and started again by the other
    now = {p.stem: int(p.read_text()) for p in d.glob("*.pid")}
    restarted = [port for port in pids if now[port] != pids[port]]
    assert len(restarted) == 1 and pids[restarted[0]] not in _ours(d)
    assert now[restarted[0]] in _ours(d)
    assert "SIGKILL of its primary at 127.0.0.1:" in done.stderr
    assert "primary primary" not in done.stderr  # the remote label is the flag's name
    assert not list(drill_tmp.glob("pagesift-cluster-drill-*"))
