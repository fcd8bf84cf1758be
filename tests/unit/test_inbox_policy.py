"""What an inbox consumer decides without I/O (``relay.inbox.policy``), table-driven."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from relay.constants import LAST_ERROR_MAX_CHARS
from relay.db.inbox_transaction import TransactionEnded
from relay.errors import StoreError
from relay.inbox import Inbox, InboxSettings, Settings
from relay.inbox.policy import (
    COMMITTED_IN_PART,
    ENDED_KEY_COMMITTED,
    NOT_UNDONE,
    WENT_ON,
    RetrySchedule,
    dead_letter_headers,
    dead_letter_queue,
    describe,
    kept_key,
    key_problem,
    too_many_before,
    window_problem,
)
from relay.records import DEAD_HEADERS, Answer, Delivery, Verdict


def delivery(message_id: str | bytes | None = None, **headers: Any) -> Delivery:
    return Delivery(message_id, b"{}", "x", "k", "application/json", headers, False)


# (message id, headers) -> (the key, a part of the problem or "")
KEYS = {
    "the message id": (("m-1", {}), ("m-1", "")),
    "the message id before ce-id": (("m-1", {"ce-id": "e-1"}), ("m-1", "")),
    "ce-id when there is no message id": ((None, {"ce-id": "e-1"}), ("e-1", "")),
    "ce-id when the message id is empty": (("", {"ce-id": "e-1"}), ("e-1", "")),
    "neither: dead-lettered": ((None, {}), (None, "neither a message_id nor a ce-id")),
    "a ce-id that is not text: none": ((None, {"ce-id": 7}), (None, "ce-id is not text but int")),
    "a message id that is not UTF-8": ((b"\xffA", {}), (None, "not UTF-8 text (byte 0xff at 0)")),
    "a ce-id that is not UTF-8": ((None, {"ce-id": b"e\xfe"}), (None, "(byte 0xfe at 1)")),
    "a message id in UTF-8 bytes: its text": ((b"m-\xc3\xa9", {}), ("m-é", "")),
    "a message id with a NUL": (("m\x00-1", {}), ("m\x00-1", "holds a NUL character (at 1)")),
    "an empty ce-id: none": ((None, {"ce-id": ""}), (None, "neither")),
    "a message id of 256 bytes: too long": (("m" * 256, {}), ("m" * 256, "message_id is 256")),
    "a ce-id of 256 bytes: too long": ((None, {"ce-id": "é" * 128}), ("é" * 128, "256 bytes")),
    "a ce-id of 255 bytes: kept": ((None, {"ce-id": "e" * 255}), ("e" * 255, "")),
}


@pytest.mark.parametrize(("given", "expected"), KEYS.values(), ids=list(KEYS))
def test_a_delivery_is_keyed_by_its_message_id_or_ce_id(
    given: tuple[str | bytes | None, dict[str, Any]], expected: tuple[str | None, str]
) -> None:
    message_id, headers = given
    key, problem = expected
    d = delivery(message_id, **headers)
    assert d.key == key
    found = key_problem(d)
    if problem:
        assert problem in (found or "")
    else:
        assert found is None


# (failures counted, max) -> whether a delivery that comes with them counted is
# dead-lettered without a run
BEFORE = {
    "two of three: runs": ((2, 3), False),
    "three of three: dead letter, no fourth run": ((3, 3), True),
    "one allowed, one counted: no second run": ((1, 1), True),
    "none counted: runs": ((0, 1), False),
}


@pytest.mark.parametrize(("given", "expected"), BEFORE.values(), ids=list(BEFORE))
def test_a_delivery_with_its_allowance_used_up_is_not_run(
    given: tuple[int, int], expected: bool
) -> None:
    assert too_many_before(*given) is expected


RETRY, DEAD = Answer(Verdict.RETRY), Answer(Verdict.DEAD_LETTER)
# (max attempts, immediate, first delay, longest) -> the answer to each failure, 1st onwards
SCHEDULES = {
    "one at once, then 5 s doubling": (
        (6, 1, 5.0, 300.0),
        [
            RETRY,
            Answer(Verdict.DELAY, 5.0),
            Answer(Verdict.DELAY, 10.0),
            Answer(Verdict.DELAY, 20.0),
            Answer(Verdict.DELAY, 40.0),
            DEAD,
        ],
    ),
    "capped at the longest": (
        (5, 0, 1.0, 3.0),
        [
            Answer(Verdict.DELAY, 1.0),
            Answer(Verdict.DELAY, 2.0),
            Answer(Verdict.DELAY, 3.0),
            Answer(Verdict.DELAY, 3.0),
            DEAD,
        ],
    ),
    "all at once": ((3, 5, 1.0, 1.0), [RETRY, RETRY, DEAD]),
    "one allowed: its failure is the end": ((1, 1, 1.0, 1.0), [DEAD]),
    "milliseconds, as a queue's TTL": ((2, 0, 0.0005, 1.0), [Answer(Verdict.DELAY, 0.001), DEAD]),
}


@pytest.mark.parametrize(("given", "expected"), SCHEDULES.values(), ids=list(SCHEDULES))
def test_a_failed_message_is_retried_at_once_then_later_then_dead_lettered(
    given: tuple[int, int, float, float], expected: list[Answer]
) -> None:
    schedule = RetrySchedule(*given)
    assert [schedule.after(n) for n in range(1, len(expected) + 1)] == expected
    assert schedule.delays() == sorted({a.delay for a in expected} - {0.0})


def test_a_huge_number_of_attempts_stays_at_the_longest_delay() -> None:
    assert RetrySchedule(10**6, 0, 1.0, 60.0).after(10**5) == Answer(Verdict.DELAY, 60.0)


DAY = 86400.0
# (window, the relay's retention) -> a part of the warning, or ""
WINDOWS = {
    "twice the retention: fine": ((14 * DAY, 7 * DAY), ""),
    "forever: fine": ((0.0, 7 * DAY), ""),
    "forever on both: fine": ((0.0, 0.0), ""),
    "equal to the retention: warned": ((7 * DAY, 7 * DAY), "not longer than"),
    "shorter: warned": ((DAY, 7 * DAY), "not longer than"),
    "the relay keeps forever: warned": ((14 * DAY, 0.0), "forever"),
}


@pytest.mark.parametrize(("given", "expected"), WINDOWS.values(), ids=list(WINDOWS))
def test_a_dedupe_window_shorter_than_the_relays_memory_is_warned_of(
    given: tuple[float, float], expected: str
) -> None:
    problem = window_problem(*given)
    if expected:
        assert expected in (problem or "")
    else:
        assert problem is None


def test_a_consumer_whose_window_is_too_short_says_so_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings.load({}, {"database_url": f"sqlite:///{tmp_path / 'x.db'}"})
    short = InboxSettings.load({}, {"inbox_queue": "q", "inbox_dedupe_window": "3600"})
    stopped = threading.Event()
    stopped.set()  # run returns before it connects anywhere
    with caplog.at_level("WARNING"):
        Inbox(settings, short).run(lambda _d, _tx: None, stopped)
    warned = [r for r in caplog.records if getattr(r, "action", "") == "inbox_window_short"]
    assert len(warned) == 1
    assert "RELAY_RETENTION=604800" in warned[0].getMessage()


T0 = datetime(2026, 11, 26, 10, 0, 0, 123456, tzinfo=UTC)
# (error, attempts, first, last) -> the headers beyond the consumer and queue
WHY = {
    "a handler's failures": (
        ("ValueError: no", 5, T0, T0 + timedelta(seconds=75)),
        {
            "x-inbox-error": "ValueError: no",
            "x-inbox-attempts": 5,
            "x-inbox-first-failure": "2026-11-26T10:00:00.123+00:00",
            "x-inbox-last-failure": "2026-11-26T10:01:15.123+00:00",
        },
    ),
    "no key: no attempts, no times": (
        ("the message has neither", 0, None, None),
        {"x-inbox-error": "the message has neither", "x-inbox-attempts": 0},
    ),
    "a time in another zone: in UTC": (
        ("E", 1, T0.astimezone(timezone(timedelta(hours=2))), None),
        {
            "x-inbox-error": "E",
            "x-inbox-attempts": 1,
            "x-inbox-first-failure": "2026-11-26T10:00:00.123+00:00",
        },
    ),
    "a long error: cut": (
        ("x" * 5000, 2, None, None),
        {"x-inbox-error": "x" * 2000, "x-inbox-attempts": 2},
    ),
}


@pytest.mark.parametrize(("given", "expected"), WHY.values(), ids=list(WHY))
def test_a_dead_letter_says_why_in_its_headers(
    given: tuple[str, int, datetime | None, datetime | None], expected: dict[str, object]
) -> None:
    error, attempts, first, last = given
    headers = dead_letter_headers(
        "billing", "orders", error, attempts, first_failure=first, last_failure=last
    )
    assert headers == {"x-inbox-consumer": "billing", "x-inbox-queue": "orders", **expected}
    assert set(headers) <= set(DEAD_HEADERS)
    assert dead_letter_queue("orders") == "orders.dead-letters"


def _raised(make: Any) -> BaseException:
    """The exception ``make()`` raises, with its traceback (raised here, in a test's frame)."""
    try:
        make()
    except BaseException as exc:
        return exc
    raise AssertionError("it did not raise")


class DriverError(Exception):
    """A driver's error whose message quotes a value, as a database's does."""


class Wrapped(Exception):
    """SQLAlchemy's wrapper of a driver's error (``orig``), its message listing parameters."""

    def __init__(self, orig: BaseException) -> None:
        super().__init__(f"({type(orig).__name__}) {orig} [parameters: {{'pan': '4111'}}]")
        self.orig = orig


def _facts(error: BaseException) -> list[str] | None:
    return (
        ["SQLSTATE 23505", "constraint cards_pan_key"] if isinstance(error, DriverError) else None
    )


def _value_error() -> None:
    int("4111")
    raise ValueError("not a card: 4111")


def _wrapped() -> None:
    raise Wrapped(DriverError("Key (pan)=(4111) already exists"))


def _handlers_own() -> None:
    try:
        _wrapped()
    except Wrapped as exc:
        raise RuntimeError("charging card 4111 failed") from exc


# name -> (what raises, keep messages, what is recorded: parts that must be there)
DESCRIBED: dict[str, tuple[Any, bool, list[str]]] = {
    "an exception: its type and where the handler raised it": (
        _value_error,
        False,
        ["ValueError at tests.unit.test_inbox_policy:", "in _value_error"],
    ),
    "with messages kept: the message too": (
        _value_error,
        True,
        ["ValueError: not a card: 4111 at tests.unit.test_inbox_policy:"],
    ),
    "a database error: its facts, never its message or parameters": (
        _wrapped,
        True,
        ["Wrapped: DriverError (SQLSTATE 23505, constraint cards_pan_key) at"],
    ),
    "a handler's error from a database's: both named": (
        _handlers_own,
        False,
        ["RuntimeError at", "in _handlers_own from Wrapped: DriverError (SQLSTATE 23505"],
    ),
    "this package's own error: its words": (
        lambda: (_ for _ in ()).throw(TransactionEnded("a handler may not end it (COMMIT)")),
        False,
        ["TransactionEnded: a handler may not end it (COMMIT)"],
    ),
    "a database error of this package's: what failed, not the driver's words": (
        lambda: (_ for _ in ()).throw(
            StoreError("the commit on db failed: Key (pan)=(4111)", summary="the commit on db")
        ),
        False,
        ["StoreError: the commit on db"],
    ),
}


@pytest.mark.parametrize(("make", "messages", "parts"), DESCRIBED.values(), ids=list(DESCRIBED))
def test_a_failure_is_recorded_without_a_value(make: Any, messages: bool, parts: list[str]) -> None:
    recorded = describe(_raised(make), _facts, messages=messages)
    for part in parts:
        assert part in recorded
    if not messages:
        assert "4111" not in recorded
    assert "parameters" not in recorded


def test_a_drivers_error_without_facts_keeps_no_words() -> None:
    """A database driver's error that says nothing of its own (no SQLSTATE: a client-side
    error), raised by the handler straight from the driver: its name, never its message."""
    recorded = describe(DriverError("4111"), lambda _e: [], messages=True)
    assert recorded == "DriverError"


def test_a_recorded_failure_is_bounded() -> None:
    recorded = describe(ValueError("x" * 10_000), _facts, messages=True)
    assert len(recorded) == LAST_ERROR_MAX_CHARS


# A failure recorded for a message -> whether it says it was dead-lettered with its key kept.
KEPT = {
    "committed a part, then failed": (
        f"TransactionEnded: {COMMITTED_IN_PART}; it failed with ValueError",
        True,
    ),
    "ran on after its rollback": (f"TransactionEnded: {WENT_ON}; it failed with ...", True),
    "a write the rollback kept": (f"TransactionEnded: {NOT_UNDONE}; it failed with ...", True),
    "the key committed under it": (f"TransactionEnded: {ENDED_KEY_COMMITTED}; ...", True),
    "a retried end of the transaction": ("TransactionEnded: the handler ended ...", False),
    "a handler's error": ("ValueError at app:12 in handle", False),
    "none": (None, False),
}


@pytest.mark.parametrize(("given", "expected"), KEPT.values(), ids=list(KEPT))
def test_a_failure_says_whether_its_key_was_kept(given: str | None, expected: bool) -> None:
    assert kept_key(given) is expected
