"""What a job's results write: pure functions over one ``WriteGroup``, committed by the runner.

Each function takes the group, the job's id, what happened and ``now``; it reads what
it checks from the group, adds the ops and returns what it wrote. None awaits, sleeps
or reads the clock, so tests run them on a real store without an event loop
(tests/test_record_page.py). Layout: ``pagesift.core.jobs.records``.

- a page (``record_page``): document pushed to ``pages`` + done mark + (crawl) every
  newly admitted link in ``frontier`` with its ``seen`` mark + page cache and change
  tracking (``pagecache``) + its charge, ONE group. The group re-checks ``done`` and
  the job's state first: a page is never recorded twice, nor after its job ended.
- URL identity (crawl): the page's aliases (``Scope.aliases``) are marked seen and done
  in that group (``frontier.claim_aliases``). A page whose alias is done already is a
  ``duplicate`` error naming it (no document, no link); an alias still queued becomes
  a ``duplicate`` of this page, so every frontier entry ends as one document or error.
- a page error (``record_error``, and a page stored as an error: ``duplicate``, a
  ``skip`` such as ``robots_noindex``) goes through ``_page_failed``, the one error
  path: error pushed to ``errors`` + the ``page_failed`` webhook event.
- the cookie jar: the group writes what the job's jar changed (``JobCookies.changes``),
  one record per changed cookie, never the whole jar, and no more than the jar's byte
  budget lets this page write (the rest waits for later pages; the first time in a run,
  a job note says so); the caller marks them ``committed`` once the group is, which
  also counts the page for the budget (``cookiejar.EMPTY`` when nothing was written; a
  refused group leaves them to the next).
- quota: ``charge_page`` is where a page is charged, a job's page here and a Scrape's
  in ``oneoff``: in the page's own group, so a page is charged iff it is stored, and
  never past ``pages_per_day`` (groups are serialized by the store's write section). The
  page was drawn before its request (``pagedraws``: in a cluster, from the pair's block
  of the account's pages), so this check is the store's own record of it.
- model tokens: a document's ``model_usage`` (``models.formats``) is charged to the
  account's token day (``quota.charge_tokens``) and added to the job's counter
  (``add_job_usage``, ``JobKeys.model_usage``) in the page's group: counted iff stored.
- finish (``record_finish``): meta rewritten with state, times and note; the run
  marker deleted (the run ended cleanly: ``pagesift.core.jobs.quarantine``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagesift.core.jobs import quota, records
from pagesift.core.jobs.accounts import Account, Accounts
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.scope import Entry
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.engine.cookiejar import EMPTY, JarChanges, JobCookies
from pagesift.primary.engine.interface import Page
from pagesift.primary.jobs import frontier, pagecache
from pagesift.primary.webhooks import outbox
from pagesift.v1 import jobs_pb2

__all__ = [
    "PageResult",
    "Recorded",
    "add_job_usage",
    "charge_page",
    "model_tokens",
    "record_error",
    "record_finish",
    "record_page",
    "record_removed",
    "remember",
    "write_cookies",
]


@dataclass(frozen=True)
class PageResult:
    """A fetched page of a job and what its run decided about it."""

    mark: bytes  # the page's done mark: its batch index, or its crawl page key
    page: Page
    admitted: Sequence[Entry] = ()  # (crawl) its links to queue
    aliases: Sequence[str] = ()  # (crawl) its other page keys: final URL, canonical
    skip: PageError | None = None  # recorded as this error instead (robots_noindex)
    source: tuple[str, jobs_pb2.ScrapeOptions] | None = None  # URL asked, for pagecache


@dataclass(frozen=True)
class Recorded:
    """What a page's (or page error's) group wrote."""

    kind: str = ""  # the job's kind, once its meta was read
    seq: int | None = None  # the document's index in ``pages`` (None: no document)
    failed: str = ""  # the error code recorded for the page instead of a document
    over_quota: quota.LimitExceeded | None = None  # no page stored: the job must stop
    cookies: JarChanges | None = None  # the jar's changes the group wrote


NOTHING = Recorded()
COOKIE_NOTE = "cookie_budget"  # the code of the job note on cookie changes held back


def charge_page(g: WriteGroup, account: Account | None, now: float) -> quota.LimitExceeded | None:
    """Charge one page to ``account`` inside the page's group; the excess instead
    (nothing charged) when the page would pass its ``pages_per_day``."""
    if account is None or account.pages_per_day is None:
        return None  # no daily limit: nothing is counted
    hit = quota.page_limit_hit(g, account, now)
    if hit is None:
        quota.charge(g, account.name, 1, now)
    return hit


def model_tokens(doc: jobs_pb2.Document) -> int:
    """The model tokens (in and out) a document's model formats took."""
    return doc.model_usage.input_tokens + doc.model_usage.output_tokens


def add_job_usage(g: WriteGroup, job_id: str, usage: jobs_pb2.ModelUsage) -> None:
    """Inside the page's group: the job's model usage counter grows by the page's."""
    if not (usage.calls or usage.cached):
        return
    key = records.JobKeys(job_id).model_usage
    total = jobs_pb2.ModelUsage()
    raw = g.get(key)
    if raw is not None:
        total.ParseFromString(raw)
    total.input_tokens += usage.input_tokens
    total.output_tokens += usage.output_tokens
    total.calls += usage.calls
    total.cached += usage.cached
    g.put(key, total.SerializeToString())


def remember(
    g: WriteGroup,
    owner: str,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    page: Page,
    now_ms: int,
) -> None:
    """The page cache and change tracking of a page (``pagecache``), in its group."""
    pagecache.remember(g, owner, url, options, page, now_ms)
    if pagecache.tracks_changes(options):
        pagecache.track(g, owner, page.document, options.change_tracking_diff, now_ms)


def write_cookies(
    g: WriteGroup, job_id: str, jar: JobCookies | None, now: float
) -> JarChanges | None:
    """What the job's jar changed since it was stored, written as its records, within
    the page's allowance (``EMPTY``: nothing now; None: no jar)."""
    if jar is None:
        return None
    changes = jar.changes(now)
    if changes is None:
        return EMPTY
    keys = records.JobKeys(job_id)
    for slot, record in changes.puts:
        g.put(keys.cookie(slot), record)
    for slot in changes.deletes:
        g.delete(keys.cookie(slot))
    if changes.slots is not None:
        g.put(keys.cookie_slots, str(changes.slots).encode())
    if changes.drop_legacy:
        g.delete(keys.cookies)  # a jar stored as one snapshot: replaced by the records
    if changes.note is not None:
        note = jobs_pb2.PageError(
            code=COOKIE_NOTE, message=changes.note, time=records.timestamp(int(now * 1000))
        )
        g.push(keys.notes, note.SerializeToString())
    return changes


def _page_failed(g: WriteGroup, job_id: str, url: str, err: PageError, now: float) -> None:
    """The one error path: the page error and its webhook event (no done mark)."""
    item = jobs_pb2.PageError(
        url=url,
        code=str(err.code),
        message=err.message,
        time=records.timestamp(int(now * 1000)),
        http_status=err.status or 0 if err.code == ErrorCode.HTTP_STATUS else 0,
    )
    g.push(records.JobKeys(job_id).errors, item.SerializeToString())
    event: dict[str, object] = {"url": url, "code": str(err.code), "message": err.message}
    outbox.enqueue(g, job_id, "page_failed", event, now=now)


def record_error(
    g: WriteGroup,
    job_id: str,
    mark: bytes,
    url: str,
    err: PageError,
    *,
    jar: JobCookies | None,
    now: float,
) -> Recorded:
    """Page ``mark`` failed for good: its error and done mark (nothing when the page
    is done already or the job gone)."""
    keys = records.JobKeys(job_id)
    if g.contains(keys.done, mark) or g.get(keys.meta) is None:
        return NOTHING
    cookies = write_cookies(g, job_id, jar, now)
    _page_failed(g, job_id, url, err, now)
    g.insert(keys.done, mark)
    return Recorded(failed=str(err.code), cookies=cookies)


def record_page(
    g: WriteGroup,
    job_id: str,
    result: PageResult,
    *,
    accounts: Accounts,
    jar: JobCookies | None,
    now: float,
) -> Recorded:
    """Store the page, or (crawl) a ``duplicate`` or ``skip`` error in its place."""
    keys = records.JobKeys(job_id)
    meta_raw = g.get(keys.meta)
    if meta_raw is None or g.contains(keys.done, result.mark):
        return NOTHING  # the job is gone, or the page recorded already
    meta = records.JobMeta.decode(meta_raw)
    if meta.terminal:
        return NOTHING  # cancelled or stopped while this page was in flight
    cookies = write_cookies(g, job_id, jar, now)
    doc = result.page.document
    original, queued = frontier.claim_aliases(g, job_id, result.aliases)
    err = result.skip
    if original is not None:  # nothing claimed: the original's links are in
        err = PageError(ErrorCode.DUPLICATE, f"same page as {original}")
    elif err is not None and result.admitted:  # a skipped page's links still count
        frontier.admit(g, job_id, list(result.admitted), meta.limit)
    if err is not None:
        _page_failed(g, job_id, doc.url, err, now)
        g.insert(keys.done, result.mark)
        _duplicates(g, job_id, queued, doc.url, now)
        return Recorded(kind=meta.kind, failed=str(err.code), cookies=cookies)
    account = accounts.get(meta.owner)
    hit = charge_page(g, account, now)
    if hit is not None:  # the group still writes the jar and the claimed aliases
        return Recorded(kind=meta.kind, over_quota=hit, cookies=cookies)
    quota.charge_tokens(g, account, model_tokens(doc), now)  # the calls were made
    add_job_usage(g, job_id, doc.model_usage)
    if result.source is not None:
        url, options = result.source
        remember(g, meta.owner, url, options, result.page, int(now * 1000))
    seq = g.push(keys.pages, doc.SerializeToString())  # after ``track``: its change status
    g.insert(keys.done, result.mark)
    if result.admitted:
        frontier.admit(g, job_id, list(result.admitted), meta.limit)
    _duplicates(g, job_id, queued, doc.url, now)
    outbox.enqueue(
        g,
        job_id,
        "page",
        {"index": seq, "url": doc.url, "final_url": doc.final_url,
         "status_code": doc.status_code, "title": doc.title},
        now=now,
    )  # fmt: skip
    return Recorded(kind=meta.kind, seq=seq, cookies=cookies)


def _duplicates(g: WriteGroup, job_id: str, queued: list[str], url: str, now: float) -> None:
    """The aliases still queued, each a ``duplicate`` of the page stored as ``url``."""
    for alias in queued:
        _page_failed(g, job_id, alias, PageError(ErrorCode.DUPLICATE, f"same page as {url}"), now)


def record_finish(
    g: WriteGroup, job_id: str, state: str, note: str, *, now_ms: int, ttl_ms: int
) -> records.JobMeta | None:
    """The job ends ``state`` (its note kept, but for a cancel); a finished job is
    returned as it is, a gone one as None."""
    keys = records.JobKeys(job_id)
    raw = g.get(keys.meta)
    if raw is None:
        return None
    meta = records.JobMeta.decode(raw)
    if meta.terminal:
        return meta
    meta.state, meta.note, meta.finished_ms = state, note, now_ms
    meta.expires_ms = now_ms + ttl_ms
    g.put(keys.meta, meta.encode())
    g.delete(keys.run)  # the run ended cleanly (quarantine)
    if note and state != "cancelled":
        item = jobs_pb2.PageError(code=state, message=note, time=records.timestamp(now_ms))
        g.push(keys.notes, item.SerializeToString())
    outbox.enqueue(
        g,
        job_id,
        state,
        {"state": state, "note": note,
         "completed": g.list_len(keys.pages),
         "failed": g.list_len(keys.errors)},
        now=now_ms / 1000,
    )  # fmt: skip
    return meta


def record_removed(
    g: WriteGroup, job_id: str, owner: str, start_url: str, stored: Sequence[str]
) -> None:
    """A change-tracked crawl's end: the pages of the account's previous such crawl
    from ``start_url`` that this one did not store (``pagecache.crawl_removed``)."""
    keys = records.JobKeys(job_id)
    if g.get(keys.removed) is not None:
        return  # written before a crash: the crawl set is this crawl's already
    removed = pagecache.crawl_removed(g, owner, start_url, stored)
    g.put(keys.removed, "\n".join(removed).encode())
