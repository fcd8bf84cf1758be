"""What a relay says of the sent log's completeness (``relay.sentlog``): a table of what it
was told, with the clock's readings, and what it says then."""

from __future__ import annotations

import pytest

from relay.sentlog import SentLogWatch

# What the watch is told, in order: ("looked", complete, began, now) or ("failed", now).
Event = tuple[object, ...]
PATIENCE = 30.0


def told(events: list[Event]) -> SentLogWatch:
    watch = SentLogWatch(PATIENCE, 0.0)
    for event in events:
        if event[0] == "looked":
            _, complete, began, now = event
            watch.looked(bool(complete), float(began), float(now))  # type: ignore[arg-type]
        else:
            watch.failed(float(event[1]))  # type: ignore[arg-type]
    return watch


@pytest.mark.parametrize(
    ("events", "complete", "unready_at", "reason"),
    [
        # Not looked at yet: not complete, but ready until a lease has passed.
        ([], False, 10.0, None),
        ([], False, 31.0, "not been known complete for 31 s"),
        # A look found it complete: complete, and stays so without news.
        ([("looked", True, 1.0, 1.1)], True, 500.0, None),
        # A call failed after the look: not known complete any more, from the failure on.
        ([("looked", True, 1.0, 1.1), ("failed", 5.0)], False, 34.0, None),
        ([("looked", True, 1.0, 1.1), ("failed", 5.0)], False, 36.0, "for 31 s"),
        # A look that began before the failure and found it complete says nothing: it may
        # have read the state row before a crash emptied it.
        (
            [("looked", True, 1.0, 1.1), ("failed", 5.0), ("looked", True, 4.0, 6.0)],
            False,
            40.0,
            "not been known complete for 35 s",
        ),
        # A look begun after the failure finds it complete again.
        (
            [("looked", True, 1.0, 1.1), ("failed", 5.0), ("looked", True, 5.5, 6.0)],
            True,
            40.0,
            None,
        ),
        # A look found it incomplete (a crash emptied it): the reason says so, and the time
        # counts from the first moment it was not known complete, not from the last look.
        (
            [
                ("looked", True, 1.0, 1.1),
                ("failed", 5.0),
                ("looked", False, 6.0, 6.1),
                ("looked", False, 11.0, 11.1),
            ],
            False,
            40.0,
            "incomplete for 35 s",
        ),
        # Rebuilt: complete again, and ready at once.
        (
            [("failed", 5.0), ("looked", False, 6.0, 6.1), ("looked", True, 50.0, 60.0)],
            True,
            61.0,
            None,
        ),
        # A later failure starts the count again from it.
        (
            [
                ("looked", True, 1.0, 1.1),
                ("failed", 5.0),
                ("looked", True, 6.0, 6.1),
                ("failed", 100.0),
            ],
            False,
            129.0,
            None,
        ),
    ],
)
def test_the_watch_says_complete_only_from_a_look_after_the_last_failure(
    events: list[Event], complete: bool, unready_at: float, reason: str | None
) -> None:
    watch = told(events)
    assert watch.complete is complete
    why = watch.unready(unready_at)
    if reason is None:
        assert why is None
    else:
        assert why is not None and reason in why, why
