"""The drill's verdict: pure functions from what one run observed to its report.

Owns the definitions the drill reports and judges by (nothing here starts a process,
opens a socket or reads a clock, so every rule is tested with plain values):

- ``rto_s``: kill -> the first write the survivor accepted (a probe's answer time);
  after a witness kill, how long writes were refused (first refusal -> first
  acceptance after it).
- ``pages_lost``: documents the drill's watcher was shown (index, URL, fetch time)
  that the final job no longer holds. ``duplicates``: URLs with more than one
  document in the final job. The site check: every page the demo site says a crawl
  must return is there, and nothing else is (``/slow.html`` and ``/files/big.html``
  may go either way: they depend on the nodes' timeouts and body cap).
- Webhooks, over the receiver's deliveries of the crawl job in arrival order:
  ``lost``: an event the final job implies (``started``, one ``page`` per document,
  one ``page_failed`` per page error, the terminal state) with no 2xx delivery;
  ``resent``: a delivery of an event id that was answered 2xx and after whose 2xx an
  event of a HIGHER seq had arrived, i.e. the sender had recorded the
  acknowledgement (the Deliverer writes the cursor before it reads the next event)
  and then lost that record; ``in_flight_resent``: a 2xx'd event sent again with no
  higher seq in between, the one event in flight at a crash (its 2xx may never have
  been recorded); ``undone``: event ids the final job does not account for (events
  about writes a failover dropped).
- The verdict. Always: the crawl completed, no duplicate, the site check, no webhook
  event lost, none badly signed, at most one in-flight re-send, equal digests, the
  killed node rejoined, a write was accepted. Sync mode: nothing lost, re-sent or
  undone, and the primary was not degraded at the kill. Async mode: what was lost,
  re-sent or undone fits in the replication lag window, counted exactly as
  ``discarded``: the writes the killed primary had taken that the standby never
  applied (each page, and each cursor move, is one write group), so
  ``pages_lost + resent <= discarded`` and ``undone <= discarded``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from pagesift.core.jobs.urls import normalize

# the kill targets and modes live in choices (the drill's parser reads them from there)

TERMINAL_EVENTS = ("completed", "failed", "cancelled")


@dataclass(frozen=True, order=True)
class DocKey:
    """One document as a client saw it: its index in the job, URL and fetch time (ns)."""

    index: int
    url: str
    fetched_ns: int


@dataclass(frozen=True)
class Probe:
    """One probing write: when it was answered (seconds on the drill's clock), and
    whether the node accepted it (``code`` names the refusal otherwise)."""

    answered_at: float
    accepted: bool
    code: str = ""


@dataclass(frozen=True)
class Delivery:
    """One POST the drill's webhook receiver got, in arrival order."""

    event_id: str
    job: str
    seq: int
    event: str
    data: Mapping[str, Any]
    acked: bool  # the receiver answered 2xx
    signed: bool | None  # the signature verified (None: no secret to check with)


@dataclass(frozen=True)
class FinalJob:
    """The crawl job once it ended: state, documents in index order, page errors."""

    state: str
    documents: Sequence[DocKey]
    failed_urls: Sequence[str]
    notes: Sequence[str] = ()  # job-level notes (e.g. webhook_undeliverable)


@dataclass(frozen=True)
class SiteCheck:
    expected: int
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unexpected


@dataclass(frozen=True)
class WebhookTally:
    expected: int
    received: int  # deliveries (POSTs) of the job
    lost: int
    resent: int
    in_flight_resent: int
    undone: int
    bad_signatures: int
    verified: bool  # signatures were checked (a secret was known)


@dataclass
class Observation:
    """Everything one run collected; the runner fills it, ``judge`` reads it."""

    run: int
    mode: str  # async | sync (the pair's replication mode)
    auto: bool  # the witness promoted, not the drill
    kill: str  # primary | standby | witness
    killed: str  # the killed node's address ("witness" for etcd)
    survivor: str  # the node probed after the kill
    kill_after_pages: int  # documents shown when the kill came
    job_id: str = ""
    kill_at: float = 0.0
    lag_offsets: int | None = None  # the primary's Role just before the kill
    lag_seconds: float | None = None
    sync_degraded: bool | None = None
    probes: list[Probe] = field(default_factory=list)
    shown: list[DocKey] = field(default_factory=list)
    final: FinalJob | None = None
    required_urls: frozenset[str] | None = None  # the demo site's page set (None: --site)
    optional_urls: frozenset[str] = frozenset()
    deliveries: list[Delivery] = field(default_factory=list)
    digests_equal: bool | None = None
    digest_offset: int | None = None
    resync: str = "unknown"  # continue | full | none | unknown
    discarded: int | None = None  # writes the killed node dropped when it rejoined
    rejoined: str = ""  # the rejoined node's address
    witness_ttl: float | None = None  # --auto: the lease's ttl
    problems: list[str] = field(default_factory=list)  # what went wrong on the way


@dataclass(frozen=True)
class RunReport:
    """One run's figures and verdict (``report`` renders it)."""

    run: int
    mode: str
    auto: bool
    kill: str
    killed: str
    survivor: str
    job_id: str
    kill_after_pages: int
    rto_s: float | None
    read_only_after_s: float | None  # witness kill: kill -> first refused write
    lag_at_kill: dict[str, Any]
    discarded: int | None
    pages_shown: int
    pages_lost: int
    duplicates: int
    site: SiteCheck | None
    job_state: str
    webhooks: WebhookTally
    digests_equal: bool | None
    digest_offset: int | None
    resync: str
    rejoined: str
    allowed: int | None  # async: what the lag window allowed (discarded writes)
    passed: bool
    failures: tuple[str, ...]


# ---------------------------------------------------------------- pages


def pages_lost(shown: Sequence[DocKey], final: Sequence[DocKey]) -> list[DocKey]:
    """Documents a client was shown that the final job does not hold (same index, URL
    and fetch time): a page the job re-fetched later is a different document."""
    held = set(final)
    return sorted({d for d in shown if d not in held})


def duplicate_urls(final: Sequence[DocKey]) -> dict[str, int]:
    """URL (page key) -> how many documents carry it, for those with more than one."""
    counts = Counter(normalize(d.url) for d in final)
    return {u: n for u, n in sorted(counts.items()) if n > 1}


def site_check(
    final: Sequence[DocKey], required: frozenset[str], optional: frozenset[str] = frozenset()
) -> SiteCheck:
    """Every required page key present, nothing outside ``required | optional``."""
    got = {normalize(d.url) for d in final}
    return SiteCheck(
        expected=len(required),
        missing=tuple(sorted(required - got)),
        unexpected=tuple(sorted(got - required - optional)),
    )


# ---------------------------------------------------------------- writes


def rto(kill_at: float, probes: Sequence[Probe]) -> float | None:
    """Seconds from the kill to the first accepted probe (None: none was accepted)."""
    for p in sorted(probes, key=lambda p: p.answered_at):
        if p.accepted and p.answered_at >= kill_at:
            return p.answered_at - kill_at
    return None


def write_outage(kill_at: float, probes: Sequence[Probe]) -> tuple[float | None, float | None]:
    """After a witness kill: (kill -> first refused write, first refusal -> first
    accepted write after it). (None, None): never refused; (x, None): never back."""
    ordered = [p for p in sorted(probes, key=lambda p: p.answered_at) if p.answered_at >= kill_at]
    first_refused = next((p for p in ordered if not p.accepted), None)
    if first_refused is None:
        return None, None
    back = next(
        (p for p in ordered if p.accepted and p.answered_at > first_refused.answered_at), None
    )
    read_only = first_refused.answered_at - kill_at
    return read_only, (back.answered_at - first_refused.answered_at if back else None)


# ---------------------------------------------------------------- webhooks

EventKey = tuple[Any, ...]


def event_key(event: str, data: Mapping[str, Any]) -> EventKey:
    """What an event says, independent of its id and seq: ``("page", index, url)``,
    ``("page_failed", url)``, or the event name alone."""
    if event == "page":
        return ("page", int(data.get("index", -1)), str(data.get("url", "")))
    if event == "page_failed":
        return ("page_failed", str(data.get("url", "")))
    return (event,)


def expected_events(final: FinalJob) -> list[EventKey]:
    """The events a receiver of every event must have had once the job ended."""
    out: list[EventKey] = [("started",)]
    out += [("page", d.index, d.url) for d in final.documents]
    out += [("page_failed", u) for u in final.failed_urls]
    if final.state in TERMINAL_EVENTS:
        out.append((final.state,))
    return out


def resends(deliveries: Sequence[Delivery]) -> tuple[int, int]:
    """(resent, in_flight_resent) over one job's deliveries in arrival order; see the
    module docstring. Each repeated delivery counts once."""
    acked_at: dict[str, tuple[int, int]] = {}  # event id -> (position of its 2xx, seq)
    resent = in_flight = 0
    for pos, d in enumerate(deliveries):
        first = acked_at.get(d.event_id)
        if first is not None:
            at, seq = first
            if any(x.seq > seq for x in deliveries[at + 1 : pos]):
                resent += 1
            else:
                in_flight += 1
        elif d.acked:
            acked_at[d.event_id] = (pos, d.seq)
    return resent, in_flight


def webhook_tally(final: FinalJob | None, deliveries: Sequence[Delivery]) -> WebhookTally:
    """Lost, re-sent, in-flight re-sent, undone and badly signed events of one job."""
    resent, in_flight = resends(deliveries)
    acked_keys: dict[EventKey, set[str]] = {}
    for d in deliveries:
        if d.acked:
            acked_keys.setdefault(event_key(d.event, d.data), set()).add(d.event_id)
    expected = expected_events(final) if final is not None else []
    matched = [k for k in expected if k in acked_keys]
    distinct = {d.event_id for d in deliveries if d.acked}
    verified = any(d.signed is not None for d in deliveries)
    return WebhookTally(
        expected=len(expected),
        received=len(deliveries),
        lost=len(expected) - len(matched),
        resent=resent,
        in_flight_resent=in_flight,
        undone=max(0, len(distinct) - len(matched)),
        bad_signatures=sum(1 for d in deliveries if d.signed is False),
        verified=verified,
    )


# ---------------------------------------------------------------- the verdict

#: a witness kill must make the primary refuse writes within its ttl plus this much
READ_ONLY_SLACK_S = 1.0


def judge(obs: Observation) -> RunReport:
    """The run's report: its figures and whether it passed (see the module docstring)."""
    final_docs = list(obs.final.documents) if obs.final is not None else []
    lost = pages_lost(obs.shown, final_docs)
    dups = duplicate_urls(final_docs)
    site = (
        site_check(final_docs, obs.required_urls, obs.optional_urls)
        if obs.required_urls is not None and obs.final is not None
        else None
    )
    hooks = webhook_tally(obs.final, obs.deliveries)
    read_only: float | None = None
    if obs.kill == "witness":
        read_only, rto_s = write_outage(obs.kill_at, obs.probes)
    else:
        rto_s = rto(obs.kill_at, obs.probes)

    failures = [*obs.problems]
    state = obs.final.state if obs.final is not None else "unknown"
    if state != "completed":
        failures.append(f"the crawl ended {state}, not completed")
    if rto_s is None:
        failures.append("no write was accepted after the kill")
    if obs.kill == "witness":
        limit = (obs.witness_ttl or 0.0) + READ_ONLY_SLACK_S
        if read_only is None:
            failures.append("the primary kept taking writes with its witness down")
        elif obs.witness_ttl is not None and read_only > limit:
            failures.append(f"writes were refused only {read_only:.2f} s after the kill")
    if dups:
        failures.append(f"{len(dups)} URLs have several documents")
    if site is not None and site.missing:
        failures.append(f"{len(site.missing)} pages of the site are missing")
    if site is not None and site.unexpected:
        failures.append(f"{len(site.unexpected)} unexpected documents")
    if hooks.lost:
        failures.append(f"{hooks.lost} webhook events never delivered")
    if hooks.bad_signatures:
        failures.append(f"{hooks.bad_signatures} webhook deliveries badly signed")
    if hooks.in_flight_resent > 1:
        failures.append(f"{hooks.in_flight_resent} in-flight events re-sent (at most 1)")
    if obs.digests_equal is not True:
        failures.append(
            "digests differ" if obs.digests_equal is False else "no digests at one offset"
        )
    if obs.kill != "witness" and obs.resync not in ("continue", "full"):
        failures.append("the killed node did not rejoin")

    allowed: int | None = None
    if obs.mode == "sync":
        if obs.sync_degraded:
            failures.append("sync replication was degraded at the kill")
        if lost:
            failures.append(f"sync: {len(lost)} shown pages lost")
        if hooks.resent:
            failures.append(f"sync: {hooks.resent} acknowledged webhook events re-sent")
        if hooks.undone:
            failures.append(f"sync: {hooks.undone} webhook events about undone writes")
    else:
        allowed = obs.discarded or 0
        if len(lost) + hooks.resent > allowed:
            failures.append(
                f"async: {len(lost)} pages lost + {hooks.resent} events re-sent exceed the "
                f"{allowed} writes the standby had not applied"
            )
        if hooks.undone > allowed:
            failures.append(f"async: {hooks.undone} undone events exceed {allowed} writes")

    lag: dict[str, Any] = {
        "offsets": obs.lag_offsets,
        "seconds": None if obs.lag_seconds is None else round(obs.lag_seconds, 3),
    }
    return RunReport(
        run=obs.run,
        mode=obs.mode,
        auto=obs.auto,
        kill=obs.kill,
        killed=obs.killed,
        survivor=obs.survivor,
        job_id=obs.job_id,
        kill_after_pages=obs.kill_after_pages,
        rto_s=None if rto_s is None else round(rto_s, 3),
        read_only_after_s=None if read_only is None else round(read_only, 3),
        lag_at_kill=lag,
        discarded=obs.discarded,
        pages_shown=len(obs.shown),
        pages_lost=len(lost),
        duplicates=len(dups),
        site=site,
        job_state=state,
        webhooks=hooks,
        digests_equal=obs.digests_equal,
        digest_offset=obs.digest_offset,
        resync=obs.resync,
        rejoined=obs.rejoined,
        allowed=allowed,
        passed=not failures,
        failures=tuple(failures),
    )


@dataclass(frozen=True)
class Summary:
    runs: int
    passed: int
    rto_median_s: float | None
    rto_worst_s: float | None
    pages_lost: int
    webhook_events_resent: int

    @property
    def all_passed(self) -> bool:
        return self.runs > 0 and self.passed == self.runs


def summarize(reports: Sequence[RunReport]) -> Summary:
    rtos = [r.rto_s for r in reports if r.rto_s is not None]
    return Summary(
        runs=len(reports),
        passed=sum(1 for r in reports if r.passed),
        rto_median_s=round(median(rtos), 3) if rtos else None,
        rto_worst_s=max(rtos) if rtos else None,
        pages_lost=sum(r.pages_lost for r in reports),
        webhook_events_resent=sum(r.webhooks.resent for r in reports),
    )


def kill_point(total: int, draw: float, low: float = 0.1, high: float = 0.7) -> int:
    """The number of documents shown before the kill: between ``low`` and ``high`` of
    ``total`` (at least 1), picked by ``draw`` in [0, 1)."""
    lo = max(1, int(total * low + 0.999999))
    hi = max(lo, int(total * high))
    return lo + min(hi - lo, int(draw * (hi - lo + 1)))
