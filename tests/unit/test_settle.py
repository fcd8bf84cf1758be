"""Settle policy and back-off schedule: what each outcome does to a row's state."""

from __future__ import annotations

import pytest

from relay.backoff import Backoff
from relay.records import PARKED, PENDING, Outcome, Settlement
from relay.settle import SettlePolicy
from tests.support.rows import row


def test_backoff_grows_exponentially_with_bounded_jitter_and_a_cap() -> None:
    backoff = Backoff(initial=1.0, maximum=60.0)
    for failures, base in [(1, 1), (2, 2), (3, 4), (4, 8), (6, 32)]:
        delays = [backoff.delay(failures) for _ in range(200)]
        assert all(base <= d <= base + 1.0 for d in delays), (failures, min(delays), max(delays))
        assert max(delays) - min(delays) > 0.1, "no jitter"
    assert all(backoff.delay(20) == 60.0 for _ in range(50))


@pytest.mark.parametrize(
    ("outcome", "attempts_before", "status", "attempts_after", "delayed"),
    [
        (Outcome.NACKED, 0, PENDING, 1, True),
        (Outcome.RETURNED, 2, PENDING, 3, True),
        (Outcome.TIMED_OUT, 0, PENDING, 1, True),
        (Outcome.FAILED, 0, PENDING, 1, True),
        (Outcome.LOST, 2, PENDING, 2, False),
        (Outcome.NACKED, 4, PARKED, 5, False),  # the fifth failure with max_attempts=5
        (Outcome.REJECTED, 0, PARKED, 1, False),
    ],
)
def test_outcome_changes_row(
    outcome: Outcome, attempts_before: int, status: str, attempts_after: int, delayed: bool
) -> None:
    policy = SettlePolicy(max_attempts=5, backoff=Backoff(1.0, 60.0))
    batch = policy.batch([Settlement(row(7, attempts=attempts_before), outcome, "why")])
    assert batch.sent == ()
    (change,) = batch.changes
    assert (change.id, change.status, change.attempts) == (7, status, attempts_after)
    assert change.last_error == f"{outcome.value}: why"
    # A delay, not a time: the database adds it to its own clock (relay.db.clock).
    if delayed:
        low = 2 ** (attempts_after - 1)
        assert low <= change.delay <= low + 1
    else:
        assert change.delay == 0


def test_acked_rows_become_sent_in_one_list() -> None:
    policy = SettlePolicy(max_attempts=5, backoff=Backoff(1.0, 60.0))
    batch = policy.batch(
        [
            Settlement(row(1), Outcome.ACKED),
            Settlement(row(2), Outcome.NACKED, "x"),
            Settlement(row(3), Outcome.ACKED),
        ]
    )
    assert batch.sent == (1, 3)
    assert [c.id for c in batch.changes] == [2]
    assert len(batch) == 3


@pytest.mark.parametrize(
    ("outcome", "was_suspect", "made_suspect", "is_suspect"),
    [
        (Outcome.LOST, False, True, True),  # lost with a close that named nobody
        (Outcome.LOST, True, False, True),  # a suspect lost stays one
        (Outcome.LOST, False, False, False),
        (Outcome.FAILED, True, True, True),  # out alone, and the channel closed again
        (Outcome.FAILED, False, False, False),  # blamed for certain (an exchange named)
        (Outcome.NACKED, True, False, False),  # answered: innocent of any close
        (Outcome.TIMED_OUT, True, False, False),
        (Outcome.REJECTED, True, False, False),
    ],
)
def test_suspicion_is_kept_by_a_loss_and_cleared_by_an_answer(
    outcome: Outcome, was_suspect: bool, made_suspect: bool, is_suspect: bool
) -> None:
    policy = SettlePolicy(max_attempts=5, backoff=Backoff(1.0, 60.0))
    settled = Settlement(row(7, suspect=was_suspect), outcome, "why", None, made_suspect)
    (change,) = policy.batch([settled]).changes
    assert change.suspect is is_suspect


def test_duplicates_leave_in_a_list_of_their_own_and_cost_no_attempt() -> None:
    policy = SettlePolicy(max_attempts=1, backoff=Backoff(1.0, 60.0))
    batch = policy.batch(
        [
            Settlement(row(1, sent_before=True), Outcome.DUPLICATE),
            Settlement(row(2), Outcome.ACKED),
            Settlement(row(3, sent_before=True), Outcome.DUPLICATE),
        ]
    )
    assert (batch.sent, batch.changes, batch.duplicates) == ((2,), (), (1, 3))
    assert len(batch) == 3
