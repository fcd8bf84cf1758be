"""How far a seal may go (``relay.sealing``): the database's time read a settle time ago by
the monotonic clock, never past the database's time less the margin now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from relay.sealing import READINGS_PER_SETTLE, SealBound

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# (margin, settle, the readings as (monotonic, database seconds after T0), the bound each
# reading gives, in seconds after T0 or None)
CASES = [
    pytest.param(300, 0, [(0, 1000)], [700], id="no settle time: the margin alone"),
    pytest.param(
        300,
        300,
        [(0, 1000), (60, 1060), (300, 1300), (360, 1360)],
        [None, None, 1000, 1060],
        id="the clocks agree: the margin, a check later at most",
    ),
    pytest.param(
        300,
        300,
        [(0, 1000), (60, 1060 + 3600), (120, 1120 + 3600), (300, 1300 + 3600)],
        [None, None, None, 1000],
        id="a step forward of an hour: no further than a time read 300 s ago",
    ),
    pytest.param(
        300,
        300,
        [(0, 1000), (60, 1060), (300, 1300 - 3600)],
        [None, None, 1300 - 3600 - 300],
        id="a step back of an hour: the database's time less the margin",
    ),
    pytest.param(
        300,
        300,
        [(0, 1000), (360, 1360), (400, 1400), (700, 1700)],
        [None, 1000, 1000, 1400],
        id="a bound is the newest reading old enough, and stays until a newer one is",
    ),
]


@pytest.mark.parametrize(("margin", "settle", "readings", "bounds"), CASES)
def test_a_seals_bound(
    margin: float,
    settle: float,
    readings: list[tuple[float, float]],
    bounds: list[float | None],
) -> None:
    bound = SealBound(margin, settle)
    got = [bound.read(monotonic, at(database)) for monotonic, database in readings]
    assert got == [None if b is None else at(b) for b in bounds]


def test_looks_in_quick_succession_keep_a_reading_each_part_of_a_settle_time() -> None:
    """A merge's steps come at once after each other (thousands in a settle time): readings
    are kept a sixteenth of a settle time apart, so the bound is found in a few."""
    bound = SealBound(300, 320)
    for n in range(4000):
        bound.read(n / 4, at(n / 4))
    assert len(bound.readings) <= READINGS_PER_SETTLE + 1
    assert bound.read(1000.0, at(1000.0)) == at(680.0)
