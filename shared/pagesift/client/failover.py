"""Which server address a call goes to next: the client's failover rules, as pure functions.

What it owns
------------
- ``Failover``: the address that last answered is tried first, then the others in the
  order given (``parse_addresses``); a ``Role`` lookup prefers the writable primary of
  the highest epoch (``choose_primary``: a deposed primary that has not met the new
  epoch still says "primary", and loses on the epoch).
- Within a round (``should_try_next``): only a refusal whose reason is NOT_PRIMARY or
  FENCED (``SEND_ELSEWHERE``: nothing was done there) moves on; any other answer of a
  server is the answer. An error without details (a transport error, a server older
  than the details) is judged by its code: FAILED_PRECONDITION moves on, UNAVAILABLE
  only for a retryable call (the request may have left). The primary a refusal names
  is tried next, even if it was not given (``primary_named``, ``follow_primary``).
- After a round (``keeps_trying``, ``pick_error``): a retryable call sleeps and tries
  again while some address was UNAVAILABLE (a promotion may be under way); a control
  write (CancelJob, ResumeJob) also while every address refused or did not answer in
  time. Otherwise the round's most telling error is raised: a refusal naming the
  primary beats UNAVAILABLE.

Invariants
----------
No I/O and no clock: the shell (``pagesift.client.aio.JobClient.call``) feeds codes,
reasons and ``Role`` answers in and carries the decisions out, so every rule is
tested without a server (tests/test_client_failover.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc
import grpc.aio

from pagesift.client.errors import SEND_ELSEWHERE, error_info_of
from pagesift.v1 import replication_pb2

__all__ = [
    "DEFAULT_ADDRESS",
    "FAILOVER_CODES",
    "Failover",
    "choose_primary",
    "follow_primary",
    "keeps_trying",
    "parse_addresses",
    "pick_error",
    "primary_named",
    "should_try_next",
]

DEFAULT_ADDRESS = "127.0.0.1:50051"
#: the codes that move a call on when its error carries no reason (``should_try_next``)
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})


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


def should_try_next(code: grpc.StatusCode, *, retryable: bool, reason: str | None = None) -> bool:
    """After ``code`` (with the ``ErrorInfo`` ``reason``, if any) from one address, try
    the next one?

    Keyed on the reason when the error carries one: only NOT_PRIMARY and FENCED move
    on; any other answer of a server is the answer, whatever its code (a Scrape whose
    page timed out is UNAVAILABLE with reason PAGE_FETCH_FAILED: not retried elsewhere).

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
    info = error_info_of(err)
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


class Failover:
    """Which address to try first, then the rest in their given order.

    ``answered`` makes an address the preferred one; ``prefer`` also adds one that was
    not given (the primary a ``Role`` lookup or a refusal names).
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
