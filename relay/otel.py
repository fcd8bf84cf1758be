"""OpenTelemetry tracing: a producer span per publish, ended with its confirm outcome.

The only module that imports OpenTelemetry; ``relay.daemon`` imports it only when tracing is
on, so a relay without the ``tracing`` extra never needs it. The spans follow OpenTelemetry's
messaging semantic conventions for RabbitMQ: one ``send <exchange>`` span of kind PRODUCER
per publish of a row, whose parent is the writer's context from the row's headers, and
whose own context goes out in the message's ``traceparent`` header, so that a consumer's
span becomes its child. The span ends when the broker answered (or did not): its outcome
is an event and, when not acked, the span's error status; a row the settle policy parks
gets a ``parked`` event and ``error.type`` ``parked``. A later publish of the same row links
to the span of its earlier attempt, when this relay published that one.

Everything else is OpenTelemetry's own configuration, read by the SDK from the standard
``OTEL_*`` variables: endpoint, headers, sampler (default: parent-based, always on), service
name and resource attributes, batch sizes.
"""

from __future__ import annotations

import importlib
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

import relay
from relay.constants import DEFAULT_SERVICE_NAME, TRACE_LINKS_MAX
from relay.records import PARKED, OutboxRow, Outcome, SettleBatch, Settlement
from relay.settings import TracingSettings
from relay.tracing import TRACEPARENT, TRACESTATE, trace_ids, writer_context, writer_log_fields

log = logging.getLogger(__name__)

# Where a traceparent's flags are: after "00-", 32 hex digits, "-", 16 hex digits and "-".
_FLAGS = slice(53, 55)
_DEFAULT_EXCHANGE = "amq.default"  # what RabbitMQ calls the exchange named ""
# How a parent-based sampler describes itself when it drops every span whose remote parent
# was not sampled (the default of ParentBased and of every OTEL_TRACES_SAMPLER parentbased_*).
_DROPS_UNSAMPLED_REMOTE = "remoteParentNotSampled:AlwaysOffSampler"


# The OTLP exporter of each protocol, imported only when chosen (gRPC's pulls in grpcio).
_OTLP_EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}


def start(settings: TracingSettings) -> OtelTracing:
    """Tracing as ``settings`` (and the SDK's ``OTEL_*`` variables) configure it."""
    return OtelTracing(provider(exporter(settings)))


def exporter(settings: TracingSettings) -> SpanExporter:
    """The span exporter ``OTEL_TRACES_EXPORTER`` names, configured by the SDK from ``OTEL_*``."""
    if settings.exporter == "console":
        return ConsoleSpanExporter()
    module = importlib.import_module(_OTLP_EXPORTERS[settings.protocol])
    otlp: SpanExporter = module.OTLPSpanExporter()
    return otlp


def provider(span_exporter: SpanExporter) -> TracerProvider:
    """A tracer provider with the sampler and resource of ``OTEL_*``; the service is named
    ``outbox-relay`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` name it."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return tracer_provider


class OtelTracing:
    """``relay.tracing.Tracing`` on OpenTelemetry. Runs on the event loop's thread only."""

    def __init__(self, tracer_provider: TracerProvider) -> None:
        self._provider = tracer_provider
        self._tracer = tracer_provider.get_tracer("outbox-relay", relay.__version__)
        sampler = tracer_provider.sampler
        # With such a sampler, a row whose writer did not sample its trace gets a span that
        # is dropped whatever else it holds: ``start`` then writes that span's context
        # itself, without the SDK's 20 us per row (most rows, at a low sampling rate).
        self._parent_decides = isinstance(sampler, ParentBased) and (
            _DROPS_UNSAMPLED_REMOTE in sampler.get_description()
        )
        self._spans: dict[int, Span] = {}  # row id -> the span of its publish under way
        # row id -> the span context of its last unacked attempt, for the next attempt's
        # link. Bounded: a relay restart forgets them anyway (every attempt still has the
        # writer's span as parent, so they stay in one trace).
        self._earlier: OrderedDict[int, trace.SpanContext] = OrderedDict()

    def start(self, row: OutboxRow, server: tuple[str, int]) -> Mapping[str, str] | None:
        carrier = writer_context(row)
        if self._parent_decides and (dropped := self._dropped(carrier)) is not None:
            return dropped
        earlier = self._earlier.pop(row.id, None)
        span = self._tracer.start_span(
            f"send {row.exchange or _DEFAULT_EXCHANGE}",
            context=_writer(row.id, carrier),
            kind=SpanKind.PRODUCER,
            # What a sampler may look at; the rest only when the span is sampled (most are
            # not, at a low sampling rate, and each attribute costs on the hot path).
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": row.exchange,
            },
            links=[Link(earlier)] if earlier is not None else None,
        )
        self._spans[row.id] = span
        if span.is_recording():
            attributes: dict[str, Any] = {
                "messaging.message.id": row.message_id,
                "messaging.message.body.size": len(row.payload),
                "server.address": server[0],
                "server.port": server[1],
                "outbox.row_id": row.id,
                "outbox.attempts": row.attempts,
            }
            if row.routing_key:
                attributes["messaging.rabbitmq.destination.routing_key"] = row.routing_key
            span.set_attributes(attributes)
        return _headers(span.get_span_context())

    def finish(self, settlements: Sequence[Settlement], batch: SettleBatch) -> None:
        parked = {c.id: c for c in batch.changes if c.status == PARKED}
        for s in settlements:
            span = self._spans.pop(s.row.id, None)
            if span is None or not span.is_recording():
                continue  # released before it was published, or not sampled
            outcome = s.outcome.value
            span.set_attribute("outbox.outcome", outcome)
            span.add_event(outcome, {"detail": s.detail} if s.detail else None)
            if s.outcome is not Outcome.ACKED:
                error = outcome
                if (change := parked.get(s.row.id)) is not None:
                    error = PARKED
                    span.add_event(
                        PARKED, {"outbox.attempts": change.attempts, "reason": change.last_error}
                    )
                else:
                    self._remember(s.row.id, span.get_span_context())
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR, f"{error}: {s.detail or outcome}"))
            span.end()

    def _dropped(self, carrier: Mapping[str, str]) -> dict[str, str] | None:
        """The headers of the span the SDK would start, and drop, under the writer's
        ``carrier`` when that context is valid and not sampled (else None): a new span id in
        the writer's trace, not sampled, random-trace-id flag and trace state as the
        writer's (the tests compare it with the SDK's)."""
        traceparent = carrier.get(TRACEPARENT)
        if traceparent is None or (ids := trace_ids(traceparent)) is None:
            return None
        flags = int(traceparent[_FLAGS], 16)
        if flags & TraceFlags.SAMPLED:
            return None
        span_id = self._provider.id_generator.generate_span_id()
        headers = {
            TRACEPARENT: f"00-{ids[0]}-{span_id:016x}-{flags & TraceFlags.RANDOM_TRACE_ID:02x}"
        }
        if state := _trace_state(carrier):
            headers[TRACESTATE] = state.to_header()
        return headers

    def _remember(self, row_id: int, context: trace.SpanContext) -> None:
        self._earlier[row_id] = context
        if len(self._earlier) > TRACE_LINKS_MAX:
            self._earlier.popitem(last=False)

    def log_fields(self, row: OutboxRow) -> dict[str, str]:
        span = self._spans.get(row.id)
        if span is None:  # its publish is over: the writer's ids, as without tracing
            return writer_log_fields(row)
        context = span.get_span_context()
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

    def shutdown(self) -> None:
        self._provider.shutdown()


def _headers(context: trace.SpanContext) -> dict[str, str]:
    """W3C trace context headers of ``context``: what the propagator's ``inject`` writes,
    formatted here directly because inject goes through the context API, which cost the
    relay 10 us per message (a third of tracing's cost at 1% sampling)."""
    headers = {
        TRACEPARENT: f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    }
    if context.trace_state:
        headers[TRACESTATE] = context.trace_state.to_header()
    return headers


def _writer(row_id: int, carrier: Mapping[str, str]) -> Context | None:
    """The writer's context from ``carrier`` (``writer_context`` of row ``row_id``), or
    None (a new trace) when it has none or it is malformed; a malformed one is logged at
    debug level, never held against the row."""
    if not carrier:
        return None
    traceparent = carrier[TRACEPARENT]
    ids = trace_ids(traceparent)
    if ids is None:
        log.debug(
            "row %d: malformed traceparent %r ignored; published in a new trace",
            row_id,
            traceparent[:80],
            extra={"action": "traceparent_ignored", "row_id": row_id},
        )
        return None
    # Built here rather than by the propagator's extract, which cost 20 us per message (as
    # much as the span itself); trace_ids has checked the text (the tests compare the two).
    parent = trace.SpanContext(
        int(ids[0], 16),
        int(ids[1], 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(traceparent[_FLAGS], 16)),
        trace_state=_trace_state(carrier),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def _trace_state(carrier: Mapping[str, str]) -> TraceState | None:
    """The writer's ``tracestate``, parsed as the propagator does (bad entries dropped)."""
    state = carrier.get(TRACESTATE)
    return TraceState.from_header([state]) if state else None
