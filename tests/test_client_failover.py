"""The client's failover rules (``pagesift.client.failover``), pure: no server, no clock.

Which address a call goes to next, when a round is tried again and which error a
failed round reports; the errors a server would send are built with the server's own
``rpcerrors.rich_status`` so the rules meet the real wire format.
"""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from grpc_status import rpc_status

from pagesift.client.failover import (
    DEFAULT_ADDRESS,
    Failover,
    choose_primary,
    follow_primary,
    keeps_trying,
    parse_addresses,
    pick_error,
    primary_named,
    should_try_next,
)
from pagesift.core.api import rpcerrors
from pagesift.core.api.rpcerrors import Reason
from pagesift.v1 import replication_pb2 as pb

C = grpc.StatusCode


def refusal(code: grpc.StatusCode, reason: str, **metadata: str) -> grpc.aio.AioRpcError:
    """An error as a pagesift server sends it: the rich status in the trailing metadata."""
    rich = rpc_status.to_status(rpcerrors.rich_status(code, "refused", reason, metadata))
    trailing = grpc.aio.Metadata(*rich.trailing_metadata)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, "refused", None)


def bare(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    """An error without details: a transport error, or a server older than the details."""
    empty = grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, empty, empty, "", None)


# ---------------------------------------------------------------- addresses


def test_addresses_are_split_stripped_and_deduplicated_in_order() -> None:
    assert parse_addresses(None) == [DEFAULT_ADDRESS]
    assert parse_addresses([]) == [DEFAULT_ADDRESS]
    assert parse_addresses(" , ") == [DEFAULT_ADDRESS]
    assert parse_addresses("a:1, b:2,,a:1") == ["a:1", "b:2"]
    assert parse_addresses(["a:1", "c:3,b:2"]) == ["a:1", "c:3", "b:2"]


def test_the_address_that_last_answered_is_tried_first_then_the_rest_in_order() -> None:
    f = Failover(["p:1", "s:2", "s:3"])
    assert f.order() == ["p:1", "s:2", "s:3"]
    f.answered("s:3")
    assert f.order() == ["s:3", "p:1", "s:2"]
    assert f.preferred == "s:3"
    f.prefer("new:4")  # e.g. what a Role lookup says is the primary
    assert f.order() == ["new:4", "p:1", "s:2", "s:3"]
    f.prefer("p:1")  # a known address is not added twice
    assert f.addresses == ["p:1", "s:2", "s:3", "new:4"]
    with pytest.raises(ValueError):
        Failover([])


def test_a_named_primary_is_tried_next_unless_tried_already_this_round() -> None:
    order = ["a", "b", "c"]
    follow_primary(order, 1, "c")  # after "a" refused naming "c"
    assert order == ["a", "c", "b"]
    follow_primary(order, 2, "a")  # "a" was tried: not again in this round
    assert order == ["a", "c", "b"]
    follow_primary(order, 2, "z:9")  # not given: added right after the tried ones
    assert order == ["a", "c", "z:9", "b"]
    follow_primary(order, 3, None)
    assert order == ["a", "c", "z:9", "b"]


def test_the_primary_named_is_read_only_from_a_send_elsewhere_refusal() -> None:
    refused = refusal(C.FAILED_PRECONDITION, Reason.NOT_PRIMARY, primary="p:1")
    assert primary_named(refused) == "p:1"
    assert primary_named(refusal(C.FAILED_PRECONDITION, Reason.FENCED, primary="p:2")) == "p:2"
    assert primary_named(refusal(C.FAILED_PRECONDITION, Reason.NOT_PRIMARY)) is None
    other = refusal(C.FAILED_PRECONDITION, Reason.WEBHOOK_SECRET_MISSING, primary="p:1")
    assert primary_named(other) is None
    assert primary_named(bare(C.FAILED_PRECONDITION)) is None


def test_choose_primary_prefers_the_highest_epoch_and_ignores_others() -> None:
    def r(role: pb.NodeRole.ValueType, epoch: int) -> pb.RoleResponse:
        return pb.RoleResponse(role=role, epoch=epoch)

    primary, standby, fenced = pb.NODE_ROLE_PRIMARY, pb.NODE_ROLE_STANDBY, pb.NODE_ROLE_FENCED
    assert choose_primary([]) is None
    assert choose_primary([("a", None), ("b", r(standby, 3))]) is None
    assert choose_primary([("a", r(standby, 3)), ("b", r(primary, 2))]) == "b"
    assert choose_primary([("a", r(primary, 1)), ("b", r(primary, 2))]) == "b"
    assert choose_primary([("a", r(primary, 2)), ("b", r(primary, 2))]) == "a"
    assert choose_primary([("a", r(fenced, 5)), ("b", r(primary, 2))]) == "b"


# ---------------------------------------------------------------- within a round


def test_without_a_reason_the_code_decides_whether_to_move_on() -> None:
    assert should_try_next(C.FAILED_PRECONDITION, retryable=False)
    assert should_try_next(C.FAILED_PRECONDITION, retryable=True)
    assert should_try_next(C.UNAVAILABLE, retryable=True)
    assert not should_try_next(C.UNAVAILABLE, retryable=False)  # the request may have left
    for code in (C.NOT_FOUND, C.INVALID_ARGUMENT, C.DEADLINE_EXCEEDED, C.OUT_OF_RANGE):
        assert not should_try_next(code, retryable=True)


def test_with_a_reason_only_not_primary_and_fenced_move_on_whatever_the_code() -> None:
    for code in (C.FAILED_PRECONDITION, C.UNAVAILABLE, C.INTERNAL):
        assert should_try_next(code, retryable=False, reason=Reason.NOT_PRIMARY)
        assert should_try_next(code, retryable=False, reason=Reason.FENCED)
    # a server that answered: its answer, whatever the code
    assert not should_try_next(
        C.FAILED_PRECONDITION, retryable=True, reason=Reason.WEBHOOK_SECRET_MISSING
    )
    assert not should_try_next(C.UNAVAILABLE, retryable=True, reason=Reason.PAGE_FETCH_FAILED)


# ---------------------------------------------------------------- after a round


def test_the_reported_error_is_a_refusal_naming_the_primary_before_unavailable() -> None:
    assert pick_error([C.UNAVAILABLE, C.FAILED_PRECONDITION, C.UNAVAILABLE]) == 1
    assert pick_error([C.FAILED_PRECONDITION, C.FAILED_PRECONDITION]) == 0
    assert pick_error([C.UNAVAILABLE, C.UNAVAILABLE]) == 1  # the last UNAVAILABLE
    codes = [C.UNAVAILABLE, C.FAILED_PRECONDITION, C.FAILED_PRECONDITION]
    assert pick_error(codes, [None, None, Reason.NOT_PRIMARY]) == 2
    assert pick_error(codes, [None, Reason.WEBHOOK_SECRET_MISSING, Reason.FENCED]) == 2
    assert pick_error(codes) == 1
    with pytest.raises(ValueError):
        pick_error([])


def test_a_retryable_call_keeps_trying_while_some_address_was_unavailable() -> None:
    assert keeps_trying([C.FAILED_PRECONDITION, C.UNAVAILABLE], [None, None], retryable=True)
    assert not keeps_trying([C.UNAVAILABLE], [None], retryable=False)
    refused = [C.FAILED_PRECONDITION, C.FAILED_PRECONDITION]
    both = [Reason.NOT_PRIMARY, Reason.FENCED]
    assert not keeps_trying(refused, both, retryable=True)  # every address refused: raised


def test_a_control_write_keeps_trying_while_the_pair_fails_over() -> None:
    dead, refused = C.DEADLINE_EXCEEDED, C.FAILED_PRECONDITION
    standby = [dead, refused], [None, Reason.NOT_PRIMARY]
    assert keeps_trying(*standby, retryable=True, control=True)
    assert not keeps_trying(*standby, retryable=True)  # a read or Scrape: raised, not retried
    assert not keeps_trying([refused], [Reason.QUOTA_EXCEEDED], retryable=True, control=True)
    assert not keeps_trying([C.NOT_FOUND], [None], retryable=True, control=True)
    assert not keeps_trying([], [], retryable=True, control=True)
    assert keeps_trying([C.UNAVAILABLE], [None], retryable=True)
