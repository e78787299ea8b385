"""The runtime's quarantine books (``Quarantining``): run markers, interruptions, suspects.

``pagesift.core.jobs.quarantine`` states the rule and does no I/O; this module is the
shell that reads and writes its two records for ``runtime.Jobs``, which holds one
``Quarantining`` and calls it at each step of a job's life cycle. Every durable change
is one ``Store.write`` group, on the job's ``run`` and ``poison`` keys
(``pagesift.core.jobs.records.JobKeys``).

What it owns
------------
- ``mark``: a run's marker (this runtime's run id, node, epoch, time, pages done),
  written in one group before the run starts; ``clear_marker`` deletes this runtime's
  marker inside a group (a clean stop: ``Jobs.close``).
- ``count_interruption``: at start-up a marker found is one interruption (with the pages
  in flight, derived from the queue order), counted and deleted in one group; a job
  it poisons is paused (``poisoned``) in that group.
- ``worker_lost``: a page's lost extraction worker counts on the worker budget, one
  group; a job it poisons is paused there, then woken and its run stopped.
- the suspects (``quarantine.Suspects``, in memory): ``waits`` queues a suspect while
  another runs; ``probation`` clears a suspect's interruptions once it progressed and
  lets the next run then, or after ``poison_probation_seconds``; ``release`` starts the
  next that waits. Jobs start only through the runtime (``Runtime``).

Why it is safe
--------------
- An interruption's count and its marker's delete are one group that reads the marker
  again first: it is counted once, and a marker cleared meanwhile is not counted.
- ``clear_marker`` deletes a marker only when this runtime wrote it (its run id), so a
  clean stop never erases the evidence of a run that did not stop cleanly.
- One suspect runs at a time: the next crash is charged to the one that ran, never to
  every job the node was running. A suspect whose run could not start (not writable,
  store refusing) releases its turn or waits for the store, so the queue never stalls.
- Imports flow runtime -> quarantining -> runner: the runtime is reached through the
  ``Runtime`` protocol, never imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Protocol

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quarantine, records
from pagesift.core.replication.identity import Identity
from pagesift.core.store.db import Store
from pagesift.core.store.errors import StorageUnavailable
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.jobs.runner import JobRequest, concurrency, first_unfinished

__all__ = ["Quarantining", "Runtime"]

logger = logging.getLogger("pagesift.jobs")


class Runtime(Protocol):
    """What the quarantine asks of the runtime that holds it (``runtime.Jobs``)."""

    @property
    def closing(self) -> bool: ...

    def running(self) -> list[str]:
        """The ids of the jobs whose run is a task here now."""
        ...

    def wake(self, job_id: str) -> None:
        """The job's records changed: its webhook deliverer looks."""

    def stop(self, job_id: str) -> None:
        """End the job's run now (its meta already says why)."""

    def _spawn(self, meta: records.JobMeta) -> None:
        """Run the job, its marker first (``StorageUnavailable``: the store refused it)."""

    def _resume_later(self, job_id: str) -> None:
        """Start the job once the store takes writes again."""


class Quarantining:
    def __init__(self, store: Store, config: ServerConfig, runtime: Runtime) -> None:
        self.store = store
        self.config = config
        self._runtime = runtime
        self._run_id = uuid.uuid4().hex  # this runtime's run markers
        self._suspects = quarantine.Suspects()
        self._needed: dict[str, int] = {}  # job -> pages that count as progress
        self._limits = quarantine.Limits(
            interruptions=config.poison_threshold,
            worker_losses=config.poison_worker_losses,
            progress_pages=config.poison_progress_pages,
        )

    # run markers ----------------------------------------------------------------------
    def mark(self, meta: records.JobMeta, req: JobRequest) -> int:
        """Before a run: its marker written (one group); returns the pages done then
        (``NotWritable``, ``StorageUnavailable``: nothing written, the run must not start)."""
        self._needed[meta.id] = quarantine.progress_needed(
            self._limits, concurrency(self.config, req.max_concurrency)
        )
        keys = records.JobKeys(meta.id)
        node, epoch = self._node(), self._epoch()

        def group(g: WriteGroup) -> int:
            done = records.done_count(g, meta.id)
            g.put(
                keys.run,
                quarantine.RunMarker(self._run_id, node, epoch, records.now_ms(), done).encode(),
            )
            return done

        return self.store.write(group).result

    def clear_marker(self, g: WriteGroup, job_id: str) -> None:
        """Inside a group: this runtime's marker of ``job_id`` deleted (a clean stop)."""
        key = records.JobKeys(job_id).run
        raw = g.get(key)
        if raw is not None and quarantine.RunMarker.decode(raw).run == self._run_id:
            g.delete(key)

    def _epoch(self) -> int:
        with self.store.lock:
            return Identity(self.store).epoch

    def _node(self) -> str:
        return self.config.advertise or self.config.listen

    # counting -------------------------------------------------------------------------
    def count_interruption(self, meta: records.JobMeta, req: JobRequest) -> records.JobMeta | None:
        """Start-up: a run marker of ``meta``'s job (started with ``req``, as stored)
        means its last run was cut short: count it (and pause the job when that makes
        it poisoned), in one group."""
        keys = records.JobKeys(meta.id)
        if self.store.get(keys.run) is None:
            return meta
        workers = concurrency(self.config, req.max_concurrency)
        needed = quarantine.progress_needed(self._limits, workers)
        in_flight = first_unfinished(
            self.store, meta.id, req, min(workers, quarantine.MAX_IN_FLIGHT)
        )

        def group(g: WriteGroup) -> tuple[records.JobMeta | None, quarantine.Verdict | None]:
            raw = g.get(keys.run)
            if raw is None:
                return meta, None
            event = quarantine.Interrupted(
                quarantine.RunMarker.decode(raw),
                records.done_count(g, meta.id),
                in_flight,
                records.now_ms(),
            )
            verdict = quarantine.count(
                quarantine.Budget.decode(g.get(keys.poison)), event, self._limits, needed
            )
            g.put(keys.poison, verdict.budget.encode())
            g.delete(keys.run)
            if verdict.poisoned:
                note = "\n".join((verdict.reason, *verdict.budget.evidence))
                return records.pause(g, meta.id, "poisoned", note), verdict
            return meta, verdict

        out, verdict = self.store.write(group).result
        if verdict is not None:
            logger.warning(
                "job %s %s (account %s): %s",
                meta.id,
                "quarantined" if verdict.poisoned else "was interrupted",
                meta.owner,
                verdict.reason or verdict.budget.evidence[-1],
                extra={"job": meta.id, "account": meta.owner},
            )
        return out

    def worker_lost(self, job_id: str, url: str) -> None:
        """A page of the job lost its extraction worker: count it (one group); a job
        poisoned by it is paused and its run stopped."""
        keys = records.JobKeys(job_id)
        needed = self._needed.get(job_id, quarantine.progress_needed(self._limits, 1))
        node, epoch = self._node(), self._epoch()

        def group(g: WriteGroup) -> quarantine.Verdict | None:
            raw = g.get(keys.meta)
            if raw is None or records.JobMeta.decode(raw).state != "scraping":
                return None
            event = quarantine.WorkerLost(
                url, records.done_count(g, job_id), node, epoch, records.now_ms()
            )
            verdict = quarantine.count(
                quarantine.Budget.decode(g.get(keys.poison)), event, self._limits, needed
            )
            g.put(keys.poison, verdict.budget.encode())
            if verdict.poisoned:
                records.pause(
                    g, job_id, "poisoned", "\n".join((verdict.reason, *verdict.budget.evidence))
                )
            return verdict

        verdict = self.store.write(group).result
        if verdict is None or not verdict.poisoned:
            return
        logger.warning("job %s quarantined: %s", job_id, verdict.reason, extra={"job": job_id})
        self._runtime.wake(job_id)
        self._runtime.stop(job_id)

    # suspects -------------------------------------------------------------------------
    def _suspect(self, job_id: str) -> bool:
        return quarantine.Budget.decode(self.store.get(records.JobKeys(job_id).poison)).suspect

    def waits(self, job_id: str) -> bool:
        """A suspect queued behind the one that runs (True: do not start it now)."""
        return self._suspect(job_id) and not self._suspects.admit(job_id)

    def holds(self, job_id: str) -> bool:
        """The job is the running suspect or waits for its turn."""
        return job_id in self._suspects.waiting or self._suspects.running == job_id

    def on_probation(self, job_id: str) -> bool:
        """The job is the suspect that runs now (its run is on probation)."""
        return self._suspects.running == job_id

    async def probation(self, job_id: str, started_at: int) -> None:
        """A suspect's run: clear its interruptions once it made progress; stop holding
        the other suspects back then, or after ``poison_probation_seconds``."""
        keys = records.JobKeys(job_id)
        needed = self._needed.get(job_id, 1)
        deadline = time.monotonic() + self.config.poison_probation_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(min(0.25, self.config.poison_probation_seconds))
            if records.done_count(self.store, job_id) - started_at < needed:
                continue

            def group(g: WriteGroup) -> None:
                budget = quarantine.cleared(
                    quarantine.Budget.decode(g.get(keys.poison)),
                    records.done_count(g, job_id),
                    started_at,
                    needed,
                )
                if budget is not None:
                    g.put(keys.poison, budget.encode())

            with contextlib.suppress(StorageUnavailable):  # cleared next time it progresses
                self.store.write(group)
            break
        self.release(job_id)

    def ended(self, job_id: str) -> None:
        """The job's run ended here: forget its progress bar, release its turn."""
        self._needed.pop(job_id, None)
        self.release(job_id)

    def release(self, job_id: str) -> None:
        """``job_id`` stops holding the suspects back: start the next that waits."""
        nxt = self._suspects.release(job_id)
        while nxt is not None and not self._runtime.closing:
            meta = records.load_meta(self.store, nxt)
            if meta is not None and meta.state == "scraping" and nxt not in self._runtime.running():
                try:
                    self._runtime._spawn(meta)
                except StorageUnavailable:  # its run marker is a write: once it writes
                    self._runtime._resume_later(nxt)
                return
            nxt = self._suspects.release(nxt)
