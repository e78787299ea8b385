"""The replication section's report: ``bench/out/replication.md`` and ``.json``.

``build_report`` turns the parts' results into one table of measures (one helper per part:
``_raw_rows``, ``_throughput_rows``, ``_crawl_rows``, ``_resync_rows``), one table of goals
(issue point 13: ``_throughput_goals``, ``_crawl_goals``), the method notes and the machine
facts, plus the JSON document (command, machine, numeric/string args, every raw result).
A part that did not run (``--repl-parts``) contributes nothing.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from bench.common import machine_facts, markdown_table
from bench.replication.workload import OPS_PER_GROUP

Row = list[str]


def build_report(
    args: argparse.Namespace, res: dict[str, Any], load_before: float
) -> dict[str, Any]:
    """``{"json": document, "markdown": text}`` for the results ``res`` of ``run``."""
    facts = {**machine_facts(), "loadavg_1m_before": load_before}
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *sys.argv[1:]])
    rows, goals = _rows_and_goals(args, res)
    md = [
        "## Replication",
        "",
        markdown_table(["measure", "figure", "compared with", "ratio"], rows),
        "",
    ]
    if goals:
        md += [
            "Goals (issue point 13):",
            "",
            markdown_table(["goal", "measured", "ratio", "verdict"], goals),
            "",
        ]
    md += _notes(facts, load_before, float(res["total_seconds"]), command)
    data = {
        "section": "replication",
        "command": command,
        "machine": facts,
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)},
        "results": res,
    }
    return {"json": data, "markdown": "\n".join(md)}


def _rows_and_goals(args: argparse.Namespace, res: dict[str, Any]) -> tuple[list[Row], list[Row]]:
    """The measures table (parts in run order) and the goals table."""
    refs = _Refs.of(res)
    rows = _raw_rows(res)
    goals: list[Row] = []
    if "throughput" in res:
        rows += _throughput_rows(args, res["throughput"], refs)
        goals += _throughput_goals(res["throughput"], refs)
    if "crawl" in res:
        rows += _crawl_rows(res["crawl"])
        goals += _crawl_goals(res["crawl"])
    if "resync" in res:
        rows += _resync_rows(args, res["resync"])
    return rows, goals


def _notes(facts: dict[str, Any], load_before: float, total_s: float, command: str) -> list[str]:
    """How the figures were taken, on what machine, by which command."""
    return [
        "Page group = 1 list push of ~16 KB + 1 set insert + 5 seen inserts + 5 frontier pushes "
        f"({OPS_PER_GROUP} ops). Raw stream: two processes, ~1 MB messages of payloads sized like "
        "serialized page-group LogEntry messages, one ack per message. Replicated figures: a "
        "primary driver process running the real write path, Log and ReplicationServicer, and "
        "a `pagesift serve --role standby`; offsets from AdminService.Role sampled every 20 ms. "
        "Lag ms = for each offset, first sampling round the standby had it minus first round "
        "the primary had it (resolution one round). Writer latency: paced writer on the "
        "primary's event loop; tick-to-commit includes waiting for the loop.",
        "",
        f"Machine: {facts['nproc']} CPUs ({facts['cpu_model']}), {facts['mem_total_gb']} GB, "
        f"Linux {facts['kernel']}, Python {facts['python']}; {facts['date']}; load average "
        f"{load_before:.2f} before the run; section took {_f(total_s)}s.",
        "",
        f"Command: `{command}`",
    ]


# ============================================================================ cells


def _f(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return f"{float(x):,.{digits}f}".replace(",", "")


def _goal(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**missed**")


def _row(measure: str, figure: str, compared: str = "", ratio: str = "") -> Row:
    return [measure, figure, compared, ratio]


def _lag_cell(lag: dict[str, Any]) -> str:
    """``p50 X ms / p99 Y ms; p50 A / p99 B offsets`` of a ``stats.lag_stats`` result."""
    return (
        f"p50 {_f(lag['lag_ms']['p50'])} ms / p99 {_f(lag['lag_ms']['p99'])} ms; "
        f"p50 {_f(lag['lag_offsets']['p50'])} / p99 {_f(lag['lag_offsets']['p99'])} offsets"
    )


def _promote_row(what: str, pr: dict[str, Any]) -> Row:
    return _row(
        f"promote after {what} (offset {pr['applied_offset']})",
        f"Promote {_f(pr['promote_rpc_ms'], 1)} ms; first write accepted at "
        f"{_f(pr['first_write_ms'], 1)} ms",
    )


# ============================================================================ 1: raw limits


@dataclass
class _Refs:
    """The raw limits the replicated figures are compared with (None: part not run)."""

    stream_eps: float | None  # raw stream entries/s
    rocks_full: Any  # raw rocksdict commits/s, data + log entry
    rocks_data: Any  # raw rocksdict commits/s, data keys only

    @classmethod
    def of(cls, res: dict[str, Any]) -> _Refs:
        rocks = {r["variant"]: r for r in res.get("raw_rocksdb", [])}
        stream = res.get("raw_stream")
        return cls(
            stream_eps=float(stream["entries_per_s"]) if stream is not None else None,
            rocks_full=rocks.get("data + log entry", {}).get("commits_per_s"),
            rocks_data=rocks.get("data keys", {}).get("commits_per_s"),
        )


def _raw_rows(res: dict[str, Any]) -> list[Row]:
    rows = [
        _row(
            f"raw rocksdict WriteBatch ({r['variant']})",
            f"{_f(r['commits_per_s'])} commits/s, {_f(r['ops_per_s'])} ops/s, "
            f"{_f(r['mb_per_s'])} MB/s",
        )
        for r in res.get("raw_rocksdb", [])
    ]
    if "raw_stream" in res:
        r = res["raw_stream"]
        rows.append(
            _row(
                "raw grpc.aio bidi stream (loopback, ~1 MB batches)",
                f"{_f(r['messages_per_s'])} msg/s, {_f(r['entries_per_s'])} entries/s "
                f"({_f(r['ops_per_s'])} ops/s), {_f(r['mb_per_s'])} MB/s",
            )
        )
    return rows


# ============================================================================ 2: throughput


def _throughput_rows(args: argparse.Namespace, t: dict[str, Any], refs: _Refs) -> list[Row]:
    ope = float(t["ops_per_entry"])
    alone = float(t["writer_alone_groups_per_s"])
    attached = float(t["writer_groups_per_s"])
    live = float(t["replicated_entries_per_s_live"])
    cu, wa = t["catchup"], t["writer_alone"]
    catch = float(cu["entries_per_s"])
    mb_per_entry = float(wa["data_mb"]) / max(1, int(wa["groups"]))
    full, eps = refs.rocks_full, refs.stream_eps
    cl, cc = t["cpu_us_per_entry_live"], cu["cpu_us_per_entry"]
    return [
        _row(
            "primary write path, no standby (Log.write on the event loop)",
            f"{_f(alone)} groups/s, {_f(alone * ope)} ops/s",
            "raw rocksdict (data + log entry)",
            _f(alone / full, 3) if full else "n/a",
        ),
        _row(
            f"primary write path, standby attached ({args.seconds:.0f}s burst)",
            f"{_f(attached)} groups/s, {_f(attached * ope)} ops/s",
            "no standby",
            _f(attached / alone, 3) if alone else "n/a",
        ),
        _row(
            "replicated during that burst (standby applied)",
            f"{_f(live)} entries/s, {_f(live * ope)} ops/s",
            "raw stream entries/s",
            _f(live / eps, 3) if eps else "n/a",
        ),
        _row(
            f"replicated, catch-up by continue ({cu['entries']} entries, no writer)",
            f"{_f(catch)} entries/s, {_f(catch * ope)} ops/s, ~{_f(catch * mb_per_entry)} MB/s",
            "raw stream entries/s",
            _f(catch / eps, 3) if eps else "n/a",
        ),
        _row(
            "CPU per entry (µs): primary / standby",
            f"writer alone {_f(wa['cpu_us_per_group'])} / -; burst attached "
            f"{_f(cl['primary'])} / {_f(cl['standby'])}; catch-up {_f(cc['primary'])} / "
            f"{_f(cc['standby'])}",
        ),
        _row(
            "lag during the burst (writer at max rate)",
            f"{_lag_cell(t['lag_during_burst'])}; {t['lag_at_burst_end']} behind at the end, "
            f"drained in {_f(t['drain_seconds'], 2)}s",
        ),
    ]


def _throughput_goals(t: dict[str, Any], refs: _Refs) -> list[Row]:
    """Replicated ops/s (the better of live and catch-up) against the raw limits."""
    ope = float(t["ops_per_entry"])
    best = max(float(t["replicated_entries_per_s_live"]), float(t["catchup"]["entries_per_s"]))
    eps, full, data_only = refs.stream_eps, refs.rocks_full, refs.rocks_data
    goals: list[Row] = []
    if eps:
        ratio = best / eps
        goals.append(
            [
                "replicated ops/s >= 50% of the raw stream",
                f"{_f(best * ope)} vs {_f(eps * ope)} ops/s",
                _f(ratio, 3),
                _goal(ratio >= 0.5),
            ]
        )
        if data_only:
            # No standby can apply faster than its storage engine writes the data.
            goals.append(
                [
                    "(the ceiling of that goal here: raw rocksdict, data keys only, "
                    "vs the raw stream)",
                    f"{_f(data_only * ope)} vs {_f(eps * ope)} ops/s",
                    _f(data_only / eps, 3),
                    "",
                ]
            )
    if full:
        goals.append(
            [
                "(restated) replicated ops/s >= 50% of raw rocksdict with the log copy",
                f"{_f(best * ope)} vs {_f(full * ope)} ops/s",
                _f(best / full, 3),
                _goal(best / full >= 0.5),
            ]
        )
    return goals


# ============================================================================ 3+4: crawl


def _crawl_rows(c: dict[str, Any]) -> list[Row]:
    a, w = c["median"]["alone"], c["median"]["with_standby"]
    lag = c["lag_median_run"]
    ca, cw = a["cpu_s"], w["cpu_s"]
    rows = [
        _row(
            f"crawl pages/s without standby (median of {len(c['runs']['alone'])})",
            f"{_f(a['pages_per_s'], 1)} ({a['pages']} pages in {_f(a['wall_s'], 2)}s)",
        ),
        _row(
            f"crawl pages/s with standby (median of {len(c['runs']['with_standby'])})",
            f"{_f(w['pages_per_s'], 1)} ({w['pages']} pages in {_f(w['wall_s'], 2)}s)",
            "without standby",
            _f(c["with_over_alone"], 3),
        ),
        _row(
            "crawl CPU s (median runs): primary + extract workers, standby",
            f"alone {_f(ca['primary'], 2)} + {_f(ca['primary_workers'], 2)}; with standby "
            f"{_f(cw['primary'], 2)} + {_f(cw['primary_workers'], 2)}, standby "
            f"{_f(cw['standby'], 2)} ({_f(cw['standby'] / max(1, w['final_offset']) * 1e6)} "
            "µs/entry)",
        ),
        _row(
            "lag during the crawl (median run)",
            f"{_lag_cell(lag)} ({lag['offsets_measured']} offsets, sampled every "
            f"{_f(lag['sample_period_ms_p50'])} ms)",
        ),
    ]
    if c.get("promote"):
        rows.append(_promote_row("a crawl", c["promote"]))
    return rows


def _crawl_goals(c: dict[str, Any]) -> list[Row]:
    a, w = c["median"]["alone"], c["median"]["with_standby"]
    lag = c["lag_median_run"]
    return [
        [
            "steady lag p99 < 100 ms at crawl load",
            f"{_f(lag['lag_ms']['p99'])} ms (worst run {_f(c['lag_worst_p99_ms'])} ms)",
            "",
            _goal(lag["lag_ms"]["p99"] < 100),
        ],
        [
            "crawl with standby >= 90% of without",
            f"{_f(w['pages_per_s'], 1)} vs {_f(a['pages_per_s'], 1)} pages/s",
            _f(c["with_over_alone"], 3),
            _goal(c["with_over_alone"] >= 0.9),
        ],
    ]


# ============================================================================ 5+6: resync


def _resync_rows(args: argparse.Namespace, r: dict[str, Any]) -> list[Row]:
    wi = r["writer_idle"]["tick_to_commit_ms"]
    wd = r["writer_during_resync"]["tick_to_commit_ms"]
    ci = r["writer_idle"]["write_call_ms"]
    cd = r["writer_during_resync"]["write_call_ms"]
    return [
        _row(
            f"full resync of {_f(r['store']['mb'])} MB ({r['store']['keys']} keys)",
            f"{_f(r['resync_mb_per_s'], 1)} MB/s ({_f(r['hello_to_installed_s'], 2)}s from "
            f"the decision to the installed snapshot; caught up "
            f"{_f(r['launch_to_caught_up_s'], 2)}s after the standby's launch)",
        ),
        _row(
            f"writer latency p99 at {_f(args.writer_rate)} groups/s, during resync",
            f"{_f(wd['p99'], 2)} ms tick-to-commit ({_f(cd['p99'], 2)} ms in the write call); "
            f"max {_f(wd['max'], 1)} ms",
            f"idle: {_f(wi['p99'], 2)} ms ({_f(ci['p99'], 2)} ms)",
            _f(wd["p99"] / wi["p99"], 2) if wi["p99"] else "n/a",
        ),
        _promote_row("the resync", r["promote"]),
    ]
