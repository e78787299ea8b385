"""Quarantine of poison jobs: the pure decision and its two durable records.

What it owns
------------
When a page makes the node that runs it crash, freeze past its witness lease, or
lose an extraction worker, the job would otherwise be resumed by whichever node
comes up next, which crashes in turn: the pair chases the job from node to node.
This module decides, from durable facts only, when a job has done that often enough
to be paused instead (``JOB_STATE_PAUSED``, reason ``POISONED``). It does no I/O;
``pagesift.primary.jobs.quarantining`` is the shell that reads and writes the records below,
each change one ``Store.write`` group (so a standby holds them through the log).

Records (JSON, in ``pagesift.core.jobs.records`` layout)
--------------------------------------------------------
``job/{id}/run`` (``RunMarker``): written when a node starts or resumes running the
job: which run (a uuid per job runtime), node, epoch, when, and how many of the
job's pages were done then. A clean stop (SIGTERM/drain: ``Jobs.close``), the job's
end (finish, cancel, pause) deletes it. So a marker found when a runtime starts
means the run that wrote it ended uncleanly with the job in flight: a crash, a kill,
a freeze past the lease (the frozen node cannot write once its lease lapsed, and the
node that took over reads the replica of the marker). The start-up counts it as one
interruption and deletes it in the same group, so it is counted once.

``job/{id}/poison`` (``Budget``): the counts since the job last made progress, the
done count they were measured from, and the evidence (the last few events in words,
and the pages in flight at the last one).

The rule
--------
- An interruption counts. When the interrupted run had done at least ``needed``
  pages (``progress_needed``: ``poison_progress_pages``, and at least twice the job's
  concurrency, so the pages that finish alongside a poison page do not pass for
  progress) since it started, both counts start again from zero before this one is
  counted: a long crawl interrupted by unrelated failovers hours apart never adds up.
- A worker loss (``PageError.worker_lost``: the page's own worker died on it) counts
  on its own budget; it starts again from zero when ``needed`` pages were done since
  the previous loss.
- The job is poisoned when interruptions reach ``poison_threshold`` (default 2: one
  failover is ordinary operations and must not pause every job that was running;
  two runs in a row ended by a crash or a freeze before the job got anywhere are the
  signature of the job causing them) or worker losses reach ``poison_worker_losses``
  (default 3: the page is already charged a ``parse_failed`` each time; three in a
  row without progress means the job's content keeps killing workers).
- A job with an interruption counted is a *suspect*: the runtime runs suspects one
  at a time (``Suspects``; others wait, their markers gone), so the next crash is
  charged to the one suspect that was running, not to every job the node was
  running. A suspect that makes ``needed`` pages of progress is cleared
  (``cleared``) and lets the next one start; so does one that ran
  ``poison_probation_seconds`` without crashing (it stays a suspect: a poison page
  strikes within seconds of the resume, since it is first in line, and a slow but
  healthy job must not hold the others back for ever). Jobs that were never
  interrupted, and new jobs, run as usual meanwhile.
- ``ResumeJob`` deletes the budget: the owner's decision starts it from zero.

In-flight pages
---------------
Pages in flight are not written per page (that would double the writes of every
page). After a crash they are derived: workers take frontier entries (batch indices)
in queue order, so the pages that were being fetched or parsed are among the job's
first unfinished entries; the runtime records the first ``concurrency`` of them (at
most ``MAX_IN_FLIGHT``), which holds every page that was in flight (with
concurrency 1, exactly the one). A worker loss names its page exactly.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

MAX_EVIDENCE = 8  # evidence lines kept (the newest)
MAX_IN_FLIGHT = 16  # in-flight URLs kept
MAX_URL_CHARS = 2048  # each, in the evidence


@dataclass(frozen=True)
class Limits:
    """The server settings of the rule (``ServerConfig.poison_*``)."""

    interruptions: int = 2
    worker_losses: int = 3
    progress_pages: int = 20


def progress_needed(limits: Limits, concurrency: int) -> int:
    """Pages a run must finish to count as progress."""
    return max(1, limits.progress_pages, 2 * concurrency)


@dataclass(frozen=True)
class RunMarker:
    run: str  # the job runtime's uuid
    node: str  # where it ran (the node's advertised address)
    epoch: int
    started_ms: int
    done_at_start: int  # documents + page errors stored when the run started

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RunMarker:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Budget:
    interruptions: int = 0
    worker_losses: int = 0
    mark: int = 0  # done count when the last event was counted
    evidence: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Budget:
        if not raw:
            return cls()
        d: dict[str, Any] = json.loads(raw)
        d["evidence"] = tuple(d.get("evidence", ()))
        d["in_flight"] = tuple(d.get("in_flight", ()))
        return cls(**d)

    @property
    def suspect(self) -> bool:
        """An interruption was counted and no progress cleared it since."""
        return self.interruptions > 0


@dataclass(frozen=True)
class Interrupted:
    """A run of the job ended uncleanly (its marker was found at start-up)."""

    marker: RunMarker
    done_now: int
    in_flight: tuple[str, ...]
    now_ms: int


@dataclass(frozen=True)
class WorkerLost:
    """One of the job's pages lost its extraction worker."""

    url: str
    done_now: int
    node: str
    epoch: int
    now_ms: int


@dataclass(frozen=True)
class Verdict:
    budget: Budget
    poisoned: bool
    reason: str = ""  # why, in words, when poisoned


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _urls(urls: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(u[:MAX_URL_CHARS] for u in urls[:MAX_IN_FLIGHT])


def _evidence(budget: Budget, line: str) -> tuple[str, ...]:
    return (*budget.evidence, line)[-MAX_EVIDENCE:]


def count(budget: Budget, event: Interrupted | WorkerLost, limits: Limits, needed: int) -> Verdict:
    """The budget after ``event`` and whether the job is poisoned now (module rule)."""
    if isinstance(event, Interrupted):
        m = event.marker
        progress = event.done_now - m.done_at_start
        if progress >= needed:
            budget = Budget(evidence=budget.evidence)
        urls = _urls(event.in_flight)
        line = (
            f"interrupted: the run started {_when(m.started_ms)} on {m.node} (epoch {m.epoch}) "
            f"ended without a clean stop after {progress} pages"
            + (f"; in flight: {', '.join(urls)}" if urls else "")
        )
        budget = replace(
            budget,
            interruptions=budget.interruptions + 1,
            mark=event.done_now,
            evidence=_evidence(budget, line),
            in_flight=urls or budget.in_flight,
        )
        if budget.interruptions >= limits.interruptions:
            return Verdict(
                budget,
                True,
                f"poisoned: {budget.interruptions} runs in a row ended by a crash or a freeze "
                f"past the lease with fewer than {needed} pages done in between",
            )
        return Verdict(budget, False)
    if event.done_now - budget.mark >= needed:
        budget = replace(budget, worker_losses=0)
    url = event.url[:MAX_URL_CHARS]
    line = (
        f"worker lost: {_when(event.now_ms)} on {event.node} (epoch {event.epoch}), "
        f"the extraction worker died on {url}"
    )
    budget = replace(
        budget,
        worker_losses=budget.worker_losses + 1,
        mark=event.done_now,
        evidence=_evidence(budget, line),
        in_flight=(url,),
    )
    if budget.worker_losses >= limits.worker_losses:
        return Verdict(
            budget,
            True,
            f"poisoned: {budget.worker_losses} extraction workers lost on the job's pages "
            f"with fewer than {needed} pages done in between",
        )
    return Verdict(budget, False)


def cleared(budget: Budget, done_now: int, started_at: int, needed: int) -> Budget | None:
    """A suspect's run that finished ``needed`` pages since it started at ``started_at``
    (done count): the budget with its interruptions cleared; None while it has not."""
    if not budget.suspect or done_now - started_at < needed:
        return None
    return replace(budget, interruptions=0, mark=done_now)


@dataclass
class Suspects:
    """Which suspect job runs now and which wait (the runtime's in-memory queue)."""

    running: str | None = None
    waiting: list[str] = field(default_factory=list)

    def admit(self, job_id: str) -> bool:
        """May suspect ``job_id`` start now? Else it is queued."""
        if self.running is None or self.running == job_id:
            self.running = job_id
            return True
        if job_id not in self.waiting:
            self.waiting.append(job_id)
        return False

    def release(self, job_id: str) -> str | None:
        """``job_id`` stopped being the running suspect (cleared, ended, paused):
        the next waiting one, now running (None: none waits)."""
        if job_id in self.waiting:
            self.waiting.remove(job_id)
            return None
        if self.running != job_id:
            return None
        self.running = self.waiting.pop(0) if self.waiting else None
        return self.running
