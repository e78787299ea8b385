"""Handler rewrapping for grpc.aio interceptors, and the malformed-request guard.

What it owns
------------
- ``rewrap``: the same kind of method handler (unary/streaming on each side) with its
  behavior, and optionally its request deserializer, replaced. Every interceptor of
  the server (metrics, this guard) builds its handlers with it.
- ``MalformedRequests``: bytes that do not parse as the method's request message
  answer ``INVALID_ARGUMENT`` ("request: not a valid pagesift.v1.GetJobRequest"; reason
  MALFORMED_REQUEST, a BadRequest naming the field ``request``),
  logged once per method, instead of gRPC's ``UNKNOWN`` carrying the parser's
  exception text.

Why it is safe
--------------
gRPC deserializes each request before (unary) or while (streaming) the handler
runs, and turns a deserializer exception into ``UNKNOWN``. The guard's deserializer
never raises on bad bytes: it returns a ``Malformed`` marker, and the wrapped
behavior aborts when it meets one, before the servicer sees anything. A servicer
therefore only ever receives parsed messages; the marker cannot leak into it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from pagesift.core.api import errortable
from pagesift.core.api.tls import Handler, ServerInterceptor

__all__ = ["Behavior", "Malformed", "MalformedRequests", "rewrap"]

logger = logging.getLogger("pagesift.requests")

Behavior = Callable[..., Any]
Deserializer = Callable[[bytes], Any] | None


def rewrap(
    handler: Handler,
    wrap: Callable[[Behavior], Behavior],
    deserializer: Deserializer = None,
) -> Handler:
    """``handler`` with its behavior replaced by ``wrap(behavior)`` (and its request
    deserializer by ``deserializer`` when one is given)."""
    des = deserializer or handler.request_deserializer
    ser = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary), des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(wrap(handler.unary_stream), des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary), des, ser)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(wrap(handler.stream_stream), des, ser)
    return handler


class Malformed:
    """Stands for a request message that did not parse."""

    __slots__ = ()


MALFORMED = Malformed()


class MalformedRequests(ServerInterceptor):
    """Answers INVALID_ARGUMENT for request bytes that are not the method's message."""

    def __init__(self) -> None:
        self._logged: set[str] = set()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        message = _message_name(parse)
        method = handler_call_details.method

        def tolerant(raw: bytes) -> Any:
            try:
                return parse(raw)
            except (DecodeError, ValueError, TypeError):
                return MALFORMED

        async def refuse(context: Any) -> None:
            if method not in self._logged:
                self._logged.add(method)
                logger.warning("%s: a request that is not a valid %s was refused", method, message)
            await errortable.refuse(context, errortable.MalformedRequest(message))

        streaming_requests = handler.request_streaming

        def wrap(behavior: Behavior) -> Behavior:
            async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
                async for request in requests:
                    if request is MALFORMED:
                        await refuse(context)
                    yield request

            if inspect.isasyncgenfunction(behavior):

                async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                    if streaming_requests:
                        request = checked(request, context)
                    elif request is MALFORMED:
                        await refuse(context)
                    async for item in behavior(request, context):
                        yield item

                return stream

            async def unary(request: Any, context: Any) -> Any:
                if streaming_requests:
                    request = checked(request, context)
                elif request is MALFORMED:
                    await refuse(context)
                return await behavior(request, context)

            return unary

        return rewrap(handler, wrap, tolerant)


def _message_name(parse: Callable[[bytes], Any]) -> str:
    """``pagesift.v1.GetJobRequest`` for a generated ``FromString``, else "request message"."""
    owner = getattr(parse, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", None)
    return name if isinstance(name, str) else "request message"
