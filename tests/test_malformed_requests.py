"""Bytes that are not the method's protobuf message: INVALID_ARGUMENT, a clean message,
one log line per method, and nothing reaches the servicer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from pagesift.client.errors import details_of
from pagesift.core.api import rpcerrors
from pagesift.core.api.tls import token_metadata
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import PAIR_TOKEN, in_process_node

GARBAGE = b"\xff\xff\xff\x0f not a protobuf message"


async def test_a_malformed_request_is_invalid_argument_on_every_kind_of_method(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pagesift.requests")
    async with in_process_node(tmp_path / "p") as n:
        ch = n.channel
        calls: dict[str, Callable[[], Any]] = {
            "pagesift.v1.GetJobRequest": lambda: ch.unary_unary(
                "/pagesift.v1.JobService/GetJob", None, None
            )(GARBAGE, timeout=5),
            "pagesift.v1.WatchJobRequest": lambda: ch.unary_stream(
                "/pagesift.v1.JobService/WatchJob", None, None
            )(GARBAGE, timeout=5),
            "pagesift.v1.StreamRequest": lambda: ch.stream_stream(
                "/pagesift.v1.ReplicationService/Stream", None, None
            )(iter([GARBAGE]), metadata=token_metadata(PAIR_TOKEN), timeout=5),
        }
        for message, call in calls.items():
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    answer = call()
                    if hasattr(answer, "__aiter__"):
                        async for _item in answer:
                            pass
                    else:
                        await answer
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details() == f"request: not a valid {message}"
                status = rpc_status.from_call(cast(Any, refused.value))
                (info,) = details_of(status, error_details_pb2.ErrorInfo)
                assert info.reason == rpcerrors.Reason.MALFORMED_REQUEST
                assert info.metadata["message"] == message
                (bad,) = details_of(status, error_details_pb2.BadRequest)
                assert [v.field for v in bad.field_violations] == ["request"]
        # the node still answers well-formed calls
        stub = jobs_pb2_grpc.JobServiceStub(n.channel)
        await stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5)
    lines = [r.getMessage() for r in caplog.records if r.name == "pagesift.requests"]
    assert len(lines) == 3, lines  # once per method, not once per call
    assert all("was refused" in line and "Error" not in line for line in lines)
