"""The metadata guard: calls to guarded method prefixes need a key or token in metadata.

What it owns
------------
``MetadataGuard``, a grpc.aio server interceptor that refuses calls to given method
prefixes (e.g. ``/pagesift.v1.AdminService/``) unless a predicate on the call's
metadata holds (the admin key, the replication token), and ``GuardRule``, one prefix
with its predicate and refusal.

Guarantees
----------
- A guarded method's own handler never runs for a refused call: the guard hands gRPC a
  handler of the same shape (unary/streaming) that only refuses, so clients see a clean
  status, mapped by the error table (``errortable.refuse``) like every other refusal.
- A refusal of a client-streaming call first takes the client's first message (for at
  most ``FIRST_MESSAGE_WAIT``): a client still sending it when the call ends would
  otherwise see its write fail as INTERNAL instead of the refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from pagesift.core.api import errortable
from pagesift.core.api.tls import Handler, Metadata, ServerInterceptor


@dataclass(frozen=True)
class GuardRule:
    """Calls whose method starts with ``prefix`` need ``allowed(metadata)``."""

    prefix: str  # e.g. "/pagesift.v1.AdminService/"
    allowed: Callable[[Metadata], bool]
    message: str
    code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED

    def refusal(self, method: str) -> errortable.CallNotAllowed:
        """The refusal of a call to ``method``: REPLICATION_NOT_ALLOWED /
        ADMIN_KEY_REQUIRED by the service the prefix names, else UNAUTHENTICATED (the
        error table's rows)."""
        if "ReplicationService" in self.prefix:
            return errortable.ReplicationNotAllowed(method, self.message, self.code)
        if "AdminService" in self.prefix:
            return errortable.AdminKeyRequired(method, self.message, self.code)
        return errortable.KeyRequired(method, self.message, self.code)


class MetadataGuard(ServerInterceptor):
    """Refuses calls that match a rule and fail its predicate (first matching rule wins)."""

    def __init__(self, rules: Sequence[GuardRule]) -> None:
        self.rules = list(rules)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        method = handler_call_details.method
        rule = next((r for r in self.rules if method.startswith(r.prefix)), None)
        handler = await continuation(handler_call_details)
        if rule is None or handler is None:
            return handler
        if rule.allowed(handler_call_details.invocation_metadata):
            return handler
        return _refusal(handler, rule.refusal(method))


#: How long a refusal of a client-streaming call waits for the client's first message.
FIRST_MESSAGE_WAIT = 1.0


def _refusal(handler: Handler, refused: errortable.CallNotAllowed) -> Handler:
    async def refuse(context: Any) -> None:
        await errortable.refuse(context, refused)

    async def deny(request: Any, context: Any) -> Any:
        await refuse(context)

    async def deny_stream(request: Any, context: Any) -> AsyncIterator[Any]:
        await refuse(context)
        if False:  # an async generator, like the streaming method it replaces
            yield None

    async def first_message(requests: AsyncIterator[Any]) -> None:
        # Ending the call while the client's first write is in flight makes that
        # write fail client-side with INTERNAL ("Internal error from Core"), which
        # masks our status (seen in ~5% of refused replication sessions).
        with contextlib.suppress(Exception):
            async with asyncio.timeout(FIRST_MESSAGE_WAIT):
                async for _ in requests:
                    return

    async def deny_requests(requests: AsyncIterator[Any], context: Any) -> Any:
        await first_message(requests)
        await refuse(context)

    async def deny_requests_stream(
        requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        await first_message(requests)
        await refuse(context)
        if False:  # an async generator, like the streaming method it replaces
            yield None

    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny_requests, des, ser)
    return grpc.stream_stream_rpc_method_handler(deny_requests_stream, des, ser)
