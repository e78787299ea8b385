"""JobClient: a typed asyncio client for JobService, failing over across server addresses.

This module owns how a caller talks to one or more pagesift servers; it
guarantees:

- Every call goes to the address that last answered (the first one at start),
  then to the others in the order given. An address "answers" a call when it
  returns anything but a refusal whose error details say NOT_PRIMARY or FENCED
  (``pagesift.shared.api.rpcerrors``: a standby, or a deposed primary, refusing a
  write), or a transport UNAVAILABLE; that address becomes the preferred one. A
  refusal names the primary (``ErrorInfo`` metadata ``primary``), which is tried
  next, even if it was not given. Errors without details (a transport error, a
  server older than the details) are judged by their code as before:
  FAILED_PRECONDITION and (for a retryable call) UNAVAILABLE move on.
- With more than one address the client asks each one's ``AdminService.Role``
  before its first call and after every failed round (``find_primary``): the
  writable primary of the highest epoch becomes the preferred address (a deposed
  primary that does not know it yet loses to the promoted one). Servers without
  the AdminService, or unreachable, are simply not chosen.
- When a round fails and some address was UNAVAILABLE (the primary may be down
  while its standby gets promoted), a retryable call is tried again with bounded,
  jittered exponential backoff (``RetryPolicy``: ``pagesift.shared.util.backoff``;
  ``budget`` seconds of sleep in all, ~10 s by default), looking the primary up again
  before each round; then the round's most telling error is raised (a
  standby's FAILED_PRECONDITION naming the primary beats UNAVAILABLE). A round
  in which every address answered and refused is raised at once. (So a call to
  addresses where nothing listens takes the whole budget, ~10.4 s by default:
  ``wait_connected(timeout)`` first bounds that wait, raising ``Unreachable``; the
  CLI's ``--connect-timeout``.) Reads, Scrape
  and CancelJob are retryable; StartCrawl and StartBatchScrape only with an
  idempotency key, and the client sets a fresh uuid4 key on any such request
  that has none, so one method call never registers two jobs: the key is stored
  with the job and replicated, so a promoted standby that has the registration
  answers a retry with the same job id.
- CancelJob and ResumeJob (``CONTROL_WRITES``: idempotent, and the owner must be
  able to stop a job while the pair fails over) keep trying through a failover:
  each attempt is bounded by ``CONTROL_ATTEMPT_SECONDS`` (a frozen primary costs
  that, not ``timeout``), a DEADLINE_EXCEEDED moves on to the next address like
  UNAVAILABLE, and a round refused everywhere (NOT_PRIMARY/FENCED: a standby whose
  primary is frozen, before the election promotes it) is tried again like one with
  an unreachable address, within the ``RetryPolicy`` budget (``keeps_trying``).
  So a cancel succeeds once a primary answers again, within about the witness
  lease plus the budget.
- Reads go to the preferred address (the primary once known) and fall back to
  the others, so a standby answers them while the primary is down.
- ``watch`` resumes a broken stream at the next document index (from whichever
  address answers), so a consumer sees every document index once.
- ``iter_pages``/``iter_documents`` follow ``next_skip`` until it is absent.
- Errors surface as ``grpc.aio.AioRpcError`` (``ClientError`` for a server that
  breaks the paging contract).
- Deadlines: every unary attempt is bounded by ``timeout`` (Scrape and Map by
  ``scrape_timeout``); retries add at most the ``RetryPolicy`` budget of sleep.
- Transport: plaintext, or TLS with ``tls_ca`` (a CA to trust; the system roots
  without one) and optionally a client certificate (``tls_cert`` + ``tls_key``,
  mTLS), or any ``credentials`` given; ``channel_options`` are laid over the
  client's own (message size, reconnect backoff) for every channel.
- ``SyncJobClient`` is the same client for code without an event loop: it runs one
  ``JobClient`` on a private event loop in a daemon thread and blocks on each call.

The failover decisions are small pure functions (``should_try_next``,
``pick_error``, ``backoff_delays``, ``is_retryable``, ``choose_primary``) and one
tiny state object (``Failover``); ``find_primary`` feeds ``Failover.prefer`` from
the nodes' ``Role`` answers. ``role``, ``promote`` and ``admin_stub`` expose the
AdminService of any address (the ``role``/``promote``/``verify`` commands use
them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import grpc
import grpc.aio

from pagesift.shared.api import rpcerrors
from pagesift.shared.api.rpcerrors import SEND_ELSEWHERE
from pagesift.shared.util.backoff import budgeted_delays
from pagesift.shared.util.channels import open_channel
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2, replication_pb2_grpc

if TYPE_CHECKING:
    from pagesift.v1.jobs_pb2_grpc import JobServiceAsyncStub
    from pagesift.v1.replication_pb2_grpc import AdminServiceAsyncStub

__all__ = [
    "DEFAULT_ADDRESS",
    "FAILOVER_CODES",
    "ClientError",
    "Failover",
    "JobClient",
    "RetryPolicy",
    "SyncJobClient",
    "Unreachable",
    "backoff_delays",
    "choose_primary",
    "follow_primary",
    "is_retryable",
    "keeps_trying",
    "parse_addresses",
    "pick_error",
    "primary_named",
    "should_try_next",
    "with_idempotency_key",
]

DEFAULT_ADDRESS = "127.0.0.1:50051"
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})
READ_METHODS = frozenset({"GetJob", "WatchJob", "GetJobErrors", "ListJobs"})
IDEMPOTENT_WRITES = frozenset({"Scrape", "CancelJob"})
KEYED_WRITES = frozenset({"StartCrawl", "StartBatchScrape"})
CONTROL_WRITES = frozenset({"CancelJob", "ResumeJob"})
CONTROL_ATTEMPT_SECONDS = 5.0  # one CancelJob/ResumeJob attempt at most (module docstring)

ROLE_LOOKUP_SECONDS = 2.0  # bound on one round of Role calls

_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # a restarted server is found within ~1 s, not after grpc's default 1..120 s backoff
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

T = TypeVar("T")
P = ParamSpec("P")
KeyedRequest = TypeVar("KeyedRequest", jobs_pb2.StartCrawlRequest, jobs_pb2.StartBatchScrapeRequest)


class ClientError(Exception):
    """The server answered, but broke the API contract (e.g. a non-advancing next_skip)."""


class Unreachable(Exception):
    """``JobClient.wait_connected``: no channel (or not every one) became ready in time."""

    def __init__(self, addresses: Sequence[str], timeout: float) -> None:
        self.addresses = list(addresses)
        self.timeout = timeout
        super().__init__(f"cannot reach {', '.join(addresses)} (connect timeout {timeout:g} s)")


# ---------------------------------------------------------------- pure helpers


def parse_addresses(values: str | Iterable[str] | None) -> list[str]:
    """``["a:1,b:2", "c:3"]`` -> ``["a:1", "b:2", "c:3"]``: split, strip, dedupe, keep order.

    Nothing given means ``[DEFAULT_ADDRESS]``.
    """
    if values is None:
        values = []
    elif isinstance(values, str):
        values = [values]
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            addr = part.strip()
            if addr and addr not in out:
                out.append(addr)
    return out or [DEFAULT_ADDRESS]


def is_retryable(method: str, idempotency_key: str = "") -> bool:
    """May ``method`` be sent again (to this or another address) after UNAVAILABLE?"""
    if method in READ_METHODS or method in IDEMPOTENT_WRITES or method in CONTROL_WRITES:
        return True
    return method in KEYED_WRITES and bool(idempotency_key)


def should_try_next(code: grpc.StatusCode, *, retryable: bool, reason: str | None = None) -> bool:
    """After ``code`` (with the ``ErrorInfo`` ``reason``, if any) from one address, try
    the next one?

    Keyed on the reason when the error carries one (``pagesift.shared.api.rpcerrors``): only
    NOT_PRIMARY and FENCED (a standby, or a deposed primary, refusing a write: nothing
    was done) move on; any other answer of a server is the answer, whatever its code (a
    Scrape whose page timed out is UNAVAILABLE with reason PAGE_FETCH_FAILED: not
    retried elsewhere).

    Without a reason, by the code: a transport error (no server answered), or a server
    older than the error details, which must still work during an upgrade.
    FAILED_PRECONDITION (such a standby refusing a write) means the call did nothing,
    so moving on is always safe; UNAVAILABLE may come after the request left, so only a
    retryable call moves on.
    """
    if reason is not None:
        return reason in SEND_ELSEWHERE
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return True
    return code == grpc.StatusCode.UNAVAILABLE and retryable


def keeps_trying(
    codes: Sequence[grpc.StatusCode],
    reasons: Sequence[str | None],
    *,
    retryable: bool,
    control: bool = False,
) -> bool:
    """After a failed round (one error per address), is the call tried again (after a
    backoff sleep, while the budget lasts)? A retryable call when some address was
    UNAVAILABLE (a promotion may be under way); a control write (CancelJob,
    ResumeJob) also when every address either refused with NOT_PRIMARY/FENCED or did
    not answer in time: the pair is failing over, and the call is idempotent."""
    if not retryable:
        return False
    if grpc.StatusCode.UNAVAILABLE in codes:
        return True
    if not control or not codes:
        return False
    no_answer = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return all(
        r in SEND_ELSEWHERE or (r is None and c in no_answer)
        for c, r in zip(codes, reasons, strict=True)
    )


def pick_error(
    codes: Sequence[grpc.StatusCode], reasons: Sequence[str | None] | None = None
) -> int:
    """Which of a round's failures (one per address, in order) to report: its index.

    The first NOT_PRIMARY/FENCED refusal (``reasons``, from the error details), else the
    first FAILED_PRECONDITION (a server without details that answered and names the
    primary, or refused for a reason of its own), beats UNAVAILABLE; among
    UNAVAILABLEs the last one.
    """
    if not codes:
        raise ValueError("no errors to pick from")
    for i, reason in enumerate(reasons or ()):
        if reason in SEND_ELSEWHERE:
            return i
    for i, code in enumerate(codes):
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return i
    return len(codes) - 1


def primary_named(err: grpc.aio.AioRpcError) -> str | None:
    """The primary's address a NOT_PRIMARY/FENCED refusal names (its ``ErrorInfo``
    metadata ``primary``), or None."""
    info = rpcerrors.error_info_of(err)
    if info is None or info.reason not in SEND_ELSEWHERE:
        return None
    address = str(info.metadata.get("primary", ""))
    return address or None


def follow_primary(order: list[str], tried: int, primary: str | None) -> None:
    """Put ``primary`` next in ``order`` (right after its ``tried`` first addresses,
    added if unknown), unless it was tried already this round."""
    if not primary or primary in order[:tried]:
        return
    if primary in order:
        order.remove(primary)
    order.insert(tried, primary)


def backoff_delays(
    budget: float = 10.0,
    *,
    first: float = 0.1,
    cap: float = 2.0,
    rng: Callable[[], float] = random.random,
) -> list[float]:
    """Sleeps between retry rounds: ``first`` doubling up to ``cap``, each jittered
    (between half and all of it, drawn from ``rng``), summing to ``budget`` (the last
    one is trimmed to fit). See ``pagesift.shared.util.backoff.budgeted_delays``."""
    return budgeted_delays(budget, base=first, cap=cap, rng=rng)


def choose_primary(
    answers: Sequence[tuple[str, replication_pb2.RoleResponse | None]],
) -> str | None:
    """The address of the writable primary of the highest epoch among ``Role`` answers
    (None: no answer, or no primary). Equal epochs keep the given order. A primary
    that was deposed but has not met the new epoch yet still says "primary": the
    epoch tells them apart."""
    best: tuple[int, str] | None = None
    for address, role in answers:
        if role is None or role.role != replication_pb2.NODE_ROLE_PRIMARY:
            continue
        if best is None or role.epoch > best[0]:
            best = (role.epoch, address)
    return best[1] if best else None


def with_idempotency_key(request: KeyedRequest) -> KeyedRequest:
    """``request`` itself when it has a key, else a copy with a fresh uuid4 key."""
    if request.idempotency_key:
        return request
    keyed = type(request)()
    keyed.CopyFrom(request)
    keyed.idempotency_key = str(uuid.uuid4())
    return keyed


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a retryable call is tried again after a round in which some address was
    UNAVAILABLE: sleeps of ``first`` seconds doubling up to ``cap``, each jittered
    (between half and all of it, drawn from ``rng``), ``budget`` seconds of sleep in
    all (0: no retry). The defaults are the client's (~10 s: enough for a standby to
    be promoted)."""

    budget: float = 10.0
    first: float = 0.1
    cap: float = 2.0
    rng: Callable[[], float] = random.random

    def delays(self) -> list[float]:
        """One call's schedule of sleeps (a fresh jitter draw each time)."""
        return backoff_delays(self.budget, first=self.first, cap=self.cap, rng=self.rng)


class Failover:
    """Which address to try first, then the rest in their given order.

    ``answered`` makes an address the preferred one; ``prefer`` is the hook for
    a caller that knows better (a future ``Role`` lookup of the primary).
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("at least one address is needed")
        self.addresses: list[str] = list(addresses)
        self.current = 0

    def order(self) -> list[str]:
        """The preferred address, then the others in their given order."""
        first = self.addresses[self.current]
        return [first, *(a for a in self.addresses if a != first)]

    def answered(self, address: str) -> None:
        self.current = self.addresses.index(address)

    def prefer(self, address: str) -> None:
        """Try ``address`` first from now on (added to the list if unknown)."""
        if address not in self.addresses:
            self.addresses.append(address)
        self.answered(address)

    @property
    def preferred(self) -> str:
        return self.addresses[self.current]


# ---------------------------------------------------------------- the client


def _tls_credentials(ca: str, cert: str, key: str) -> grpc.ChannelCredentials | None:
    """TLS credentials from PEM files (None: plaintext, when none is given). A file
    that cannot be read raises OSError naming it."""
    if bool(cert) != bool(key):
        raise ValueError(
            "a client certificate (tls_cert) needs its key (tls_key), and a key its certificate"
        )
    if not (ca or cert):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes() if ca else None,
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )


class _BearerAuth(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Adds ``authorization: Bearer KEY`` to every call: the admin key on AdminService
    calls (when given), and on CancelJob/ResumeJob when no API key is given (an
    admin stopping or resuming any account's job), the account's API key on the
    others. grpc.aio files an
    interceptor under ONE call type (its first matching base), so streams get their
    own instance, ``_BearerAuthStreams``."""

    def __init__(self, api_key: str, admin_key: str) -> None:
        self.api_key = api_key
        self.admin_key = admin_key

    def _details(self, details: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        admin = "AdminService" in method or (
            not self.api_key and method.rsplit("/", 1)[-1] in CONTROL_WRITES
        )
        key = self.admin_key if admin and self.admin_key else self.api_key
        if not key:
            return details
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {key}")]
        return details._replace(metadata=metadata)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _BearerAuthStreams(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    """``_BearerAuth`` for unary-stream calls (WatchJob)."""

    def __init__(self, api_key: str, admin_key: str) -> None:
        self._auth = _BearerAuth(api_key, admin_key)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._auth._details(details), request)


class JobClient:
    """Async client over grpc.aio; use ``async with JobClient([...]) as c`` or ``close()``."""

    def __init__(
        self,
        addresses: str | Sequence[str] | None = None,
        *,
        timeout: float | None = 60.0,
        scrape_timeout: float | None = 300.0,
        retry_budget: float | None = None,
        api_key: str = "",
        admin_key: str = "",
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """``timeout`` bounds each unary call (``scrape_timeout`` a Scrape and a Map);
        WatchJob is unbounded. ``retry`` is the retry policy (``RetryPolicy()`` by
        default); ``retry_budget``, when given, replaces its budget (the most seconds
        spent sleeping between retries). ``api_key`` / ``admin_key`` are sent as bearer
        tokens. ``tls_ca`` (a PEM file) turns on TLS and names the CA to trust;
        ``tls_cert`` + ``tls_key`` (PEM files, both or neither; TLS on, trusting the
        system roots without ``tls_ca``) are a client certificate to present (mTLS).
        ``credentials`` (e.g. ``grpc.ssl_channel_credentials(...)``, or composite ones)
        replaces all three. ``channel_options`` (``("grpc.keepalive_time_ms",
        30000)``, ...) are passed to every channel, over the client's own defaults."""
        self._interceptors: list[Any] = (
            [_BearerAuth(api_key, admin_key), _BearerAuthStreams(api_key, admin_key)]
            if api_key or admin_key
            else []
        )
        self._credentials = credentials or _tls_credentials(tls_ca, tls_cert, tls_key)
        self._channel_options = list({**dict(_CHANNEL_OPTIONS), **dict(channel_options)}.items())
        self.failover = Failover(parse_addresses(addresses))
        self.timeout = timeout
        self.scrape_timeout = scrape_timeout
        policy = retry or RetryPolicy()
        if retry_budget is not None:
            policy = dataclasses.replace(policy, budget=retry_budget)
        self.retry = policy
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, JobServiceAsyncStub] = {}
        self._admin_stubs: dict[str, AdminServiceAsyncStub] = {}
        self._located = False

    async def __aenter__(self) -> JobClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        self._admin_stubs.clear()
        for channel in channels:
            await channel.close(None)

    @property
    def addresses(self) -> list[str]:
        return list(self.failover.addresses)

    @property
    def retry_budget(self) -> float:
        """The retry policy's budget: the most seconds of sleep between retries."""
        return self.retry.budget

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(
                address,
                self._credentials,
                options=self._channel_options,
                interceptors=self._interceptors,
            )
            self._channels[address] = channel
        return channel

    def stub(self, address: str) -> JobServiceAsyncStub:
        """The stub for ``address`` (one channel per address, made on first use)."""
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = jobs_pb2_grpc.JobServiceStub(self._channel(address))
        return stub

    def admin_stub(self, address: str) -> AdminServiceAsyncStub:
        """The AdminService stub for ``address`` (any address; same channel as ``stub``)."""
        stub = self._admin_stubs.get(address)
        if stub is None:
            channel = self._channel(address)
            stub = self._admin_stubs[address] = replication_pb2_grpc.AdminServiceStub(channel)  # type: ignore[assignment]
        return stub

    # ------------------------------------------------------------ admin and the primary

    async def role(
        self, address: str, *, timeout: float | None = None
    ) -> replication_pb2.RoleResponse:
        """``AdminService.Role`` of one node (no failover: the caller names the node)."""
        return await self.admin_stub(address).Role(
            replication_pb2.RoleRequest(), timeout=timeout or self.timeout
        )

    async def promote(self, address: str) -> replication_pb2.PromoteResponse:
        """``AdminService.Promote`` on one node (never retried, never sent elsewhere)."""
        return await self.admin_stub(address).Promote(
            replication_pb2.PromoteRequest(), timeout=self.timeout
        )

    async def find_primary(self) -> str | None:
        """Ask every address for its Role (concurrently, bounded) and prefer the primary
        of the highest epoch; returns its address (None: no primary answered)."""
        self._located = True
        addresses = list(self.failover.addresses)
        bound = min(self.timeout or ROLE_LOOKUP_SECONDS, ROLE_LOOKUP_SECONDS)
        results = await asyncio.gather(
            *(self.role(a, timeout=bound) for a in addresses), return_exceptions=True
        )
        answers = [
            (a, r if isinstance(r, replication_pb2.RoleResponse) else None)
            for a, r in zip(addresses, results, strict=True)
        ]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, grpc.aio.AioRpcError):
                raise r  # a cancellation or a bug, not a node that could not answer
        primary = choose_primary(answers)
        if primary is not None:
            self.failover.prefer(primary)
        return primary

    async def wait_connected(
        self, timeout: float, addresses: Sequence[str] | None = None, *, every: bool = False
    ) -> None:
        """Wait at most ``timeout`` seconds for a ready channel to one of ``addresses``
        (default: the client's), or to every one of them with ``every``; ``Unreachable``
        names those not ready otherwise. The calls' failover and retries are unchanged:
        this only bounds how long a caller waits for a server that is not there at all."""
        targets = list(dict.fromkeys(addresses or self.failover.addresses))
        waits = {asyncio.ensure_future(self._channel(a).channel_ready()): a for a in targets}
        try:
            done, _ = await asyncio.wait(
                waits,
                timeout=timeout,
                return_when=asyncio.ALL_COMPLETED if every else asyncio.FIRST_COMPLETED,
            )
        finally:
            for task in waits:
                task.cancel()
        ready = {waits[t] for t in done if not t.cancelled() and t.exception() is None}
        if not ready or (every and len(ready) < len(targets)):
            raise Unreachable([a for a in targets if a not in ready], timeout)

    async def _locate_once(self) -> None:
        if not self._located and len(self.failover.addresses) > 1:
            await self.find_primary()

    async def call(
        self,
        invoke: Callable[[JobServiceAsyncStub], Awaitable[T]],
        *,
        retryable: bool,
        control: bool = False,
    ) -> T:
        """Run one unary call under the failover and retry rules of the module docstring
        (``control``: those of CancelJob and ResumeJob)."""
        delays = iter(self.retry.delays())
        await self._locate_once()
        while True:
            errors: list[grpc.aio.AioRpcError] = []
            known = set(self.failover.addresses)
            order = self.failover.order()
            tried = 0
            while tried < len(order):
                address = order[tried]
                tried += 1
                try:
                    result = await invoke(self.stub(address))
                except grpc.aio.AioRpcError as err:
                    reason = rpcerrors.reason_of(err)
                    timed_out = (
                        control
                        and reason is None
                        and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    )  # a frozen node: an idempotent control write moves on
                    if not timed_out and not should_try_next(
                        err.code(), retryable=retryable, reason=reason
                    ):
                        self.failover.prefer(address)
                        raise
                    # NOT_PRIMARY names the primary: try it next (even if not listed).
                    follow_primary(order, tried, primary_named(err))
                    if address in known or reason is not None:
                        # a named primary that is not listed and cannot be reached
                        # (e.g. an address only its standby can reach) does not turn
                        # the round into a retry loop: it is simply not chosen
                        errors.append(err)
                    continue
                self.failover.prefer(address)
                return result
            await self._after_failed_round(errors, delays, retryable=retryable, control=control)

    async def _after_failed_round(
        self,
        errors: list[grpc.aio.AioRpcError],
        delays: Iterator[float],
        *,
        retryable: bool,
        control: bool = False,
    ) -> None:
        """Sleep before the next round (and look the primary up again), or raise the
        round's most telling error."""
        codes = [e.code() for e in errors]
        reasons = [rpcerrors.reason_of(e) for e in errors]
        err = errors[pick_error(codes, reasons)]
        if not keeps_trying(codes, reasons, retryable=retryable, control=control):
            raise err
        delay = next(delays, None)
        if delay is None:
            raise err
        await asyncio.sleep(delay)
        if len(self.failover.addresses) > 1:
            await self.find_primary()  # a standby may have been promoted meanwhile

    # ------------------------------------------------------------ RPCs

    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions | None = None
    ) -> jobs_pb2.Document:
        req = jobs_pb2.ScrapeRequest(url=url, options=options)
        resp = await self.call(
            lambda s: s.Scrape(req, timeout=self.scrape_timeout),
            retryable=is_retryable("Scrape"),
        )
        return resp.document

    async def start_batch(
        self, request: jobs_pb2.StartBatchScrapeRequest
    ) -> jobs_pb2.StartBatchScrapeResponse:
        """Register a batch-scrape job; a request without idempotency key gets one."""
        req = with_idempotency_key(request)
        return await self.call(
            lambda s: s.StartBatchScrape(req, timeout=self.timeout),
            retryable=is_retryable("StartBatchScrape", req.idempotency_key),
        )

    async def start_crawl(self, request: jobs_pb2.StartCrawlRequest) -> str:
        """Register a crawl job and return its id; a request without key gets one."""
        req = with_idempotency_key(request)
        resp = await self.call(
            lambda s: s.StartCrawl(req, timeout=self.timeout),
            retryable=is_retryable("StartCrawl", req.idempotency_key),
        )
        return resp.id

    async def get_job(
        self, job_id: str, *, skip: int = 0, limit: int = 0, status_only: bool = False
    ) -> jobs_pb2.GetJobResponse:
        req = jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=limit, status_only=status_only)
        return await self.call(lambda s: s.GetJob(req, timeout=self.timeout), retryable=True)

    async def iter_pages(
        self, job_id: str, *, page_size: int = 0
    ) -> AsyncIterator[jobs_pb2.GetJobResponse]:
        """Every GetJob page from skip 0, following ``next_skip`` until it is absent."""
        skip = 0
        while True:
            page = await self.get_job(job_id, skip=skip, limit=page_size)
            yield page
            if not page.HasField("next_skip"):
                return
            if page.next_skip <= skip:
                raise ClientError(f"next_skip {page.next_skip} does not advance past {skip}")
            skip = page.next_skip

    async def iter_documents(
        self, job_id: str, *, page_size: int = 0
    ) -> AsyncIterator[jobs_pb2.Document]:
        """Every document of the job, in index order, across all pages."""
        async for page in self.iter_pages(job_id, page_size=page_size):
            for doc in page.documents:
                yield doc

    async def watch(
        self, job_id: str, from_index: int = 0
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        """WatchJob's events; a stream broken by UNAVAILABLE resumes at the next index."""
        next_index = from_index
        delays = iter(self.retry.delays())
        await self._locate_once()
        while True:
            errors: list[grpc.aio.AioRpcError] = []
            progressed = False
            for address in self.failover.order():
                req = jobs_pb2.WatchJobRequest(id=job_id, from_index=next_index)
                call = self.stub(address).WatchJob(req)
                try:
                    async for event in call:
                        if not progressed:
                            self.failover.answered(address)
                            progressed = True
                        if event.WhichOneof("event") == "document":
                            next_index = event.document.index + 1
                        yield event
                    return
                except grpc.aio.AioRpcError as err:
                    reason = rpcerrors.reason_of(err)
                    if progressed and err.code() == grpc.StatusCode.UNAVAILABLE and not reason:
                        break  # the server went away mid-stream: start a fresh round
                    if not should_try_next(err.code(), retryable=True, reason=reason):
                        self.failover.answered(address)
                        raise
                    errors.append(err)
                finally:
                    call.cancel()
            if progressed:
                delays = iter(self.retry.delays())
                continue
            await self._after_failed_round(errors, delays, retryable=True)

    async def errors_page(
        self, job_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> jobs_pb2.GetJobErrorsResponse:
        """One page of the job's errors (AIP-158: next_page_token empty at the end)."""
        req = jobs_pb2.GetJobErrorsRequest(id=job_id, page_size=page_size, page_token=page_token)
        return await self.call(lambda s: s.GetJobErrors(req, timeout=self.timeout), retryable=True)

    async def errors(self, job_id: str, *, page_size: int = 0) -> jobs_pb2.GetJobErrorsResponse:
        """Every error of the job, all pages in one response (next_page_token empty)."""
        out = jobs_pb2.GetJobErrorsResponse()
        token = ""
        while True:
            page = await self.errors_page(job_id, page_size=page_size, page_token=token)
            out.errors.extend(page.errors)
            out.robots_blocked.extend(page.robots_blocked)
            if not page.next_page_token or page.next_page_token == token:
                return out
            token = page.next_page_token

    def _control_timeout(self) -> float:
        if self.timeout is None:
            return CONTROL_ATTEMPT_SECONDS
        return min(self.timeout, CONTROL_ATTEMPT_SECONDS)

    async def cancel(self, job_id: str) -> jobs_pb2.JobState.ValueType:
        """CancelJob, tried through a failover (module docstring); the job's state
        after it (cancelling a finished job returns its state)."""
        req = jobs_pb2.CancelJobRequest(id=job_id)
        resp = await self.call(
            lambda s: s.CancelJob(req, timeout=self._control_timeout()),
            retryable=is_retryable("CancelJob"),
            control=True,
        )
        return resp.state

    async def resume(self, job_id: str) -> jobs_pb2.JobState.ValueType:
        """ResumeJob (a paused job runs again), tried like ``cancel``; the job's state
        after it."""
        req = jobs_pb2.ResumeJobRequest(id=job_id)
        resp = await self.call(
            lambda s: s.ResumeJob(req, timeout=self._control_timeout()),
            retryable=is_retryable("ResumeJob"),
            control=True,
        )
        return resp.state

    async def map(
        self,
        url: str,
        *,
        limit: int = 0,
        search: str = "",
        sitemap: jobs_pb2.SitemapMode.ValueType = jobs_pb2.SITEMAP_MODE_INCLUDE,
        include_paths: Sequence[str] = (),
        exclude_paths: Sequence[str] = (),
        allow_subdomains: bool = False,
        ignore_query_parameters: bool = False,
    ) -> list[str]:
        """The site's URLs (``JobService.Map``), every batch of the stream, in rank
        order. Map stores nothing, so a call broken by UNAVAILABLE (or refused by a
        standby) is simply sent again whole, like a read; bounded by ``scrape_timeout``."""
        req = jobs_pb2.MapRequest(
            url=url,
            limit=limit,
            search=search,
            sitemap=sitemap,
            include_paths=include_paths,
            exclude_paths=exclude_paths,
            allow_subdomains=allow_subdomains,
            ignore_query_parameters=ignore_query_parameters,
        )

        async def collect(stub: JobServiceAsyncStub) -> list[str]:
            call = stub.Map(req, timeout=self.scrape_timeout)
            try:
                return [u async for batch in call for u in batch.urls]
            finally:
                call.cancel()

        return await self.call(collect, retryable=True)

    async def list_jobs_page(
        self,
        *,
        active_only: bool = False,
        states: Sequence[jobs_pb2.JobState.ValueType] = (),
        page_size: int = 0,
        page_token: str = "",
    ) -> jobs_pb2.ListJobsResponse:
        """One page of the caller's jobs, newest first (AIP-158: send next_page_token
        back with the same filter; empty at the end)."""
        req = jobs_pb2.ListJobsRequest(
            active_only=active_only, states=states, page_size=page_size, page_token=page_token
        )
        return await self.call(lambda s: s.ListJobs(req, timeout=self.timeout), retryable=True)

    async def list_jobs(
        self,
        *,
        active_only: bool = False,
        states: Sequence[jobs_pb2.JobState.ValueType] = (),
        page_size: int = 0,
    ) -> list[jobs_pb2.JobSummary]:
        """Every job of the caller (newest first), page after page."""
        jobs: list[jobs_pb2.JobSummary] = []
        token = ""
        while True:
            page = await self.list_jobs_page(
                active_only=active_only, states=states, page_size=page_size, page_token=token
            )
            jobs.extend(page.jobs)
            if not page.next_page_token or page.next_page_token == token:
                return jobs
            token = page.next_page_token


# ---------------------------------------------------------------- the sync client


def _blocking(
    method: Callable[Concatenate[JobClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncJobClient, P], T]:
    """``JobClient.method`` as a blocking ``SyncJobClient`` method (same arguments)."""

    def run(self: SyncJobClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.run(lambda client: method(client, *args, **kwargs))

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


def _blocking_iter(
    method: Callable[Concatenate[JobClient, P], AsyncIterator[T]],
) -> Callable[Concatenate[SyncJobClient, P], Iterator[T]]:
    """``JobClient.method`` (an async iterator) as a ``SyncJobClient`` generator."""

    def run(self: SyncJobClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(lambda client: method(client, *args, **kwargs))

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


class SyncJobClient:
    """``JobClient`` for code without an event loop: every method blocks until the
    call (with its failover and retries) is done, and the iterators are plain ones.

    It runs one ``JobClient`` on a private event loop in a daemon thread
    (``pagesift-client``), so it works in threads, in scripts and next to another
    event loop alike, and may be shared by threads (calls run on that one loop). The
    keyword arguments are ``JobClient``'s. Use ``with SyncJobClient([...]) as c`` or
    ``close()``. ``run(lambda c: c.some_call(...))`` runs any ``JobClient`` coroutine.
    """

    def __init__(self, addresses: str | Sequence[str] | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pagesift-client", daemon=True
        )
        self._thread.start()
        try:
            self._client: JobClient = self._submit(self._make(addresses, dict(options)))
        except BaseException:
            self._stop()
            raise

    @staticmethod
    async def _make(addresses: str | Sequence[str] | None, options: Mapping[str, Any]) -> JobClient:
        return JobClient(addresses, **options)  # made on its loop, as its channels will be

    def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("SyncJobClient is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. Ctrl-C while waiting: the call is cancelled too
            raise

    def _stop(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def client(self) -> JobClient:
        """The wrapped ``JobClient`` (use it only through ``run``: it lives on another loop)."""
        return self._client

    @property
    def addresses(self) -> list[str]:
        return self._client.addresses

    def run(self, call: Callable[[JobClient], Awaitable[T]]) -> T:
        """Run ``call(client)`` on the client's loop and return its result."""

        async def invoke() -> T:
            return await call(self._client)

        return self._submit(invoke())

    def _iterate(self, make: Callable[[JobClient], AsyncIterator[T]]) -> Iterator[T]:
        iterator = make(self._client)

        async def step() -> tuple[bool, T | None]:
            try:
                return True, await anext(iterator)
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, item = self._submit(step())
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None and not self._loop.is_closed():
                self._submit(close())

    def close(self) -> None:
        """Close the channels and stop the loop's thread (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            self._submit(self._client.close())
        finally:
            self._stop()

    def __enter__(self) -> SyncJobClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    scrape = _blocking(JobClient.scrape)
    start_batch = _blocking(JobClient.start_batch)
    start_crawl = _blocking(JobClient.start_crawl)
    get_job = _blocking(JobClient.get_job)
    errors_page = _blocking(JobClient.errors_page)
    errors = _blocking(JobClient.errors)
    cancel = _blocking(JobClient.cancel)
    resume = _blocking(JobClient.resume)
    map = _blocking(JobClient.map)
    list_jobs_page = _blocking(JobClient.list_jobs_page)
    list_jobs = _blocking(JobClient.list_jobs)
    role = _blocking(JobClient.role)
    promote = _blocking(JobClient.promote)
    find_primary = _blocking(JobClient.find_primary)
    wait_connected = _blocking(JobClient.wait_connected)
    iter_pages = _blocking_iter(JobClient.iter_pages)
    iter_documents = _blocking_iter(JobClient.iter_documents)
    watch = _blocking_iter(JobClient.watch)
