"""What an inbox consumer decides without I/O (``relay.inbox.policy``), table-driven."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from relay.inbox import Inbox, InboxSettings, Settings
from relay.inbox.policy import after_failure, key_problem, too_many_before, window_problem
from relay.records import Delivery, Verdict


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


# (failures counted, max) -> the verdict when the last of them was a handler's; whether a
# delivery that comes with them counted is dead-lettered without a run
ATTEMPTS = {
    "the first of three fails: again": ((1, 3), (Verdict.RETRY, False)),
    "the second of three fails: again": ((2, 3), (Verdict.RETRY, False)),
    "the third of three fails: dead letter, and no fourth run": (
        (3, 3),
        (Verdict.DEAD_LETTER, True),
    ),
    "one allowed: its failure is the end": ((1, 1), (Verdict.DEAD_LETTER, True)),
    "none counted: runs": ((0, 1), (Verdict.RETRY, False)),
}


@pytest.mark.parametrize(("given", "expected"), ATTEMPTS.values(), ids=list(ATTEMPTS))
def test_a_failed_attempt_is_retried_until_the_last_allowed(
    given: tuple[int, int], expected: tuple[Verdict, bool]
) -> None:
    attempts, allowed = given
    assert (after_failure(attempts, allowed), too_many_before(attempts, allowed)) == expected


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
