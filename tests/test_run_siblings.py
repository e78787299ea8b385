"""A job's run ends with all its workers: none fetches or writes after the run is over.

A real in-process node crawling a counted loopback site with four workers; its store
stops taking writes mid-crawl (the witness lease "may have lapsed": the log's write
deadline passes), so the worker whose page is recorded first meets ``NotWritable`` and
the run ends ("paused: the job resumes elsewhere"). Its siblings must end with it: when
the store takes writes again (a primary that renewed its lease), no request may reach
the site and no page be stored for a run that is over -- such a worker would crawl on
beside the run that resumes the job, two runs of one job on one host.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pagesift.demo.site import CALENDAR_EXCLUDE
from pagesift.drill.counting import CountedSite
from pagesift.v1 import jobs_pb2
from tests.helpers import eventually, in_process_node


async def test_a_run_that_met_a_store_refusing_writes_leaves_no_worker_fetching(
    tmp_path: Path,
) -> None:
    site = CountedSite(400, host="127.0.0.1", delay=0.05)
    await site.start()
    try:
        async with in_process_node(
            tmp_path / "n", per_host_concurrency=4, extract_processes=0
        ) as n:
            req = jobs_pb2.StartCrawlRequest(
                url=site.root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=4,
                sitemap=jobs_pb2.SITEMAP_MODE_SKIP, max_retries=0,
            )  # fmt: skip
            job_id = (await n.stub.StartCrawl(req)).id

            async def crawling() -> bool | None:
                got = await n.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, status_only=True))
                return True if got.completed >= 5 else None

            await eventually(crawling, "the crawl to store pages", timeout=30)
            jobs = n.node.jobs
            assert jobs is not None
            n.node.slot.log.set_write_deadline(time.monotonic())

            async def run_over() -> bool | None:
                return True if job_id not in jobs.running() else None

            await eventually(run_over, "the run to end on the refused write", timeout=30)
            n.node.slot.log.set_write_deadline(None)  # writes are taken again
            stored = (await n.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id))).completed
            before = site.counter.requests
            await asyncio.sleep(1.5)  # 30 page times: an orphan worker would fetch on
            after = (await n.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id))).completed
            assert site.counter.requests == before
            assert after == stored
    finally:
        await site.stop()
