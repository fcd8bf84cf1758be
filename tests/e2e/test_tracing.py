"""One trace from the writer to the consumer: `relay run` with OTLP export to a receiver on
loopback, the real broker, a writer and a consumer with OpenTelemetry of their own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from devtools.broker import names
from devtools.otlp import OtlpReceiver, ReceivedSpan
from devtools.outbox import sent_ids, statuses
from devtools.relayproc import RelayProcess, relay, relay_env
from devtools.servers import RabbitNode, wait_until
from relay.tracing import trace_ids

PRODUCER, CONSUMER = 4, 5  # opentelemetry.proto's SpanKind numbers
ERROR = 2
PROPAGATOR = TraceContextTextMapPropagator()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    received = OtlpReceiver()
    yield received
    received.stop()


def app_tracer(receiver: OtlpReceiver, service: str) -> tuple[TracerProvider, trace.Tracer]:
    """The writer's or the consumer's own OpenTelemetry, exporting to the same receiver."""
    provider = TracerProvider(resource=Resource({"service.name": service}), shutdown_on_exit=False)
    exporter = OTLPSpanExporter(endpoint=receiver.http_endpoint)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, provider.get_tracer(service)


def relay_spans(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    return [s for s in receiver.spans() if s.service == "outbox-relay"]


def migrated(tmp_path: Path, rabbit: RabbitNode, **variables: str) -> tuple[str, dict[str, str]]:
    """A migrated SQLite outbox, and the environment of a traced `relay run` on it."""
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    env = relay_env(
        RELAY_DATABASE_URL=url,
        RELAY_AMQP_URL=rabbit.url,
        RELAY_METRICS_PORT="0",
        RELAY_POLL_INTERVAL="0.05",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_BSP_SCHEDULE_DELAY="100",
        **variables,
    )
    assert relay("migrate", env=env).returncode == 0
    return url, env


def declare(url: str, exchange: str, full: str, plain: str) -> None:
    """``full`` holds one message and nacks the next (reject-publish) until consumed."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_declare(
            full, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        channel.queue_bind(full, exchange, "order.*")
        channel.queue_declare(plain, durable=True)
        channel.queue_bind(plain, exchange, "other.*")
        channel.confirm_delivery()
        channel.basic_publish(exchange, "order.filler", b"filler")


def get(url: str, queue: str) -> tuple[bytes, dict[str, Any]]:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        method, props, body = conn.channel().basic_get(queue, auto_ack=True)
        assert method is not None, f"no message in {queue}"
        return body, {
            k: v.decode() if isinstance(v, bytes) else v for k, v in (props.headers or {}).items()
        }


def test_one_trace_runs_from_the_writer_through_each_publish_attempt_to_the_consumer(
    tmp_path: Path, rabbit: RabbitNode, receiver: OtlpReceiver
) -> None:
    exchange, full = names("trace")
    plain = full + ".plain"
    declare(rabbit.url, exchange, full, plain)
    url, env = migrated(
        tmp_path,
        rabbit,
        RELAY_BACKOFF_INITIAL="0.3",
        RELAY_BACKOFF_MAX="0.3",
        RELAY_LOG_FORMAT="json",
        RELAY_LOG_LEVEL="debug",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.http_endpoint,
    )

    # The writer: its transaction's span, whose context goes into the row's headers.
    writer_provider, writer = app_tracer(receiver, "orders-service")
    with writer.start_as_current_span("place order") as span:
        context: dict[str, str] = {}
        PROPAGATOR.inject(context)
        written = span.get_span_context()
        lines = [
            # nacked by the full queue first, acked once the filler is consumed
            {
                "exchange": exchange,
                "routing_key": "order.created",
                "payload": {"n": 1},
                "headers": {"x": 1},
            },
            # can never be published (a header beyond AMQP's integers): parked at once
            {
                "exchange": exchange,
                "routing_key": "other.x",
                "payload": {"n": 2},
                "headers": {"big": 2**70},
            },
            # its own, malformed, context: published in a new trace, never parked for it
            {
                "exchange": exchange,
                "routing_key": "other.y",
                "payload": {"n": 3},
                "headers": {"traceparent": "00-nonsense-01"},
            },
        ]
        result = relay(
            "enqueue",
            "--file",
            "-",
            "--traceparent",
            context["traceparent"],
            "--tracestate",
            "shop=1",
            env=env,
            input="".join(json.dumps(x) + "\n" for x in lines),
        )
        assert result.returncode == 0, result.stderr
    trace_id = f"{written.trace_id:032x}"

    log_path = tmp_path / "relay.log"
    with RelayProcess(env, log_path) as proc:
        wait_until(
            lambda: any(s.attributes.get("error.type") == "nacked" for s in relay_spans(receiver)),
            60,
            "the relay's span of the nacked attempt",
        )
        assert get(rabbit.url, full)[0] == b"filler"  # room for the retry
        wait_until(
            lambda: set(statuses(url)) == {"sent", "parked"},
            60,
            "the retry acked",
        )
        assert proc.stop() == 0  # flushes the spans still buffered

    # The consumer continues the trace from the message's headers.
    body, headers = get(rabbit.url, full)
    assert json.loads(body) == {"n": 1} and headers["tracestate"] == "shop=1" and headers["x"] == 1
    consumer_provider, consumer = app_tracer(receiver, "shipping-service")
    with consumer.start_as_current_span(
        f"process {exchange}", context=PROPAGATOR.extract(headers), kind=SpanKind.CONSUMER
    ):
        pass
    for provider in (writer_provider, consumer_provider):
        provider.shutdown()

    spans = receiver.spans()
    [place] = [s for s in spans if s.name == "place order"]
    [processed] = [s for s in spans if s.service == "shipping-service"]
    attempts = [s for s in relay_spans(receiver) if s.attributes["outbox.row_id"] == 1]
    assert [s.attributes["outbox.outcome"] for s in attempts] == ["nacked", "acked"]
    nacked, acked = attempts
    for s in attempts:
        assert (s.name, s.kind, s.trace_id, s.parent_span_id) == (
            f"send {exchange}",
            PRODUCER,
            trace_id,
            place.span_id,
        )
        assert s.attributes["messaging.system"] == "rabbitmq"
        assert s.attributes["messaging.rabbitmq.destination.routing_key"] == "order.created"
    assert nacked.status_code == ERROR and acked.status_code != ERROR
    assert acked.links == (nacked.span_id,)
    assert trace_ids(headers["traceparent"]) == (trace_id, acked.span_id)
    assert (processed.trace_id, processed.parent_span_id, processed.kind) == (
        trace_id,
        acked.span_id,
        CONSUMER,
    )

    [parked] = [s for s in relay_spans(receiver) if s.attributes["outbox.row_id"] == 2]
    assert (parked.trace_id, parked.parent_span_id) == (trace_id, place.span_id)
    assert parked.status_code == ERROR and parked.attributes["error.type"] == "parked"
    assert parked.events == ("rejected", "parked")

    [fresh] = [s for s in relay_spans(receiver) if s.attributes["outbox.row_id"] == 3]
    assert fresh.parent_span_id == "" and fresh.trace_id != trace_id
    assert fresh.attributes["outbox.outcome"] == "acked"
    _, third = get(rabbit.url, plain)
    assert trace_ids(third["traceparent"]) == (fresh.trace_id, fresh.span_id)

    logged = [
        json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")
    ]
    [parked_line] = [x for x in logged if x["action"] == "row_parked"]
    assert (parked_line["trace_id"], parked_line["span_id"]) == (trace_id, parked.span_id)
    assert [x["row_id"] for x in logged if x["action"] == "traceparent_ignored"] == [3]
    assert 3 in sent_ids(url)


def test_spans_go_out_over_grpc_too(
    tmp_path: Path, rabbit: RabbitNode, receiver: OtlpReceiver
) -> None:
    exchange, queue = names("trace-grpc")
    declare(rabbit.url, exchange, queue, queue + ".plain")
    url, env = migrated(
        tmp_path,
        rabbit,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.grpc_endpoint,
        OTEL_SERVICE_NAME="orders-relay",
    )
    line = {"exchange": exchange, "routing_key": "other.z", "payload": "hi"}
    assert relay("enqueue", "--file", "-", env=env, input=json.dumps(line) + "\n").returncode == 0
    with RelayProcess(env, tmp_path / "relay.log") as proc:
        wait_until(lambda: set(statuses(url)) == {"sent"}, 60, "the row sent")
        assert proc.stop() == 0
    [span] = [s for s in receiver.spans() if s.service == "orders-relay"]
    assert span.attributes["outbox.outcome"] == "acked" and span.parent_span_id == ""
