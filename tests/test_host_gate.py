"""The host gate of a clustered node: asked inside the host's slot, last; and abandon.

``HostSlots`` with a gate (``politeness``) and the clustered runtime's gate
(``clustered.OwnedHosts``) over real ``Owners`` and a real ``Tenure``: the source below
is the ``OwnersSource`` port a registry read fills, fed here by hand so every instant is
chosen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from pagesift.core.cluster import placement
from pagesift.core.cluster.ownership import Owners
from pagesift.core.cluster.tenure import Tenure
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.politeness import HostSlots
from pagesift.primary.jobs.clustered import OwnedHosts

PAIRS = ("alpha", "beta")


def _hosts(pair: str) -> list[str]:
    return [h for h in (f"h{k}.test" for k in range(200)) if placement.owner(h, PAIRS) == pair]


def _host(pair: str) -> str:
    return _hosts(pair)[0]


class ReadOwners:
    """An ``OwnersSource`` whose reads the test makes (``read``)."""

    def __init__(self, tenure: Tenure) -> None:
        self.tenure = tenure
        self.moved: Callable[[Owners], object] | None = None
        self._owners = Owners("alpha")

    def read(self, pairs: tuple[str, ...]) -> None:
        self._owners = Owners.read("alpha", pairs)
        self.tenure.read(pairs, time.monotonic())

    def current(self) -> Owners:
        return self._owners

    def fence(self, host: str, now: float) -> float:
        return self.tenure.wait(host, now)

    def joined(self, now: float) -> None:
        self.tenure.joined(now)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def _held(settle: float = 0.5) -> ReadOwners:
    tenure = Tenure("alpha", ttl=60.0, settle=settle, stall=60.0)
    tenure.round_began(time.monotonic())
    tenure.granted(time.monotonic(), lapsed=False)
    owners = ReadOwners(tenure)
    owners.read(PAIRS)
    return owners


class Refuse:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def admit(self, host: str) -> None:
        self.asked.append(host)
        raise PageError(ErrorCode.HOST_OWNED_ELSEWHERE, f"{host} is not ours")


async def test_a_refused_request_gives_its_permit_back() -> None:
    slots = HostSlots(1)
    gate = Refuse()
    slots.gate = gate
    for _ in range(3):  # one permit: a leaked one would block the second forever
        with pytest.raises(PageError) as err:
            async with asyncio.timeout(10), slots.slot("h.test"):
                raise AssertionError("the body of a refused request ran")
        assert err.value.code == ErrorCode.HOST_OWNED_ELSEWHERE
    assert gate.asked == ["h.test"] * 3
    slots.gate = None
    async with asyncio.timeout(10), slots.slot("h.test"):
        pass
    assert len(slots) == 0


async def test_abandon_ends_the_requests_in_flight_to_the_hosts_that_left_only() -> None:
    slots = HostSlots(2)
    slots.gate = OwnedHosts(_held(settle=0.0))
    leaves, stays = _hosts("alpha")[:2]
    started = asyncio.Event()
    finished: list[str] = []

    async def request(host: str) -> str:
        async with slots.slot(host):
            started.set()
            await asyncio.sleep(0.3 if host == stays else 60)
            finished.append(host)
        return host

    lost = asyncio.create_task(request(leaves))
    kept = asyncio.create_task(request(stays))
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(0.05)
    assert slots.abandon(lambda host: host == leaves) == 1
    with pytest.raises(PageError) as err:
        await asyncio.wait_for(lost, 10)
    assert err.value.code == ErrorCode.HOST_OWNED_ELSEWHERE
    assert "in flight" in err.value.message
    assert await asyncio.wait_for(kept, 10) == stays
    assert finished == [stays]
    async with asyncio.timeout(10), slots.slot(leaves), slots.slot(leaves):
        pass  # both of its permits came back


async def test_the_gate_refuses_a_host_another_pair_owns_naming_the_owner() -> None:
    gate = OwnedHosts(_held(settle=0.0))
    await asyncio.wait_for(gate.admit(_host("alpha")), 10)
    with pytest.raises(PageError) as err:
        await gate.admit(_host("beta"))
    assert err.value.code == ErrorCode.HOST_OWNED_ELSEWHERE
    assert "pair beta" in err.value.message


async def test_a_host_that_came_to_this_pair_is_sent_only_after_the_handover() -> None:
    owners = _held(settle=0.6)
    owners.read(("alpha", "beta", "gamma"))
    came = next(
        h
        for h in (f"h{k}.test" for k in range(2000))
        if placement.owner(h, ("alpha", "beta", "gamma")) == "gamma"
        and placement.owner(h, PAIRS) == "alpha"
    )
    moved_at = time.monotonic()
    owners.read(PAIRS)  # gamma left
    await asyncio.wait_for(OwnedHosts(owners).admit(came), 10)
    assert time.monotonic() - moved_at >= 0.6 * 0.9  # waited (a lower bound only)


async def test_a_hold_never_confirmed_fails_the_request_as_a_timeout_after_the_limit() -> None:
    tenure = Tenure("alpha", ttl=60.0, settle=0.0, stall=60.0)  # no lease was ever granted
    owners = ReadOwners(tenure)
    owners.read(PAIRS)
    with pytest.raises(PageError) as err:
        await asyncio.wait_for(OwnedHosts(owners, limit=0.5).admit(_host("alpha")), 20)
    assert err.value.code == ErrorCode.TIMEOUT
    assert "has not held host" in err.value.message
