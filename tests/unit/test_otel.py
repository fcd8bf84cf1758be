"""relay.otel: the producer span of each publish, its outcome, links and sampling; no servers
(spans are kept in memory)."""

from __future__ import annotations

import itertools
import json
import logging
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from relay.backoff import Backoff
from relay.daemon import start_tracing
from relay.errors import ConfigError
from relay.otel import OtelTracing, _headers, _writer, provider
from relay.records import OutboxRow, Outcome, Settlement
from relay.settings import TracingSettings
from relay.settle import SettlePolicy
from relay.tracing import trace_ids, writer_context
from tests.support.rows import row

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
WRITER_SPAN = "00f067aa0ba902b7"
NODE = ("127.0.0.1", 5672)
POLICY = SettlePolicy(3, Backoff(1.0, 10.0))


class Traced:
    def __init__(self, sampler: Sampler | None = None) -> None:
        self.exported = InMemorySpanExporter()
        tracer_provider = TracerProvider(
            sampler=sampler or ParentBased(ALWAYS_ON), shutdown_on_exit=False
        )
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.exported))
        self.tracing = OtelTracing(tracer_provider)

    def publish(self, r: OutboxRow, outcome: Outcome, detail: str = "") -> dict[str, str]:
        """One attempt: the span starts, the broker answers, the policy settles it."""
        headers = self.tracing.start(r, NODE)
        assert headers is not None
        settlements = [Settlement(r, outcome, detail)]
        self.tracing.finish(settlements, POLICY.batch(settlements))
        return dict(headers)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exported.get_finished_spans())


def sampled(traceparent: str) -> bool:
    """The sampled bit of a traceparent's flags (the SDK also sets bit 1: a random trace id)."""
    return bool(int(traceparent.rsplit("-", 1)[1], 16) & 1)


def written(id: int, flags: str = "01", **fields: object) -> OutboxRow:
    parent = f"00-{TRACE}-{WRITER_SPAN}-{flags}"
    return row(id, headers=json.dumps({"traceparent": parent, "tracestate": "k=v"}), **fields)


def test_a_publish_is_a_producer_span_child_of_the_writer_whose_context_goes_out() -> None:
    traced = Traced()
    headers = traced.publish(written(7, routing_key="order.created"), Outcome.ACKED)
    [span] = traced.spans()
    assert span.name == "send ex" and span.kind is SpanKind.PRODUCER
    assert span.parent is not None and span.parent.is_remote
    assert (f"{span.parent.trace_id:032x}", f"{span.parent.span_id:016x}") == (TRACE, WRITER_SPAN)
    assert span.context is not None
    # The message carries the relay's span, in the writer's trace, with the writer's state.
    assert trace_ids(headers["traceparent"]) == (TRACE, f"{span.context.span_id:016x}")
    assert headers["tracestate"] == "k=v"
    assert dict(span.attributes or {}) == {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "ex",
        "messaging.rabbitmq.destination.routing_key": "order.created",
        "messaging.message.id": "m-7",
        "messaging.message.body.size": 1,
        "server.address": "127.0.0.1",
        "server.port": 5672,
        "outbox.row_id": 7,
        "outbox.attempts": 0,
        "outbox.outcome": "acked",
    }
    assert span.status.status_code is StatusCode.UNSET
    assert [e.name for e in span.events] == ["acked"]


def test_the_default_exchange_is_named_and_an_empty_routing_key_left_out() -> None:
    traced = Traced()
    traced.publish(row(1, exchange="", routing_key=""), Outcome.ACKED)
    [span] = traced.spans()
    assert span.name == "send amq.default"
    attributes = span.attributes or {}
    assert attributes["messaging.destination.name"] == ""
    assert "messaging.rabbitmq.destination.routing_key" not in attributes


# An outcome -> (the span's error.type, its events), on a row's first of three attempts.
OUTCOMES = {
    Outcome.NACKED: ("nacked", ["nacked"]),
    Outcome.RETURNED: ("returned", ["returned"]),
    Outcome.TIMED_OUT: ("timed_out", ["timed_out"]),
    Outcome.FAILED: ("failed", ["failed"]),
    Outcome.LOST: ("lost", ["lost"]),
    Outcome.REJECTED: ("parked", ["rejected", "parked"]),  # never retried: parked at once
}


@pytest.mark.parametrize(("outcome", "expected"), OUTCOMES.items(), ids=[o.value for o in OUTCOMES])
def test_an_unacked_outcome_is_an_error_with_its_event(
    outcome: Outcome, expected: tuple[str, list[str]]
) -> None:
    traced = Traced()
    traced.publish(written(1), outcome, "the broker's words")
    [span] = traced.spans()
    error_type, events = expected
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == f"{error_type}: the broker's words"
    assert (span.attributes or {})["error.type"] == error_type
    assert (span.attributes or {})["outbox.outcome"] == outcome.value
    assert [e.name for e in span.events] == events
    assert (span.events[0].attributes or {})["detail"] == "the broker's words"


def test_a_retry_links_to_its_earlier_attempt_and_the_last_one_is_parked() -> None:
    traced = Traced()
    first = written(1)
    traced.publish(first, Outcome.NACKED, "x")
    second = written(1, attempts=1, last_error="nacked: x")
    traced.publish(second, Outcome.TIMED_OUT)
    third = written(1, attempts=2, last_error="timed_out")
    traced.publish(third, Outcome.NACKED, "y")  # the third failure: max_attempts 3
    spans = traced.spans()
    assert len(spans) == 3
    assert spans[0].links == ()
    for earlier, later in itertools.pairwise(spans):
        assert [link.context for link in later.links] == [earlier.context]
    assert all(s.context is not None and f"{s.context.trace_id:032x}" == TRACE for s in spans)
    parked = spans[2]
    assert [e.name for e in parked.events] == ["nacked", "parked"]
    assert (parked.events[1].attributes or {})["outbox.attempts"] == 3
    assert (parked.attributes or {})["error.type"] == "parked"
    # Parked: nothing is left to link to.
    traced.publish(written(1, attempts=3), Outcome.ACKED)
    assert traced.spans()[3].links == ()


def test_an_acked_retry_forgets_its_earlier_attempts() -> None:
    traced = Traced()
    traced.publish(written(1), Outcome.NACKED)
    traced.publish(written(1, attempts=1), Outcome.ACKED)
    traced.publish(written(1, attempts=1), Outcome.ACKED)  # a duplicate claim, say
    assert traced.spans()[2].links == ()


def test_a_row_released_before_its_publish_has_no_span() -> None:
    traced = Traced()
    r = written(1)
    settlements = [Settlement(r, Outcome.LOST, "released")]
    traced.tracing.finish(settlements, POLICY.batch(settlements))
    assert traced.spans() == []


@pytest.mark.parametrize(
    "traceparent",
    ["junk", f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE.upper()}-{WRITER_SPAN}-01", ""],
)
def test_a_malformed_traceparent_starts_a_new_trace_with_a_debug_line_and_the_row_goes_on(
    traceparent: str, caplog: pytest.LogCaptureFixture
) -> None:
    traced = Traced()
    with caplog.at_level(logging.DEBUG, logger="relay.otel"):
        headers = traced.publish(
            row(5, headers=json.dumps({"traceparent": traceparent})), Outcome.ACKED
        )
    [span] = traced.spans()
    assert span.parent is None and span.status.status_code is StatusCode.UNSET
    assert span.context is not None
    assert trace_ids(headers["traceparent"]) == (
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
    )
    assert [r.action for r in caplog.records] == ["traceparent_ignored"]  # type: ignore[attr-defined]


def test_parent_based_sampling_follows_the_writers_decision() -> None:
    traced = Traced(ParentBased(TraceIdRatioBased(0.0)))
    kept = traced.publish(written(1, flags="01"), Outcome.ACKED)
    dropped = traced.publish(written(2, flags="00"), Outcome.ACKED)
    rootless = traced.publish(row(3), Outcome.ACKED)
    assert len(traced.spans()) == 1  # only the writer's sampled trace is recorded
    assert sampled(kept["traceparent"])
    # Unsampled, the message still carries the context: the consumer continues the trace
    # (and its decision not to sample) instead of starting one of its own.
    assert not sampled(dropped["traceparent"])
    assert (trace_ids(dropped["traceparent"]) or ("",))[0] == TRACE
    assert not sampled(rootless["traceparent"])


@pytest.mark.parametrize(
    "sampler",
    [
        ParentBased(ALWAYS_ON),
        ParentBased(TraceIdRatioBased(0.5)),
        ParentBased(ALWAYS_OFF, remote_parent_sampled=ALWAYS_OFF),
    ],
    ids=lambda s: s.get_description()[:40],
)
@pytest.mark.parametrize(
    ("flags", "state"),
    [("00", None), ("02", None), ("00", "a=1, b=2"), ("02", "a=1,=bad"), ("00", "=")],
)
def test_a_row_its_writer_did_not_sample_gets_the_context_the_sdk_would_give_it(
    sampler: Sampler, flags: str, state: str | None
) -> None:
    """Parent-based samplers drop such spans: the relay writes their context itself, so it
    must be the one the SDK writes (a new span id in the writer's trace, same flags, the
    writer's trace state as the propagator parses it), and no span is recorded."""
    headers = {"traceparent": f"00-{TRACE}-{WRITER_SPAN}-{flags}"}
    if state is not None:
        headers["tracestate"] = state
    r = row(1, headers=json.dumps(headers))
    traced = Traced(sampler)
    got = traced.tracing.start(r, NODE)
    assert got is not None
    # Without a span of its own, the row's log lines carry the writer's ids.
    assert traced.tracing.log_fields(r) == {"trace_id": TRACE, "span_id": WRITER_SPAN}
    traced.tracing.finish([Settlement(r, Outcome.NACKED)], POLICY.batch([]))
    assert traced.spans() == []

    sdk_span = (
        TracerProvider(sampler=sampler, shutdown_on_exit=False)
        .get_tracer("t")
        .start_span("send ex", context=_writer(1, writer_context(r)))
    )
    assert not sdk_span.is_recording()
    expected = _headers(sdk_span.get_span_context())
    version, trace_id, span_id, written_flags = got["traceparent"].split("-")
    assert (version, trace_id, written_flags) == tuple(
        expected["traceparent"].split("-")[i] for i in (0, 1, 3)
    )
    assert len(span_id) == 16 and span_id not in (WRITER_SPAN, "0" * 16)
    assert got.get("tracestate") == expected.get("tracestate")


def test_a_sampler_that_may_keep_spans_under_an_unsampled_writer_gets_to_decide() -> None:
    traced = Traced(ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON))
    headers = traced.publish(written(1, flags="00"), Outcome.ACKED)
    [span] = traced.spans()
    assert span.context is not None and span.context.trace_flags.sampled
    assert sampled(headers["traceparent"])


def test_log_lines_carry_the_publish_spans_ids_while_it_runs_else_the_writers() -> None:
    traced = Traced()
    r = written(1)
    headers = traced.tracing.start(r, NODE)
    assert headers is not None
    assert traced.tracing.log_fields(r) == dict(
        zip(("trace_id", "span_id"), trace_ids(headers["traceparent"]) or (), strict=True)
    )
    traced.tracing.finish([Settlement(r, Outcome.ACKED)], POLICY.batch([]))
    assert traced.tracing.log_fields(r) == {"trace_id": TRACE, "span_id": WRITER_SPAN}
    assert traced.tracing.log_fields(row(2)) == {}


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": f"00-{TRACE}-{WRITER_SPAN}-01"},
        {"traceparent": f"00-{TRACE}-{WRITER_SPAN}-00", "tracestate": "a=1,b=2"},
        {"traceparent": f"00-{TRACE}-{WRITER_SPAN}-03", "tracestate": ""},
        {"traceparent": f"01-{TRACE}-{WRITER_SPAN}-01-future"},
        {"traceparent": f"00-{TRACE}-{WRITER_SPAN}-01-extra"},
        {"traceparent": f"ff-{TRACE}-{WRITER_SPAN}-01"},
        {"traceparent": "junk"},
    ],
)
def test_the_context_read_and_written_is_what_opentelemetrys_propagator_reads_and_writes(
    headers: dict[str, str],
) -> None:
    """relay.otel formats and parses the W3C headers itself (for speed): as the propagator."""
    propagator = TraceContextTextMapPropagator()
    expected = trace.get_current_span(propagator.extract(headers)).get_span_context()
    ours = _writer(1, writer_context(row(1, headers=json.dumps(headers))))
    got = trace.get_current_span(ours).get_span_context() if ours is not None else None
    if not expected.is_valid:
        assert got is None
        return
    assert got == expected and got.trace_state == expected.trace_state
    written: dict[str, str] = {}
    propagator.inject(written, trace.set_span_in_context(trace.NonRecordingSpan(expected)))
    assert _headers(expected) == written


def test_the_service_is_named_outbox_relay_unless_otel_variables_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)
    assert provider(InMemorySpanExporter()).resource.attributes["service.name"] == "outbox-relay"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=billing-relay,team=pay")
    attributes = provider(InMemorySpanExporter()).resource.attributes
    assert (attributes["service.name"], attributes["team"]) == ("billing-relay", "pay")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "orders-relay")
    assert provider(InMemorySpanExporter()).resource.attributes["service.name"] == "orders-relay"


def test_without_the_tracing_extra_an_exporter_setting_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "relay.otel", None)  # as if OpenTelemetry were missing
    with pytest.raises(ConfigError, match=r"needs the tracing extra: pip install"):
        start_tracing(TracingSettings("otlp"))
    assert type(start_tracing(TracingSettings())).__name__ == "NoTracing"
