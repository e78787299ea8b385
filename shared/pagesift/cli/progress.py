"""Following a job to its end: ``JobProgress`` and the live progress bar.

Owns a job's counters as WatchJob events report them (``JobProgress``: its JSON,
its one-line summary, and the exit status its final state means) and
``wait_for_job``, which follows WatchJob to the job's terminal state, and
``page_bar``, the bar of work counted in pages (``export``). The bar is
drawn on stderr only, so stdout keeps the one JSON object or the summary; an
interrupted wait leaves the job running and says how to cancel it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from pagesift.cli.common import EXIT_JOB_NOT_COMPLETED, EXIT_OK
from pagesift.cli.jobview import pause_json, pause_reason_name, state_name
from pagesift.client import JobClient
from pagesift.v1 import jobs_pb2

TERMINAL_STATES = frozenset(
    {jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}
)


@dataclass
class JobProgress:
    """A job's counters as WatchJob events (or a final GetJob) report them.

    ``done`` counts pages finished either way (documents + failures), which is
    what the progress bar fills against ``total``.
    """

    job_id: str
    state: jobs_pb2.JobState.ValueType = jobs_pb2.JOB_STATE_UNSPECIFIED
    total: int = 0
    completed: int = 0
    failed: int = 0
    documents_seen: int = 0
    started: float = field(default_factory=time.monotonic)
    pause: jobs_pb2.PauseInfo | None = None  # why a paused job is paused

    def update(self, event: jobs_pb2.WatchJobResponse) -> None:
        kind = event.WhichOneof("event")
        if kind == "document":
            self.documents_seen += 1
            self.completed = max(self.completed, event.document.index + 1)
        elif kind == "state":
            st = event.state
            self.state = st.state
            self.total, self.completed, self.failed = st.total, st.completed, st.failed
            self.pause = st.paused if st.HasField("paused") else None
        self.total = max(self.total, self.completed + self.failed)

    def update_from_job(self, job: jobs_pb2.GetJobResponse) -> None:
        self.state = job.state
        self.total, self.completed, self.failed = job.total, job.completed, job.failed
        self.pause = job.paused if job.HasField("paused") else None

    @property
    def done(self) -> int:
        return self.completed + self.failed

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def paused(self) -> bool:
        """Quarantined (or stopped by the store): it will not end by itself, so a wait
        stops here (``pagesift resume`` or ``cancel`` decide)."""
        return self.state == jobs_pb2.JOB_STATE_PAUSED

    def rate(self, now: float | None = None) -> float:
        """Pages finished per second since the watch began."""
        elapsed = (time.monotonic() if now is None else now) - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.job_id,
            "state": state_name(self.state),
            "completed": self.completed,
            "total": self.total,
            "failed": self.failed,
        }
        if self.pause is not None:
            out["paused"] = pause_json(self.pause)
        return out

    def summary(self) -> str:
        line = (
            f"{self.job_id}: {state_name(self.state)}, {self.completed} documents, "
            f"{self.failed} failed, {self.total} total"
        )
        if self.pause is not None:
            line += (
                f" ({pause_reason_name(self.pause.reason)}: pagesift resume {self.job_id}, "
                f"or pagesift cancel {self.job_id})"
            )
        return line

    def exit_code(self) -> int:
        return EXIT_OK if self.state == jobs_pb2.JOB_STATE_COMPLETED else EXIT_JOB_NOT_COMPLETED


def _progress_bar() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pages"),
        TextColumn("[red]{task.fields[failed]} errors"),
        TextColumn("{task.fields[rate]:.1f} pages/s"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


def page_bar(description: str) -> Progress:
    """A bar for work counted in pages (``pagesift export``), on stderr."""
    return Progress(
        SpinnerColumn(),
        TextColumn(f"[bold]{escape(description)}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pages"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


async def wait_for_job(client: JobClient, job_id: str, *, show_progress: bool) -> JobProgress:
    """Follow WatchJob to the job's terminal state, or until it is paused (a live bar
    on stderr if asked)."""
    progress = JobProgress(job_id)
    try:
        if show_progress:
            with _progress_bar() as bar:
                task = bar.add_task(job_id[:8], total=None, failed=0, rate=0.0)
                async for event in client.watch(job_id):
                    progress.update(event)
                    bar.update(
                        task,
                        completed=progress.done,
                        total=progress.total or None,
                        failed=progress.failed,
                        rate=progress.rate(),
                    )
                    if progress.paused:
                        break
        else:
            async for event in client.watch(job_id):
                progress.update(event)
                if progress.paused:
                    break
    except asyncio.CancelledError:
        print(
            f"interrupted; job {job_id} keeps running (pagesift cancel {job_id})", file=sys.stderr
        )
        raise
    if not progress.terminal:
        progress.update_from_job(await client.get_job(job_id, status_only=True))
    return progress
