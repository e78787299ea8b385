"""The one-off calls: Scrape (one page, answered at once) and Map (a site's URLs).

Neither is a job: nothing is registered, nothing resumes. What they share with jobs
lives here too, so a job's page is fetched exactly as a Scrape's page is:

- ``request_profile``: the request profile of an account's scrape or job
  (``reqprofile``), built with the permissions the accounts file gives it today;
- ``fetch_page``: a page from the account's page cache when a copy is fresh within
  the request's ``max_age`` (no fetch), else fetched, conditionally when an older copy
  has validators (a 304 returns that copy, revalidated; ``pagecache``).

Scrape writes one group after the fetch: the page cache and change tracking when the
request asks for them, and the page's charge (``recording.charge_page``, the function
a job's pages are charged by). The service checked the account's daily pages before
the fetch; a concurrent call may spend the last one meanwhile, so the charge checks
again inside the group and refuses the Scrape the way the service's check words it.
A page error writes nothing. Map (``mapper.map_site``) writes nothing at all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from pagesift.primary.engine.protocol import Engine, FetchPolicy, Page
from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.primary.jobs import mapper, pagecache, recording
from pagesift.shared.config.schema import ServerConfig
from pagesift.shared.jobs import quota
from pagesift.shared.jobs import records as jr
from pagesift.shared.jobs.accounts import Accounts
from pagesift.shared.jobs.clusterlimits import BlockNeeded, ClusterLimits, ClusterUnavailable
from pagesift.shared.store.db import Store
from pagesift.shared.store.groups import WriteGroup
from pagesift.v1 import jobs_pb2

__all__ = ["fetch_page", "map_site", "request_profile", "scrape"]


def request_profile(
    accounts: Accounts, owner: str, options: jobs_pb2.ScrapeOptions, targets: Sequence[str]
) -> RequestProfile:
    """``owner``'s request profile; raises ``PermissionError`` for options the
    account may not use."""
    account = accounts.get(owner)
    return RequestProfile.build(
        options,
        targets,
        may_ignore_robots=account is not None and account.allow_ignore_robots,
        may_use_proxy_url=account is not None and account.allow_proxy_url,
    )


async def fetch_page(
    store: Store,
    engine: Engine,
    owner: str,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    policy: FetchPolicy,
) -> Page:
    """The page at ``url`` for ``owner``: cached, revalidated or fetched (above)."""
    max_age = pagecache.max_age_ms(options)
    if max_age <= 0:
        return await engine.scrape(url, options, policy)
    entry = pagecache.lookup(store, pagecache.cache_key(owner, url, options))
    if entry is not None and pagecache.fresh(entry, max_age, jr.now_ms()):
        return pagecache.page_of(entry, url, "hit")
    if entry is not None:
        policy = replace(policy, validators=(entry.etag, entry.last_modified))
    page = await engine.scrape(url, options, policy)
    if page.not_modified and entry is not None:
        fresh = pagecache.page_of(entry, url, "revalidated")
        fresh.validators = page.validators if any(page.validators) else fresh.validators
        return fresh
    return page


async def scrape(
    store: Store,
    engine: Engine,
    accounts: Accounts,
    owner: str,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    pages: ClusterLimits | None = None,
) -> jobs_pb2.Document:
    """The Scrape call for account ``owner``: the page's document, cached and charged
    in one group; raises ``PageError``, ``PermissionError`` (options the account may
    not use) or ``quota.LimitExceeded`` (the day's pages spent meanwhile, here or, with
    ``pages``, across the cluster: a block drawn first, ``ClusterUnavailable`` past the
    bound while etcd does not answer)."""
    policy = FetchPolicy(request=request_profile(accounts, owner, options, [url]), owner=owner)
    page = await fetch_page(store, engine, owner, url, options, policy)
    account = accounts.get(owner)
    caches = pagecache.max_age_ms(options) > 0 or pagecache.tracks_changes(options)
    if not caches and (account is None or account.pages_per_day is None):
        return page.document  # nothing to write
    now = time.time()

    def group(g: WriteGroup) -> None:
        if caches:
            recording.remember(g, owner, url, options, page, int(now * 1000))
        hit = None if account is None else recording.charge_page(g, account, now, pages)
        if account is not None and hit is not None:
            # spent since the service's check: refused as that check words it (it
            # raises here, and the group writes nothing), or as the cluster's block does
            quota.check_start(
                account,
                0,
                quota.used_today(g, owner, now),
                "scrape",
                resets_at=quota.resets_at(g, owner, now, account.pages_per_day),
            )
            raise hit

    for _ in range(8):  # each draw fills the block or says the day's pages are gone
        try:
            store.write(group)
            return page.document
        except BlockNeeded as e:
            await e.draw()
    raise ClusterUnavailable("the cluster's pages could not be drawn: try again")


async def map_site(
    engine: Engine,
    config: ServerConfig,
    accounts: Accounts,
    request: jobs_pb2.MapRequest,
    owner: str,
) -> list[str]:
    """The Map call for account ``owner``: the site's URLs (``mapper``), fetched with
    the server's request defaults."""
    profile = request_profile(accounts, owner, jobs_pb2.ScrapeOptions(), [request.url])
    policy = FetchPolicy(request=profile, owner=owner)
    return await mapper.map_site(engine, request, config, policy)
