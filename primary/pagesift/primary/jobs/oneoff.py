"""The one-off calls: Scrape (one page, answered at once) and Map (a site's URLs).

Neither is a job: nothing is registered, nothing resumes. What they share with jobs
lives here too, so a job's page is fetched exactly as a Scrape's page is:

- ``request_profile``: the request profile of an account's scrape or job
  (``reqprofile``), built with the permissions the accounts file gives it today;
- ``fetch_page``: a page from the account's page cache when a copy is fresh within
  the request's ``max_age`` (no fetch), else fetched, conditionally when an older copy
  has validators (a 304 returns that copy, revalidated; ``pagecache``); a fetched page
  then gets its model formats (``models.formats.ModelFormats.apply``, answers from the
  account's model cache under the same ``max_age``) before any group is written.

Scrape draws its page first (``pagedraws``: the node's count of the account's daily
pages and, in a cluster, the pair's block), before its request leaves, and writes one
group after the fetch: the page cache and change tracking when the request asks for
them, and the page's charge (``recording.charge_page``, the function a job's pages are
charged by) with its model tokens (``quota.charge_tokens``). A refused draw is refused
the way the service's check words it (or as the cluster's block does); a page error
writes nothing and gives the page back. Map
(``mapper.map_site``) writes nothing and draws nothing (no document is charged).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quota, records
from pagesift.core.jobs.accounts import Account, Accounts
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.engine.interface import Engine, FetchPolicy, Page
from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.primary.jobs import mapper, pagecache, recording
from pagesift.primary.jobs.pagedraws import PageDraws
from pagesift.primary.models.formats import ModelFormats
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
    models: ModelFormats | None = None,
) -> Page:
    """The page at ``url`` for ``owner``: cached, revalidated or fetched (above)."""
    max_age = pagecache.max_age_ms(options)
    if max_age <= 0:
        page = await engine.scrape(url, options, policy)
        if models is not None:
            await models.apply(page, options, owner)
        return page
    entry = pagecache.lookup(store, pagecache.cache_key(owner, url, options))
    if entry is not None and pagecache.fresh(entry, max_age, records.now_ms()):
        return pagecache.page_of(entry, url, "hit")
    if entry is not None:
        policy = replace(policy, validators=(entry.etag, entry.last_modified))
    page = await engine.scrape(url, options, policy)
    if page.not_modified and entry is not None:
        fresh = pagecache.page_of(entry, url, "revalidated")
        fresh.validators = page.validators if any(page.validators) else fresh.validators
        return fresh
    if models is not None:

        def cached(digest: str) -> bytes | None:
            return pagecache.model_answer(store, owner, digest, max_age, records.now_ms())

        await models.apply(page, options, owner, cached)
    return page


async def scrape(
    store: Store,
    engine: Engine,
    draws: PageDraws,
    owner: str,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    foreign_host: Callable[[str], str | None] | None = None,
    models: ModelFormats | None = None,
) -> jobs_pb2.Document:
    """The Scrape call for account ``owner``: its page drawn (``draws``), the document
    fetched (no redirect to a host ``foreign_host`` refuses: a cluster's other pairs'),
    cached and charged in one group; raises ``PageError``, ``PermissionError``
    (options the account may not use), ``quota.LimitExceeded`` (the day's pages spent,
    here or across the cluster) or ``ClusterUnavailable`` (a block of the cluster's
    pages could not be drawn within the bound while etcd does not answer)."""
    accounts = draws.accounts
    profile = request_profile(accounts, owner, options, [url])
    policy = FetchPolicy(request=profile, owner=owner, foreign_host=foreign_host)
    account = accounts.get(owner)
    drawn = await draws.draw(owner, wait_block=True)
    if isinstance(drawn, quota.LimitExceeded):
        if account is not None and drawn.limit_name == "pages_per_day":
            _refuse_as_the_service(store, account, draws.held(owner))
        raise drawn
    stored = False
    try:
        page = await fetch_page(store, engine, owner, url, options, policy, models)
        caches = pagecache.max_age_ms(options) > 0 or pagecache.tracks_changes(options)
        tokens = recording.model_tokens(page.document)
        counted = account is not None and (
            account.pages_per_day is not None
            or (tokens > 0 and account.model_tokens_per_day is not None)
        )
        if not caches and not counted:
            return page.document  # nothing to write
        now = time.time()

        def group(g: WriteGroup) -> None:
            if caches:
                recording.remember(g, owner, url, options, page, int(now * 1000))
            quota.charge_tokens(g, account, tokens, now)
            hit = None if account is None else recording.charge_page(g, account, now)
            if account is not None and hit is not None:  # the accounts file lowered it
                _refuse_as_the_service(g, account, 0)
                raise hit

        store.write(group)
        stored = True
        return page.document
    finally:
        drawn.settle(stored=stored)


def _refuse_as_the_service(reader: quota.Reader, account: Account, held: int) -> None:
    """Raise the refusal the service's check gives (``quota.check_start``) when the
    account's pages charged (``used_today``) and ``held`` (drawn, in flight) use up
    its day here; return when they do not (the cluster's refusal then stands)."""
    now = time.time()
    quota.check_start(
        account,
        0,
        quota.used_today(reader, account.name, now) + held,
        "scrape",
        resets_at=quota.resets_at(reader, account.name, now, account.pages_per_day),
    )


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
