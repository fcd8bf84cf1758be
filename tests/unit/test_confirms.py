"""The confirm tracker, table-driven: broker events in, row outcomes out. No server."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from relay.broker.confirms import ConfirmTracker
from relay.records import OutboxRow, Outcome
from tests.support.rows import row

A, N, R, T, F, L = (
    Outcome.ACKED,
    Outcome.NACKED,
    Outcome.RETURNED,
    Outcome.TIMED_OUT,
    Outcome.FAILED,
    Outcome.LOST,
)

# Each case: rows 1..n are published in order at t=0 (tags 1..n), then the events run.
# Events: ("ack"|"nack", tag, multiple[, now: 0.25]), ("return", row id), ("expire", now),
# ("lost", culprit exchange or None). Expected: {row id: outcome} and how many stay in flight.
# The confirm timeout is 30 s.
CASES: dict[str, tuple[int, list[tuple[Any, ...]], dict[int, Outcome], int]] = {
    "single ack": (3, [("ack", 2, False)], {2: A}, 2),
    "multiple ack settles every tag up to it": (4, [("ack", 3, True)], {1: A, 2: A, 3: A}, 1),
    "multiple nack settles every tag up to it": (3, [("nack", 2, True)], {1: N, 2: N}, 1),
    "single nack": (2, [("nack", 1, False)], {1: N}, 1),
    "return then ack is returned, not acked": (
        2,
        [("return", 1), ("ack", 2, True)],
        {1: R, 2: A},
        0,
    ),
    "out-of-order single acks": (3, [("ack", 3, False), ("ack", 1, False)], {3: A, 1: A}, 1),
    "multiple ack after single acks settles the rest": (
        4,
        [("ack", 2, False), ("ack", 4, True)],
        {1: A, 2: A, 3: A, 4: A},
        0,
    ),
    "ack of unknown tag is ignored": (2, [("ack", 9, False)], {}, 2),
    "late ack after timeout is ignored": (1, [("expire", 31.0), ("ack", 1, False)], {1: T}, 0),
    "timeout only takes tags older than the limit": (2, [("expire", 29.0)], {}, 2),
    "timeout takes every overdue tag": (
        3,
        [("ack", 2, False), ("expire", 30.25)],
        {1: T, 2: A, 3: T},
        0,
    ),
    "an answer restarts the wait of the tags before it": (
        3,
        [("ack", 1, False, 20.0), ("expire", 49.0)],
        {1: A},
        2,
    ),
    "no answer for the timeout after the last one": (
        3,
        [("ack", 1, False, 20.0), ("expire", 50.0)],
        {1: A, 2: T, 3: T},
        0,
    ),
    "a nack is an answer too": (
        2,
        [("nack", 1, False, 20.0), ("expire", 49.0)],
        {1: N},
        1,
    ),
    "a slow window confirming one by one never times out": (
        4,
        [
            ("ack", 1, False, 25.0),
            ("ack", 2, False, 50.0),
            ("expire", 54.0),
            ("ack", 3, False, 55.0),
            ("expire", 59.0),
        ],
        {1: A, 2: A, 3: A},
        1,
    ),
    "a tag left unanswered while others are confirmed waits twice the timeout": (
        3,
        [("ack", 2, False, 25.0), ("ack", 3, False, 50.0), ("expire", 59.0), ("expire", 60.0)],
        {1: T, 2: A, 3: A},
        0,
    ),
    "channel lost: outstanding rows are lost": (
        3,
        [("ack", 1, False), ("lost", None)],
        {1: A, 2: L, 3: L},
        0,
    ),
    "channel closed because of one exchange": (3, [("lost", "bad")], {1: F, 2: L, 3: F}, 0),
    "return for an unknown message id is ignored": (
        1,
        [("return", 99), ("ack", 1, False)],
        {1: A},
        0,
    ),
}


def sent_to(exchange: str, row: OutboxRow) -> bool:
    return row.exchange == exchange


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_tracker(case: str) -> None:
    count, events, expected, in_flight = CASES[case]
    tracker = ConfirmTracker(confirm_timeout=30.0)
    rows = {i: row(i, exchange="bad" if i in (1, 3) else "ex") for i in range(1, count + 1)}
    assert [tracker.published(rows[i], now=0.0) for i in rows] == list(rows)
    for event in events:
        kind = event[0]
        if kind == "ack":
            tracker.on_ack(event[1], event[2], now=event[3] if len(event) > 3 else 0.25)
        elif kind == "nack":
            tracker.on_nack(event[1], event[2], now=event[3] if len(event) > 3 else 0.25)
        elif kind == "return":
            tracker.on_return(f"m-{event[1]}", "312 NO_ROUTE")
        elif kind == "expire":
            tracker.expire(event[1])
        elif kind == "lost":
            culprit = event[1]
            tracker.channel_lost(
                "connection reset",
                functools.partial(sent_to, culprit) if culprit else None,
                "404 NOT_FOUND",
            )
    settled = tracker.take_settled()
    assert {s.row.id: s.outcome for s in settled} == expected
    assert len(settled) == len(expected), "a row was settled twice"
    assert tracker.in_flight == in_flight
    assert tracker.take_settled() == []


def test_ack_reports_latency_and_return_reason() -> None:
    tracker = ConfirmTracker(confirm_timeout=30.0)
    tracker.published(row(1), now=10.0)
    tracker.published(row(2), now=10.0)
    tracker.on_return("m-2", "312 NO_ROUTE")
    tracker.on_ack(2, True, now=10.5)
    acked, returned = tracker.take_settled()
    assert acked.latency == pytest.approx(0.5)
    assert returned.outcome is Outcome.RETURNED and returned.detail == "312 NO_ROUTE"


def test_sequence_numbers_restart_at_one_on_a_new_channel() -> None:
    tracker = ConfirmTracker(confirm_timeout=30.0)
    tracker.published(row(1), now=0.0)
    tracker.published(row(2), now=0.0)
    tracker.channel_lost("gone")
    assert tracker.published(row(3), now=0.0) == 1
    tracker.on_ack(1, False, now=0.1)
    assert [(s.row.id, s.outcome) for s in tracker.take_settled()] == [(1, L), (2, L), (3, A)]


def test_restart_clocks_gives_a_full_timeout_after_unblock() -> None:
    tracker = ConfirmTracker(confirm_timeout=30.0)
    tracker.published(row(1), now=0.0)
    tracker.restart_clocks(now=100.0)
    assert tracker.expire(now=129.0) == 0
    assert tracker.expire(now=130.0) == 1


def test_reject_and_lose_settle_rows_that_never_got_a_tag() -> None:
    tracker = ConfirmTracker(confirm_timeout=30.0)
    tracker.reject(row(1), "headers are not valid JSON")
    tracker.lose([row(2)], "no channel")
    assert tracker.in_flight == 0
    assert [s.outcome for s in tracker.take_settled()] == [Outcome.REJECTED, Outcome.LOST]
