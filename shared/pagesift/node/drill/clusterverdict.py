"""The cluster drill's verdict: pure functions from what each pair showed to the report.

A cluster drill (``pagesift drill --cluster`` / ``--local --pairs N``) crawls one site
per pair at once, through a cluster client, and SIGKILLs the primary of one pair. What
it judges, per pair (``judge_pair``), with the single-pair drill's own definitions
(``verdict.pages_lost``, ``duplicate_urls``, ``site_check``, ``rto``):

- the crawl completed, with no duplicate and (for a demo site) every page it must hold;
- ``rto_s`` (the killed pair only): kill -> the first write its survivor accepted;
- ``pages_lost``: documents the watcher was shown that the final job no longer holds.
  The killed pair may lose what its replication lag held (async mode: at most
  ``discarded``, the writes the killed node dropped when it rejoined; sync: none);
  every other pair loses nothing: a failover in one pair is invisible to the others;
- politeness: the most requests the pair's site had in flight at once (counted at the
  site, whichever node sent them) never above ``per_host_concurrency``.

``judge_cluster`` adds it up: the drill passes when every pair passed. Nothing here
starts a process, opens a socket or reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pagesift.node.drill.verdict import (
    DocKey,
    FinalJob,
    Probe,
    duplicate_urls,
    pages_lost,
    rto,
    site_check,
)

__all__ = ["ClusterReport", "PairObservation", "PairReport", "cluster_json", "cluster_lines"]


@dataclass
class PairObservation:
    """What the drill saw of one pair and its crawl."""

    pair: str
    site: str  # the root URL this pair's crawl started from (a site it owns)
    limit: int  # per_host_concurrency
    peak: int = 0  # requests in flight at once at the site, at most
    job_id: str = ""
    killed: bool = False
    kill_at: float = 0.0
    probes: list[Probe] = field(default_factory=list)
    rejoined: bool | None = None  # the killed node came back as a connected standby
    discarded: int | None = None  # writes it dropped when it rejoined
    required: frozenset[str] | None = None  # the demo site's page set (None: unknown)
    optional: frozenset[str] = frozenset()
    shown: list[DocKey] = field(default_factory=list)
    final: FinalJob | None = None
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PairReport:
    pair: str
    job_id: str
    killed: bool
    state: str
    documents: int
    rto_s: float | None
    pages_lost: int
    allowed_lost: int | None  # pages the pair may lose (None: the lag window, unknown)
    duplicates: int
    missing: int
    unexpected: int
    peak: int
    limit: int
    polite: bool
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class ClusterReport:
    mode: str
    pairs: tuple[PairReport, ...]

    @property
    def killed_pair(self) -> str:
        return next((p.pair for p in self.pairs if p.killed), "")

    @property
    def politeness_held(self) -> bool:
        return all(p.polite for p in self.pairs)

    @property
    def passed(self) -> bool:
        return bool(self.pairs) and all(p.passed for p in self.pairs)


def judge_pair(obs: PairObservation, mode: str) -> PairReport:
    """One pair's figures and failures (see the module docstring)."""
    failures = list(obs.problems)
    final = obs.final
    docs = list(final.documents) if final is not None else []
    state = final.state if final is not None else "unknown"
    if state != "completed":
        failures.append(f"the crawl ended {state}")
    dups = duplicate_urls(docs)
    if dups:
        failures.append(f"{len(dups)} URL(s) with more than one document")
    missing = unexpected = 0
    if obs.required is not None and final is not None:
        check = site_check(docs, obs.required, obs.optional)
        missing, unexpected = len(check.missing), len(check.unexpected)
        if not check.ok:
            failures.append(f"site check: {missing} missing, {unexpected} unexpected")
    lost = len(pages_lost(obs.shown, docs)) if final is not None else 0
    allowed: int | None = 0
    took = None
    if obs.killed:
        took = rto(obs.kill_at, obs.probes)
        if took is None:
            failures.append("no write was accepted after the kill")
        if obs.rejoined is not True:
            failures.append("the killed node did not rejoin as a standby")
        allowed = obs.discarded if mode == "async" else 0
    if allowed is None and lost:
        failures.append(f"{lost} shown page(s) lost and the lag window is unknown")
    elif allowed is not None and lost > allowed:
        failures.append(f"{lost} shown page(s) lost (allowed {allowed})")
    polite = obs.peak <= obs.limit
    if not polite:
        failures.append(f"politeness: {obs.peak} requests at once to the site, limit {obs.limit}")
    return PairReport(
        pair=obs.pair, job_id=obs.job_id, killed=obs.killed, state=state,
        documents=len(docs), rto_s=took, pages_lost=lost, allowed_lost=allowed,
        duplicates=sum(n - 1 for n in dups.values()), missing=missing,
        unexpected=unexpected, peak=obs.peak, limit=obs.limit, polite=polite,
        failures=tuple(failures),
    )  # fmt: skip


def judge_cluster(observations: Sequence[PairObservation], mode: str) -> ClusterReport:
    return ClusterReport(mode, tuple(judge_pair(o, mode) for o in observations))


def cluster_json(r: ClusterReport) -> dict[str, Any]:
    """The report as one JSON object (``pagesift drill --json`` with a cluster)."""
    return {
        "mode": r.mode,
        "killed_pair": r.killed_pair,
        "politeness_held": r.politeness_held,
        "passed": r.passed,
        "pairs": [
            {
                "pair": p.pair,
                "job_id": p.job_id,
                "killed": p.killed,
                "job_state": p.state,
                "documents": p.documents,
                "rto_s": round(p.rto_s, 3) if p.rto_s is not None else None,
                "pages_lost": p.pages_lost,
                "allowed_lost": p.allowed_lost,
                "duplicates": p.duplicates,
                "missing": p.missing,
                "unexpected": p.unexpected,
                "max_concurrent_per_host": p.peak,
                "per_host_limit": p.limit,
                "polite": p.polite,
                "passed": p.passed,
                "failures": list(p.failures),
            }
            for p in r.pairs
        ],
    }


def cluster_lines(r: ClusterReport) -> list[str]:
    """The report as text, a line per pair and a verdict line."""
    lines = []
    for p in r.pairs:
        took = f"{p.rto_s:.2f} s" if p.rto_s is not None else "-"
        lines.append(
            f"pair {p.pair}{' (primary killed)' if p.killed else ''}: {p.state}, "
            f"{p.documents} pages, rto {took}, lost {p.pages_lost}"
            f"{f' (allowed {p.allowed_lost})' if p.killed else ''}, duplicates "
            f"{p.duplicates}, max {p.peak} at once per host (limit {p.limit}): "
            + ("PASS" if p.passed else "FAIL: " + "; ".join(p.failures))
        )
    held = "held" if r.politeness_held else "BROKEN"
    lines.append(
        f"cluster drill: {'PASS' if r.passed else 'FAIL'} ({len(r.pairs)} pairs, "
        f"{r.mode}, killed the primary of {r.killed_pair or '-'}; politeness {held})"
    )
    return lines
