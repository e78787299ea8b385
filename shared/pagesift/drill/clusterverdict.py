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
  site, whichever node sent them) never above the per-host limit.

The per-host limit (``choose_limit``) is what the nodes publish in their registry
records (``NodeRecord.per_host_concurrency``), the smallest of them: a site may be
fetched by any node of its owner pair (and by the next owner while ownership moves),
so the bound that must hold is the strictest node's. ``--per-host-limit`` given
explicitly overrides it. The report says where the limit came from, which nodes
disagree and which publish none (older nodes, 0); when no node publishes one and no
override is given, politeness is not judged and every pair fails saying so (a drill
cannot claim a bound it does not know).

``judge_cluster`` adds it up: the drill passes when every pair passed. Nothing here
starts a process, opens a socket or reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pagesift.drill.verdict import (
    DocKey,
    FinalJob,
    Probe,
    duplicate_urls,
    pages_lost,
    rto,
    site_check,
)

__all__ = [
    "NO_LIMIT", "ClusterReport", "LimitChoice", "PairObservation", "PairReport", "choose_limit",
    "cluster_json", "cluster_lines", "judge_cluster", "judge_pair",
]  # fmt: skip

NO_LIMIT = (
    "politeness not judged: no node publishes its per_host_concurrency (nodes older than "
    "the field); give --per-host-limit"
)


@dataclass(frozen=True)
class LimitChoice:
    """The per-host limit a cluster drill judges by, and why (``choose_limit``)."""

    limit: int | None  # None: no node published one and no override was given
    source: str  # "nodes", "override" or "none"
    published: Mapping[str, int] = field(default_factory=dict)  # "pair/node" -> its limit
    unpublished: tuple[str, ...] = ()  # "pair/node" of the nodes that publish none
    notes: tuple[str, ...] = ()  # what the report says about the choice

    @property
    def disagree(self) -> bool:
        return len(set(self.published.values())) > 1


def _nodes_at(published: Mapping[str, int]) -> str:
    by_value: dict[int, list[str]] = {}
    for node, value in sorted(published.items()):
        by_value.setdefault(value, []).append(node)
    return "; ".join(f"{v} on {', '.join(nodes)}" for v, nodes in sorted(by_value.items()))


def choose_limit(published: Mapping[str, int], override: int | None = None) -> LimitChoice:
    """The limit to judge by from each node's published ``per_host_concurrency``
    (``"pair/node"`` -> value, 0 for a node that publishes none) and the explicit
    ``--per-host-limit`` (None when not given); see the module docstring."""
    if override is not None and override < 1:
        raise ValueError(f"a per-host limit override must be at least 1, not {override}")
    given = {n: v for n, v in published.items() if v > 0}
    silent = tuple(sorted(n for n, v in published.items() if v <= 0))
    notes: list[str] = []
    smallest = min(given.values(), default=None)
    if len(set(given.values())) > 1:
        notes.append(
            f"the nodes disagree on per_host_concurrency ({_nodes_at(given)}): "
            f"the strictest, {smallest}, is the bound"
        )
    if silent and given:
        notes.append(
            f"{len(silent)} node(s) publish no per_host_concurrency (older nodes): "
            f"{', '.join(silent)}"
        )
    if override is not None:
        if smallest is not None and override != smallest:
            notes.append(f"--per-host-limit {override} overrides the nodes' {smallest}")
        return LimitChoice(override, "override", given, silent, tuple(notes))
    if smallest is None:
        return LimitChoice(None, "none", given, silent, (*notes, NO_LIMIT))
    return LimitChoice(smallest, "nodes", given, silent, tuple(notes))


@dataclass
class PairObservation:
    """What the drill saw of one pair and its crawl."""

    pair: str
    site: str  # the root URL this pair's crawl started from (a site it owns)
    limit: int | None  # the per-host limit judged by (``LimitChoice.limit``; None: unknown)
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
    limit: int | None
    polite: bool | None  # None: not judged (no limit known)
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class ClusterReport:
    mode: str
    pairs: tuple[PairReport, ...]
    limits: LimitChoice | None = None  # how the per-host limit was chosen (None: given)

    @property
    def killed_pair(self) -> str:
        return next((p.pair for p in self.pairs if p.killed), "")

    @property
    def politeness_held(self) -> bool | None:
        """False when a pair broke the limit, None when one was not judged, else True."""
        if any(p.polite is False for p in self.pairs):
            return False
        return None if any(p.polite is None for p in self.pairs) else True

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
    polite = None if obs.limit is None else obs.peak <= obs.limit
    if polite is None:
        failures.append(NO_LIMIT)
    elif not polite:
        failures.append(f"politeness: {obs.peak} requests at once to the site, limit {obs.limit}")
    return PairReport(
        pair=obs.pair, job_id=obs.job_id, killed=obs.killed, state=state,
        documents=len(docs), rto_s=took, pages_lost=lost, allowed_lost=allowed,
        duplicates=sum(n - 1 for n in dups.values()), missing=missing,
        unexpected=unexpected, peak=obs.peak, limit=obs.limit, polite=polite,
        failures=tuple(failures),
    )  # fmt: skip


def judge_cluster(
    observations: Sequence[PairObservation], mode: str, limits: LimitChoice | None = None
) -> ClusterReport:
    """Every pair judged; with ``limits``, each by ``limits.limit`` (the chosen limit)
    and the report carries how it was chosen."""
    if limits is not None:
        observations = [replace(o, limit=limits.limit) for o in observations]
    return ClusterReport(mode, tuple(judge_pair(o, mode) for o in observations), limits)


def _limits_json(c: LimitChoice | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "limit": c.limit,
        "source": c.source,
        "published": dict(sorted(c.published.items())),
        "unpublished": list(c.unpublished),
        "nodes_disagree": c.disagree,
        "notes": list(c.notes),
    }


def cluster_json(r: ClusterReport) -> dict[str, Any]:
    """The report as one JSON object (``pagesift drill --json`` with a cluster)."""
    return {
        "mode": r.mode,
        "killed_pair": r.killed_pair,
        "politeness_held": r.politeness_held,
        "per_host_limit": _limits_json(r.limits),
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
            f"{p.duplicates}, max {p.peak} at once per host (limit {p.limit or '-'}): "
            + ("PASS" if p.passed else "FAIL: " + "; ".join(p.failures))
        )
    c = r.limits
    if c is not None:
        how = {"nodes": "as the nodes publish it", "override": "from --per-host-limit"}
        lines.append(
            f"per-host limit {c.limit if c.limit is not None else 'unknown'}"
            f"{f' ({how[c.source]})' if c.source in how else ''}"
        )
        lines.extend(f"  {note}" for note in c.notes)
    held = {True: "held", False: "BROKEN", None: "not judged"}[r.politeness_held]
    lines.append(
        f"cluster drill: {'PASS' if r.passed else 'FAIL'} ({len(r.pairs)} pairs, "
        f"{r.mode}, killed the primary of {r.killed_pair or '-'}; politeness {held})"
    )
    return lines
