"""The one etcd client (``pagesift.coord.etcd``) on a real etcd: rotation and health.

(The first call after an outage: tests/test_cluster_outage.py, through a node.)

- A dead endpoint first in the list costs one failed call: the next goes to the next.
- ``health`` asks every endpoint: the live one answers with its member id, the raft
  leader (itself, alone), its db size; the dead one says why.
"""

from __future__ import annotations

import socket

import pytest

from pagesift.coord.etcd import Etcd, EtcdUnavailable
from pagesift.drill.fixture import Etcd as EtcdProcess

pytestmark = pytest.mark.system

KEY = b"/pagesift-test/probe"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _endpoint(proc: EtcdProcess) -> tuple[str, int]:
    host, port = proc.endpoint.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


async def test_a_dead_endpoint_costs_one_call_and_health_names_it(etcd: EtcdProcess) -> None:
    dead = ("127.0.0.1", _free_port())
    client = Etcd([dead, _endpoint(etcd)], timeout=2.0, label="registry")
    try:
        with pytest.raises(EtcdUnavailable, match=r"^registry: "):
            await client.call(lambda c: c.get(KEY))
        assert await client.call(lambda c: c.get(KEY)) is None
        down, up = await client.health()
        assert not down.ok and down.error and down.endpoint == f"127.0.0.1:{dead[1]}"
        assert up.ok and up.is_leader and up.db_size > 0 and up.version
    finally:
        await client.close()
