"""The gRPC side of the metrics: ``MetricsInterceptor`` counts and times every RPC.

What it owns
------------
``pagesift_grpc_requests_total{method,code}``, ``pagesift_grpc_server_started_total``
and ``pagesift_grpc_server_handling_seconds`` are families of ``Metrics``; this module
is the one writer of them. The node puts the interceptor first on both servers
(``pagesift.node.grpcserver``), so it sees the code the later interceptors set.

Guarantees
----------
- Every RPC is counted (and timed) exactly once, when it finishes, with its final
  status code: OK, the code given to ``context.abort`` / ``context.set_code``,
  CANCELLED when the call is cancelled, UNKNOWN for an escaping exception, and
  UNIMPLEMENTED (method label ``unknown``, so label cardinality stays bounded) for a
  method no service has. Unary and streaming handlers alike.
- With tracing on (``pagesift.core.util.tracing``) it also opens each RPC's server
  span, which continues the caller's trace.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from pagesift.core.api.interceptors import Behavior, rewrap
from pagesift.core.api.metrics import Metrics
from pagesift.core.api.tls import Handler, ServerInterceptor
from pagesift.core.util import tracing


def _code_name(code: object) -> str:
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "OK" if code is None else "UNKNOWN"


class MetricsInterceptor(ServerInterceptor):
    """Counts ``pagesift_grpc_requests_total{method,code}`` for every finished RPC, and
    ``pagesift_grpc_server_started_total`` and ``pagesift_grpc_server_handling_seconds``.

    grpc.aio gives an interceptor the handler, not the outcome, so the handler's
    behavior is wrapped: after it returns, ``context.code()`` is None (OK) or what
    ``set_code`` set; ``context.abort`` raises ``grpc.aio.AbortError`` after setting
    the code, so ``context.code()`` is read then too; any other exception reaches
    the client as UNKNOWN, and cancellation as CANCELLED. Streaming responses wrap the
    async generator and count (and time) when it ends.

    Our own rather than a library's: py-grpc-prometheus serves sync servers only (and
    the global registry), grpc-interceptor has no metrics; this wrapper is where the
    final code is known anyway. With tracing on, the wrapped behavior runs inside the
    RPC's server span (``tracing.server_span``), which continues the caller's trace.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def _count(self, method: str, code: str) -> None:
        self._m.grpc_requests.labels(method, code).inc()

    def _finish(self, method: str, code: str, started: float) -> None:
        self._m.grpc_requests.labels(method, code).inc()
        self._m.grpc_handling_seconds.labels(method, code).observe(time.perf_counter() - started)

    def _outcome(self, context: Any, exc: BaseException | None) -> str:
        if exc is None or isinstance(exc, grpc.aio.AbortError):
            return _code_name(context.code())
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            return "CANCELLED"
        return "UNKNOWN"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            self._count("unknown", "UNIMPLEMENTED")
            return handler
        method = handler_call_details.method.lstrip("/")
        md = handler_call_details.invocation_metadata
        return rewrap(handler, lambda behavior: self._wrap(method, md, behavior))

    def _wrap(self, method: str, md: Any, behavior: Behavior) -> Behavior:
        started_total = self._m.grpc_started.labels(method)
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                started_total.inc()
                started = time.perf_counter()
                exc: BaseException | None = None
                with tracing.server_span(method, md) as span:
                    try:
                        async for item in behavior(request, context):
                            yield item
                    except BaseException as e:
                        exc = e
                        raise
                    finally:
                        code = self._outcome(context, exc)
                        self._finish(method, code, started)
                        tracing.end_rpc(span, code, _code_value(code))

            return stream

        async def unary(request: Any, context: Any) -> Any:
            started_total.inc()
            started = time.perf_counter()
            exc: BaseException | None = None
            with tracing.server_span(method, md) as span:
                try:
                    result = behavior(request, context)
                    if inspect.isawaitable(result):
                        result = await result
                    return result
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    code = self._outcome(context, exc)
                    self._finish(method, code, started)
                    tracing.end_rpc(span, code, _code_value(code))

        return unary


def _code_value(name: str) -> int:
    code = getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)
    value: int = code.value[0]
    return value
