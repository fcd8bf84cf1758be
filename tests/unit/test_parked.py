"""The parked-row log: a line per row, one line per reason for rows parked by the hundred."""

from __future__ import annotations

import logging

import pytest

from relay.parked import IDS_PER_LINE, ParkedLog
from relay.records import PARKED, RowChange


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def parked(first: int, count: int, reason: str = "failed: 404") -> list[RowChange]:
    return [RowChange(i, PARKED, 3, 0.0, reason) for i in range(first, first + count)]


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    out = [(r.action, r.getMessage()) for r in caplog.records]  # type: ignore[attr-defined]
    caplog.clear()
    return out


def test_rows_parked_now_and_then_each_get_a_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    clock = Clock()
    log = ParkedLog(10.0, clock)
    log.parked(parked(1, 1), {1: {"trace_id": "t"}})
    assert lines(caplog) == [("row_parked", "row 1 parked after 3 attempts: failed: 404")]
    log.parked(parked(2, 1, "nacked"), {2: {}})  # another reason: its own line at once
    clock.now = 10.0
    log.flush()
    log.parked(parked(3, 1), {3: {}})  # an interval later, nothing waiting: a line of its own
    assert [action for action, _ in lines(caplog)] == ["row_parked", "row_parked"]


def test_a_thousand_rows_parked_for_one_reason_take_two_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    clock = Clock()
    log = ParkedLog(10.0, clock)
    for start in range(1, 1001, 100):
        clock.now += 0.5
        log.parked(parked(start, 100), {i: {} for i in range(start, start + 100)})
    clock.now += 5.5
    log.flush()  # the stats task's turn: 10 s since the first line (at 0.5)
    ids = ", ".join(str(i) for i in range(2, 2 + IDS_PER_LINE))
    assert lines(caplog) == [
        ("row_parked", "row 1 parked after 3 attempts: failed: 404"),
        ("rows_parked", f"999 more rows parked after their attempts: failed: 404 (ids {ids}, ...)"),
    ]
    clock.now += 10.0
    log.flush()
    assert lines(caplog) == [], "a line without rows"


def test_a_stop_logs_what_waits(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    log = ParkedLog(10.0, Clock())
    log.parked(parked(1, 3), {i: {} for i in range(1, 4)})
    log.flush()
    assert len(lines(caplog)) == 1, "logged before its interval"
    log.flush(every=True)
    assert lines(caplog) == [
        ("rows_parked", "2 more rows parked after their attempts: failed: 404 (ids 2, 3)")
    ]
