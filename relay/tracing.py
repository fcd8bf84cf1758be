"""Trace context through the outbox: what the loop and the publisher see of tracing. Pure.

A writer records the W3C trace context of its transaction in the row's headers, under the
keys ``traceparent`` and ``tracestate`` (the names W3C Trace Context gives them, and the
header names OpenTelemetry's RabbitMQ instrumentations read). The headers are the place for
it because every writer can already fill them (SQL, ``relay enqueue``, the Spark writer) and
they reach the consumer unchanged; a column would need a migration and a copy step.

Tracing is off unless an exporter is configured (``OTEL_TRACES_EXPORTER``). Then ``NoTracing``
below is all the relay runs: a row's headers, the writer's ``traceparent`` among them, are
published as they are, so a consumer still continues the writer's trace. When it is on,
``relay.otel`` (the only module that imports OpenTelemetry) starts a producer span per
publish and replaces the row's ``traceparent`` with the span's own.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from relay.records import OutboxRow, SettleBatch, Settlement

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C Trace Context, version 00 (later versions may append fields after a dash). An all-zero
# trace id or span id is invalid.
_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace_id>[0-9a-f]{32})-(?P<span_id>[0-9a-f]{16})"
    r"-[0-9a-f]{2}(?P<rest>-.*)?"
)
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def writer_context(row: OutboxRow) -> dict[str, str]:
    """The trace context the writer stored in ``row``'s headers: ``traceparent`` (and
    ``tracestate``) as text, or nothing. Headers that are not a JSON object are the
    publisher's to refuse, not this function's; a traceparent that is not text is ignored."""
    if row.headers is None or TRACEPARENT not in row.headers:
        return {}  # the common case, without parsing the JSON
    try:
        headers = json.loads(row.headers)
    except ValueError:
        return {}
    if not isinstance(headers, dict):
        return {}
    carrier = {k: headers[k] for k in (TRACEPARENT, TRACESTATE) if isinstance(headers.get(k), str)}
    if TRACEPARENT not in carrier:
        log.debug(
            "row %d: traceparent header is not text; ignored",
            row.id,
            extra={"action": "traceparent_ignored", "row_id": row.id},
        )
        return {}
    return carrier


def given_context(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    """The trace context a writer passes (``relay enqueue``, the Spark writer's options), as
    the headers it becomes; ValueError says what is wrong with it."""
    if traceparent is None:
        if tracestate is not None:
            raise ValueError("a tracestate needs a traceparent")
        return {}
    if trace_ids(traceparent) is None:
        raise ValueError(
            f"{traceparent[:80]!r} is not a W3C traceparent "
            "(00-<32 hex digits>-<16 hex digits>-<2 hex digits>, lower case)"
        )
    return {TRACEPARENT: traceparent, **({TRACESTATE: tracestate} if tracestate else {})}


def with_context(headers: str | None, context: Mapping[str, str]) -> str | None:
    """A writer's ``headers`` (JSON object text, already checked, or None) with its trace
    ``context`` added. The text is spliced, not re-encoded, so that every other header keeps
    its exact spelling (a decimal's digits); a key the headers already have wins, being the
    later one in the text (JSON readers keep the last of duplicate keys)."""
    if not context:
        return headers
    added = json.dumps(dict(context), separators=(",", ":"))[1:-1]
    inner = (headers or "{}").strip()[1:-1].strip()
    return "{" + added + ("," + inner if inner else "") + "}"


def trace_ids(traceparent: str) -> tuple[str, str] | None:
    """(trace id, span id) of a valid W3C ``traceparent``, as hex, or None."""
    match = _TRACEPARENT.fullmatch(traceparent)
    if (
        match is None
        or match["version"] == "ff"
        or (match["version"] == "00" and match["rest"] is not None)
        or match["trace_id"] == _ZERO_TRACE
        or match["span_id"] == _ZERO_SPAN
    ):
        return None
    return match["trace_id"], match["span_id"]


def writer_log_fields(row: OutboxRow) -> dict[str, str]:
    """``trace_id`` and ``span_id`` of the writer's context in ``row``, when it has a valid one."""
    ids = trace_ids(writer_context(row).get(TRACEPARENT, ""))
    return {} if ids is None else {"trace_id": ids[0], "span_id": ids[1]}


class Tracing(Protocol):
    """What the publisher and the loop ask of tracing."""

    def start(self, row: OutboxRow, server: tuple[str, int]) -> Mapping[str, str] | None:
        """A publish of ``row`` to node ``server`` begins: the headers to set on its message
        in place of the row's (``traceparent``, ``tracestate``), or None to leave them."""

    def finish(self, settlements: Sequence[Settlement], batch: SettleBatch) -> None:
        """The outcome of each settled publish, and what the settle policy made of it."""

    def log_fields(self, row: OutboxRow) -> dict[str, str]:
        """``trace_id`` and ``span_id`` for a log line about ``row``, when it has them."""

    def shutdown(self) -> None:
        """Export what is still buffered."""


class NoTracing:
    """Tracing off: no spans; the writer's context travels in the headers untouched."""

    def start(self, row: OutboxRow, server: tuple[str, int]) -> Mapping[str, str] | None:
        return None

    def finish(self, settlements: Sequence[Settlement], batch: SettleBatch) -> None:
        pass

    def log_fields(self, row: OutboxRow) -> dict[str, str]:
        return writer_log_fields(row)

    def shutdown(self) -> None:
        pass
