"""What a relay says of the sent log (``relay.sentlog``): a table of what it was told, with
the clock's readings, and what it says then."""

from __future__ import annotations

import pytest

from relay.sentlog import SentLogState, SentLogWatch

COMPLETE, RECOVERING, INCOMPLETE = SentLogState
PATIENCE = 30.0

# What the watch is told, in order: (state, began, now) for a look, or a float: a failed
# call's time.
Told = tuple[SentLogState, float, float] | float


def told(events: list[Told]) -> SentLogWatch:
    watch = SentLogWatch(PATIENCE, 0.0)
    for event in events:
        if isinstance(event, tuple):
            watch.looked(*event)
        else:
            watch.failed(event)
    return watch


@pytest.mark.parametrize(
    ("events", "says", "unready_at", "reason"),
    [
        # Not looked at yet: neither complete nor recovering, but ready until a lease passed.
        ([], None, 10.0, None),
        ([], None, 31.0, "not been known good for claims for 31 s"),
        # A look found it complete: complete, and stays so without news.
        ([(COMPLETE, 1.0, 1.1)], COMPLETE, 500.0, None),
        # A call failed after the look: not known any more, from the failure on.
        ([(COMPLETE, 1.0, 1.1), 5.0], None, 34.0, None),
        ([(COMPLETE, 1.0, 1.1), 5.0], None, 36.0, "for 31 s"),
        # A look that began before the failure and found it complete says nothing: it may
        # have read the state row before a crash emptied it.
        ([(COMPLETE, 1.0, 1.1), 5.0, (COMPLETE, 4.0, 6.0)], None, 40.0, "good for claims for 35 s"),
        # A look begun after the failure finds it complete again.
        ([(COMPLETE, 1.0, 1.1), 5.0, (COMPLETE, 5.5, 6.0)], COMPLETE, 40.0, None),
        # Found incomplete (a crash emptied it): the reason says so, and the time counts from
        # the first moment it was not known good, not from the last look.
        (
            [(COMPLETE, 1.0, 1.1), 5.0, (INCOMPLETE, 6.0, 6.1), (INCOMPLETE, 11.0, 11.1)],
            INCOMPLETE,
            40.0,
            "incomplete for 35 s",
        ),
        # Recovering (the journal's tail copied back): claims go on, ready at once, though
        # not complete until the whole journal is copied.
        ([5.0, (INCOMPLETE, 6.0, 6.1), (RECOVERING, 7.0, 9.0)], RECOVERING, 500.0, None),
        (
            [5.0, (INCOMPLETE, 6.0, 6.1), (RECOVERING, 7.0, 9.0), (COMPLETE, 50.0, 60.0)],
            COMPLETE,
            61.0,
            None,
        ),
        # A recovering look begun before a failure says nothing either.
        ([5.0, (RECOVERING, 4.0, 9.0)], None, 40.0, "good for claims for 40 s"),
        # A later failure starts the count again from it.
        ([(COMPLETE, 1.0, 1.1), 5.0, (COMPLETE, 6.0, 6.1), 100.0], None, 129.0, None),
    ],
)
def test_the_watch_says_what_a_look_after_the_last_failure_found(
    events: list[Told], says: SentLogState | None, unready_at: float, reason: str | None
) -> None:
    watch = told(events)
    assert watch.complete is (says is COMPLETE)
    assert watch.recovering is (says is RECOVERING)
    why = watch.unready(unready_at)
    if reason is None:
        assert why is None
    else:
        assert why is not None and reason in why, why
