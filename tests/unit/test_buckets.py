"""Owned buckets: fair shares, and a bucket handed over only when none of its rows is held."""

from __future__ import annotations

import pytest

from relay.buckets import Turn, any_in, bucket_of, fair_share, turn
from relay.constants import BUCKET_SPAN_ROWS, BUCKET_STRIDE, OUTBOX_BUCKETS

ALL = frozenset(range(OUTBOX_BUCKETS))
SPAN = BUCKET_SPAN_ROWS


def in_bucket(bucket: int) -> int:
    """The first id of the first run that goes to ``bucket``."""
    return bucket * pow(BUCKET_STRIDE, -1, OUTBOX_BUCKETS) % OUTBOX_BUCKETS * SPAN


@pytest.mark.parametrize(
    ("row_id", "bucket"),
    [
        (0, 0),
        (SPAN - 1, 0),
        (SPAN, BUCKET_STRIDE),  # the next run, a stride on
        (2 * SPAN, 2 * BUCKET_STRIDE - OUTBOX_BUCKETS),
        (SPAN * OUTBOX_BUCKETS, 0),  # dealt round again
        (in_bucket(63) + SPAN - 1, 63),
        (in_bucket(1) + SPAN * OUTBOX_BUCKETS, 1),
    ],
)
def test_consecutive_ids_share_a_bucket_in_runs(row_id: int, bucket: int) -> None:
    assert bucket_of(row_id) == bucket


def test_every_bucket_gets_one_run_of_each_round() -> None:
    runs = [bucket_of(run * SPAN) for run in range(OUTBOX_BUCKETS)]
    assert sorted(runs) == list(range(OUTBOX_BUCKETS))


# 23 runs of 128 ids: 10 s of a stream of 300 rows/s.
WINDOW_RUNS = 23


@pytest.mark.parametrize("relays", [2, 3, 4])
def test_a_stream_of_new_ids_is_spread_over_relays_owning_contiguous_buckets(relays: int) -> None:
    """Relays own the lowest free buckets, a fair share each: contiguous ranges. Any 23
    consecutive runs of new ids give each relay between 0.8 and 1.2 of its fair part."""
    share = fair_share(relays)
    owner = {bucket: min(bucket // share, relays - 1) for bucket in range(OUTBOX_BUCKETS)}
    for first in range(OUTBOX_BUCKETS):
        window = [owner[bucket_of((first + n) * SPAN)] for n in range(WINDOW_RUNS)]
        parts = [window.count(relay) / WINDOW_RUNS for relay in range(relays)]
        assert all(0.8 / relays <= part <= 1.2 / relays for part in parts), (first, parts)


@pytest.mark.parametrize(
    ("relays", "share"), [(0, 64), (1, 64), (2, 32), (3, 22), (63, 2), (64, 1), (100, 1)]
)
def test_fair_shares_cover_every_bucket(relays: int, share: int) -> None:
    assert fair_share(relays) == share
    assert fair_share(relays) * max(1, relays) >= OUTBOX_BUCKETS


TURNS = {
    "alone, owning nothing: take all": (set(), 1, [], Turn(64, frozenset(), frozenset())),
    "alone, owning all": (ALL, 1, [5], Turn(0, ALL, frozenset())),
    "a second relay came: give up the upper half, held rows first": (
        ALL,
        2,
        [in_bucket(32), in_bucket(63) + 1],  # rows of buckets 32 and 63 still held
        Turn(0, frozenset(range(32)), frozenset(range(33, 63))),
    ),
    "the newcomer owning nothing takes its share": (
        set(),
        2,
        [],
        Turn(32, frozenset(), frozenset()),
    ),
    "short of the share: take the rest, claim from what it owns": (
        {1, 2},
        3,
        [],
        Turn(20, frozenset({1, 2}), frozenset()),
    ),
    "a held row of a kept bucket keeps nothing from being released": (
        set(range(40)),
        2,
        [0, in_bucket(39)],
        Turn(0, frozenset(range(32)), frozenset(range(32, 39))),
    ),
}


@pytest.mark.parametrize(("owned", "relays", "held", "expected"), TURNS.values(), ids=list(TURNS))
def test_turn(owned: set[int], relays: int, held: list[int], expected: Turn) -> None:
    assert turn(owned, relays, held) == expected


INACTIVE = {
    "owning nothing: takes nothing": (set(), [], Turn(0, frozenset(), frozenset())),
    "idle: gives up every bucket": ({1, 2, 3}, [], Turn(0, frozenset(), frozenset({1, 2, 3}))),
    "keeps the buckets of its held rows, claims from none": (
        {1, 2, 3},
        [in_bucket(2) + 7],
        Turn(0, frozenset(), frozenset({1, 3})),
    ),
}


@pytest.mark.parametrize(("owned", "held", "expected"), INACTIVE.values(), ids=list(INACTIVE))
def test_a_relay_that_cannot_publish_gives_its_idle_buckets_up(
    owned: set[int], held: list[int], expected: Turn
) -> None:
    assert turn(owned, 2, held, active=False) == expected


SPAN = BUCKET_SPAN_ROWS
# (first id, last id, buckets) -> whether a row of those ids lies in one of the buckets.
ANY_IN = {
    "one id, its bucket": ((5, 5, {0}), True),
    "one id, another bucket": ((5, 5, {1, 63}), False),
    "the next run's bucket": ((SPAN - 1, SPAN, {BUCKET_STRIDE}), True),
    "a run short of it": ((SPAN, 2 * SPAN - 1, {0}), False),
    "a whole round of runs holds every bucket": ((0, OUTBOX_BUCKETS * SPAN - 1, {17}), True),
    "more than a round": ((3, 10**9, {63}), True),
    "no buckets": ((0, 10**9, set()), False),
}


@pytest.mark.parametrize(("given", "expected"), ANY_IN.values(), ids=list(ANY_IN))
def test_any_in_says_whether_new_ids_may_lie_in_a_relays_buckets(
    given: tuple[int, int, set[int]], expected: bool
) -> None:
    first, last, buckets = given
    assert any_in(first, last, buckets) is expected
    assert expected == any(bucket_of(i) in buckets for i in range(first, min(last, 10**5) + 1))
