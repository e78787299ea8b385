"""Optional OpenTelemetry tracing: off unless the standard environment asks for it.

What it owns
------------
The node's one tracer (or none). ``configure_from_env`` turns tracing on when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, or
``OTEL_TRACES_EXPORTER`` is ``otlp`` or ``console`` (``none`` keeps it off whatever
else is set). The OTLP exporter is the gRPC one and reads the rest of the standard
variables itself (headers, insecure, timeout, certificates); the resource honours
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (service name ``pagesift`` by
default) and the sampler ``OTEL_TRACES_SAMPLER``. Tests call ``install`` with a
provider of their own (an in-memory exporter).

Spans (names and attributes)
----------------------------
- ``rpc`` server spans, named ``pagesift.v1.JobService/Scrape`` etc. (kind SERVER,
  ``rpc.system``/``rpc.service``/``rpc.method``/``rpc.grpc.status_code``), continuing
  the W3C trace context of the call's metadata (``traceparent``), made by the metrics
  interceptor; streaming RPCs end with the stream;
- ``fetch``: one ``HttpEngine.scrape`` (``server.address``, ``http.response.status_code``,
  ``error.type`` = the page error code);
- ``store.commit``: one committed ``Store.write`` group (``pagesift.store.ops``,
  ``pagesift.log.offset``);
- ``replication.apply``: a run of log entries applied on a standby
  (``pagesift.log.first_offset``, ``pagesift.log.last_offset``, ``pagesift.log.entries``).
  The primary's trace does not travel in the replication frame; a primary's
  ``store.commit`` and the standby's ``replication.apply`` meet on the log offset.

Cost when off
-------------
Nothing from ``opentelemetry`` is imported, and ``span`` returns one shared
``nullcontext`` (a global read and a call): the crawl path pays nothing measurable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "GRPC_SERVER_ERRORS",
    "configure_from_env",
    "current_ids",
    "enabled",
    "end_rpc",
    "install",
    "server_span",
    "shutdown",
    "span",
    "wanted",
]

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_NULL: AbstractContextManager[None] = contextlib.nullcontext()

# the server-side codes the OpenTelemetry gRPC conventions count as span errors
GRPC_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def wanted(env: Mapping[str, str] | None = None) -> str | None:
    """The exporter the environment asks for (``otlp`` | ``console``), or None (off)."""
    env = os.environ if env is None else env
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none" or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    if exporter in ("otlp", "console"):
        return exporter
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return "otlp"
    return None


def configure_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on as the environment says; True when it is on."""
    exporter_name = wanted(env)
    if exporter_name is None:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    env = os.environ if env is None else env
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "pagesift"}
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    return True


def install(provider: TracerProvider | None) -> None:
    """Trace into ``provider`` from now on (None: tracing off)."""
    global _tracer, _provider
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer("pagesift")


def shutdown() -> None:
    """Flush and stop the configured exporter; tracing is off afterwards."""
    provider = _provider
    install(None)
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _tracer is not None


def span(
    name: str, attributes: Mapping[str, str | int] | None = None
) -> AbstractContextManager[Span | None]:
    """A span made current for the ``with`` block (its value: the span), or a shared
    no-op context (value None) when tracing is off. An escaping exception is recorded
    and sets the span's status to ERROR."""
    tracer = _tracer
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(name, attributes=attributes)


@contextlib.contextmanager
def _rpc(tracer: Tracer, method: str, metadata: Sequence[tuple[str, Any]] | None) -> Iterator[Span]:
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    carrier = {k: v for k, v in (metadata or ()) if isinstance(v, str)}
    parent = propagate.extract(carrier)
    service, _, name = method.rpartition("/")
    with tracer.start_as_current_span(
        method,
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        record_exception=False,
        set_status_on_exception=False,
    ) as s:
        yield s


def server_span(
    method: str, metadata: Sequence[tuple[str, Any]] | None
) -> AbstractContextManager[Span | None]:
    """The server span of one RPC (``method``: ``pkg.Service/Method``), continuing the
    trace context in the call's ``metadata``; a no-op context when tracing is off."""
    tracer = _tracer
    if tracer is None:
        return _NULL
    return _rpc(tracer, method, metadata)


def end_rpc(s: Span | None, code: str, code_value: int) -> None:
    """Record the RPC's final status code on its server span."""
    if s is None:
        return
    s.set_attribute("rpc.grpc.status_code", code_value)
    if code in GRPC_SERVER_ERRORS:
        from opentelemetry.trace import Status, StatusCode

        s.set_status(Status(StatusCode.ERROR, code))


def current_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) in hex of the current span, when tracing is on and one is."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
