"""relay.tracing: the writer's trace context read from a row's headers. Pure, no OpenTelemetry."""

from __future__ import annotations

import json
import logging

import pytest

from relay.tracing import NoTracing, given_context, trace_ids, with_context, writer_context
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


# A writer's headers and the context it passes -> the headers the relay then reads.
SPLICED = {
    "no headers": (None, {"traceparent": PARENT}),
    "empty object": ("{ }", {"traceparent": PARENT}),
    "other headers keep their spelling": (
        '{"price": 19.990, "n": 1}',
        {"traceparent": PARENT, "price": 19.990, "n": 1},
    ),
    "the row's own context wins": (
        '{"traceparent": "mine"}',
        {"traceparent": "mine"},
    ),
}


@pytest.mark.parametrize(("headers", "read"), SPLICED.values(), ids=SPLICED.keys())
def test_a_writers_context_is_added_to_its_headers(
    headers: str | None, read: dict[str, object]
) -> None:
    spliced = with_context(headers, {"traceparent": PARENT})
    assert spliced is not None and json.loads(spliced) == read
    if headers and "19.990" in headers:
        assert "19.990" in spliced
    assert with_context(headers, {}) == headers


GIVEN = {
    "nothing": (None, None, {}),
    "traceparent": (PARENT, None, {"traceparent": PARENT}),
    "with tracestate": (PARENT, "k=v", {"traceparent": PARENT, "tracestate": "k=v"}),
    "empty tracestate": (PARENT, "", {"traceparent": PARENT}),
}


@pytest.mark.parametrize(("parent", "state", "context"), GIVEN.values(), ids=GIVEN.keys())
def test_a_context_given_by_a_writer(
    parent: str | None, state: str | None, context: dict[str, str]
) -> None:
    assert given_context(parent, state) == context


@pytest.mark.parametrize(
    ("parent", "state", "reason"),
    [
        ("00-abc-01", None, "is not a W3C traceparent"),
        (PARENT.upper(), None, "is not a W3C traceparent"),
        (None, "k=v", "a tracestate needs a traceparent"),
    ],
)
def test_a_bad_context_given_by_a_writer_says_why(
    parent: str | None, state: str | None, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        given_context(parent, state)
