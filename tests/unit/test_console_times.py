"""A time as the console's pages show it: how long ago, against the page's database time,
and the absolute time in UTC as its title."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from relay.console.times import ago, when

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "before, said",
    [
        (timedelta(0), "now"),
        (timedelta(seconds=12), "12 s ago"),
        (timedelta(minutes=3, seconds=59), "3 min ago"),
        (timedelta(hours=2, minutes=59), "2 h ago"),
        (timedelta(days=5, hours=23), "5 d ago"),
        (timedelta(minutes=-3), "in 3 min"),
    ],
)
def test_an_age_is_said_in_its_largest_whole_unit(before: timedelta, said: str) -> None:
    assert ago(NOW - before, NOW) == said


def test_a_time_element_carries_the_utc_time_whatever_zone_it_came_in() -> None:
    paris = datetime(2026, 11, 29, 12, 57, 3, tzinfo=timezone(timedelta(hours=1)))
    assert str(when(paris, NOW)) == (
        '<time datetime="2026-11-29T11:57:03+00:00" title="2026-11-29 11:57:03 UTC">'
        "2 min ago</time>"
    )
    assert str(when(None, NOW)) == ""
