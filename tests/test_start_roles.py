"""A data directory remembers its role: a standby's or a deposed primary's store
never silently starts as a primary (that would fork the replicated history)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pagesift.core.replication.slot import open_slot
from pagesift.node import grpcserver
from pagesift.node.startup import StartRefused
from tests.helpers import node_config


async def start_as_primary(data: Path) -> None:
    stop = asyncio.Event()
    stop.set()  # serve nothing: only the start-up checks matter here
    await asyncio.wait_for(grpcserver.run(node_config(data), stop), 15)


async def test_a_standbys_store_refuses_to_start_as_a_primary(tmp_path: Path) -> None:
    slot = open_slot(tmp_path)
    slot.log.adopt("a" * 32, 1)  # what a follower records when it follows a primary
    slot.close()
    with pytest.raises(StartRefused, match="belongs to a standby"):
        await start_as_primary(tmp_path)


async def test_a_fenced_primarys_store_refuses_to_start_as_a_primary(tmp_path: Path) -> None:
    slot = open_slot(tmp_path)
    slot.log.open_for_writes()
    slot.log.fence(2)  # it met a peer of epoch 2: it was deposed
    slot.close()
    with pytest.raises(StartRefused, match="refusing to start as a primary"):
        await start_as_primary(tmp_path)


async def test_a_primarys_store_starts_as_a_primary_again(tmp_path: Path) -> None:
    slot = open_slot(tmp_path)
    slot.log.open_for_writes()
    slot.close()
    await start_as_primary(tmp_path)
