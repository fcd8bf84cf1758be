"""relay.tracing: the writer's trace context read from a row's headers. Pure, no OpenTelemetry."""

from __future__ import annotations

import json
import logging

import pytest

from relay.tracing import NoTracing, trace_ids, writer_context
from tests.support.rows import row

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{SPAN}-01"

# Stored headers -> the context the relay reads from them.
CONTEXTS = {
    "no headers": (None, {}),
    "headers without a context": ('{"a": 1}', {}),
    "traceparent": (json.dumps({"traceparent": PARENT}), {"traceparent": PARENT}),
    "and tracestate": (
        json.dumps({"traceparent": PARENT, "tracestate": "k=v", "a": [1]}),
        {"traceparent": PARENT, "tracestate": "k=v"},
    ),
    "tracestate alone": (json.dumps({"tracestate": "k=v", "x": "traceparent"}), {}),
    "traceparent not text": ('{"traceparent": 5}', {}),
    "headers not an object": ('["traceparent"]', {}),
    "headers not JSON": ('{"traceparent": ', {}),
}


@pytest.mark.parametrize(("stored", "context"), CONTEXTS.values(), ids=CONTEXTS.keys())
def test_the_writers_context_is_read_from_the_rows_headers(
    stored: str | None, context: dict[str, str]
) -> None:
    assert writer_context(row(1, headers=stored)) == context


def test_a_traceparent_that_is_not_text_is_ignored_with_a_debug_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="relay.tracing"):
        assert writer_context(row(7, headers='{"traceparent": 5}')) == {}
    assert [r.action for r in caplog.records] == ["traceparent_ignored"]  # type: ignore[attr-defined]


IDS = {
    "valid": (PARENT, (TRACE, SPAN)),
    "not sampled": (f"00-{TRACE}-{SPAN}-00", (TRACE, SPAN)),
    "a later version may add fields": (f"01-{TRACE}-{SPAN}-01-more", (TRACE, SPAN)),
    "version 00 has four fields": (f"00-{TRACE}-{SPAN}-01-more", None),
    "version ff is invalid": (f"ff-{TRACE}-{SPAN}-01", None),
    "upper case": (PARENT.upper(), None),
    "zero trace id": (f"00-{'0' * 32}-{SPAN}-01", None),
    "zero span id": (f"00-{TRACE}-{'0' * 16}-01", None),
    "short trace id": (f"00-{TRACE[:-1]}-{SPAN}-01", None),
    "padded": (f" {PARENT}", None),
    "empty": ("", None),
}


@pytest.mark.parametrize(("traceparent", "ids"), IDS.values(), ids=IDS.keys())
def test_trace_ids_of_a_traceparent(traceparent: str, ids: tuple[str, str] | None) -> None:
    assert trace_ids(traceparent) == ids


def test_without_tracing_log_lines_carry_the_writers_ids_and_headers_pass_untouched() -> None:
    tracing = NoTracing()
    traced = row(1, headers=json.dumps({"traceparent": PARENT}))
    assert tracing.start(traced, ("127.0.0.1", 5672)) is None
    assert tracing.log_fields(traced) == {"trace_id": TRACE, "span_id": SPAN}
    assert tracing.log_fields(row(2, headers='{"traceparent": "junk"}')) == {}
    assert tracing.log_fields(row(3)) == {}
