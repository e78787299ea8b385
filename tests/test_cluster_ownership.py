"""Nodes, not clients, keep politeness: a node refuses or leaves work on hosts it does not own.

Finding 3 of issue 29: per-host limit 2, a second job started directly on a pair that
does not own the origin put 4 requests in flight at it, and crawls with external links
or cross-host redirects would fetch hosts other pairs own. The cluster of
``tests/test_cluster_politeness.py`` (a real etcd, three in-process nodes registered
as three pairs, three counted sites on 127.0.0.1, .2, .3, pair k owning site k), with
the nodes built as ``--cluster`` builds them (``enforce_ownership``: ``ClusteredJobs``
reading the registry's owners, ``pagesift.coord.owners``):

- a start, Scrape or Map sent straight to a node that does not own the host is refused
  FAILED_PRECONDITION / HOST_OWNED_ELSEWHERE naming the owner, and the same crawls
  started directly on every node keep the site's peak at the limit (the control in
  ``test_cluster_politeness`` showed the breach with nodes that do not check);
- a client whose view lags (a pair joined, the client has not read it) is refused by
  the old owner and follows the owner it names;
- a crawl that allows external links, whose pages link to and redirect to a host
  another pair owns, sends that host no request: its URLs are recorded
  ``host_owned_elsewhere``, left to the owner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from pagesift.client import JobClient
from pagesift.client.errors import error_info_of
from pagesift.client.registryview import ClusterView
from pagesift.core.cluster import ids
from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2
from tests.helpers import RunningNode, eventually, in_process_node, serve_handler
from tests.test_cluster_politeness import (
    LIMIT,
    NODE,
    TERMINAL,
    _cluster,
    _crawl,
    _finish,
    owners_read,
)

pytestmark = pytest.mark.system


async def _refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def test_a_direct_start_on_a_pair_that_does_not_own_the_host_is_refused_naming_the_owner(
    etcd: Etcd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _cluster(etcd, tmp_path, delay=0.05, pages=12, enforce=monkeypatch) as c:
        await owners_read(list(c.nodes.values()), 3)
        site, owner = c.sites[0], c.pairs[0]
        stranger = c.nodes[c.pairs[1]]
        for call in (
            stranger.stub.StartCrawl(_crawl(site)),
            stranger.stub.Scrape(jobs_pb2.ScrapeRequest(url=site.root)),
            stranger.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=site.page_urls()[:3])
            ),
        ):
            err = await _refused(call)
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
            info = error_info_of(err)
            assert info is not None and info.reason == "HOST_OWNED_ELSEWHERE"
            assert info.metadata["owner"] == owner
            assert info.metadata["host"] == "127.0.0.1"
            assert owner in (err.details() or "")
        # the finding's case: the same crawl started straight on every node at once
        started = []
        for pair, node in c.nodes.items():
            try:
                started.append((node, (await node.stub.StartCrawl(_crawl(site))).id))
            except grpc.aio.AioRpcError as e:
                assert pair != owner and e.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert [n.address for n, _ in started] == [c.nodes[owner].address]
        for node, job_id in started:

            async def done(
                node: RunningNode = node, job_id: str = job_id
            ) -> jobs_pb2.GetJobResponse | None:
                r = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, status_only=True))
                return r if r.state in TERMINAL else None

            final = await eventually(done, "the owner's crawl to end", 90)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert site.counter.peak <= LIMIT


async def test_a_client_whose_view_lags_follows_the_owner_the_node_names(
    etcd: Etcd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        _cluster(etcd, tmp_path, delay=0.02, pages=8, extra=True, enforce=monkeypatch) as c,
        in_process_node(tmp_path / c.pairs[3], **NODE, pair=c.pairs[3]) as newcomer,
    ):
        view = ClusterView(c.url, refresh=3600.0)  # reads once, then only when asked
        client = JobClient(cluster=view)
        try:
            await view.ready()
            assert len(view.pairs) == 3
            await c.register(c.pairs[3], newcomer)  # the fourth pair now owns site 3
            await owners_read([*c.nodes.values()], 4)
            job_id = await client.start_crawl(_crawl(c.sites[2]))
            # placed on the old owner by the stale view, refused there, followed
            assert ids.pair_of(job_id) == c.pairs[3]
            assert len(view.pairs) == 4  # read again on the refusal
            final = await _finish(client, job_id)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
        finally:
            await client.close()
            await view.close()


def _linking_site(foreign_root: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Pages on 127.0.0.1 that link to ``foreign_root``'s pages, and one (``/go``) that
    redirects there; ``/p0`` .. ``/p3`` link on to each other."""
    foreign = foreign_root.rstrip("/")

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/robots.txt":
            return web.Response(status=404)
        if request.path == "/go":
            raise web.HTTPFound(f"{foreign}/moved")
        links = "".join(f'<a href="/p{i}">p{i}</a> ' for i in range(4))
        away = "".join(f'<a href="{foreign}/away{i}">away{i}</a> ' for i in range(3))
        body = f"<html><head><title>{request.path}</title></head><body>{links}{away}"
        return web.Response(
            text=f'{body}<a href="/go">go</a></body></html>', content_type="text/html"
        )

    return handler


async def test_a_crawl_leaves_external_links_and_redirects_to_hosts_owned_elsewhere(
    etcd: Etcd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _cluster(etcd, tmp_path, delay=0.0, pages=8, enforce=monkeypatch) as c:
        await owners_read(list(c.nodes.values()), 3)
        foreign = c.sites[1]  # 127.0.0.2, pair 1's
        async with (
            serve_handler(_linking_site(foreign.root)) as port,  # 127.0.0.1, pair 0's
            JobClient(cluster=c.url) as client,
        ):
            req = jobs_pb2.StartCrawlRequest(
                url=f"http://127.0.0.1:{port}/", allow_external_links=True, limit=40,
                sitemap=jobs_pb2.SITEMAP_MODE_SKIP, max_retries=0,
            )  # fmt: skip
            job_id = await client.start_crawl(req)
            assert ids.pair_of(job_id) == c.pairs[0]
            final = await _finish(client, job_id)
            errors = (await client.errors(job_id)).errors
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
        left = sorted(e.url.rsplit("/", 1)[-1] for e in errors if e.code == "host_owned_elsewhere")
        assert left == ["away0", "away1", "away2", "go"], [(e.url, e.code) for e in errors]
        assert final.completed == 5  # the root and p0..p3, fetched here
    assert foreign.counter.arrivals == []  # no request, robots.txt included
