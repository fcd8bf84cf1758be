"""Claim pacing (``relay.pacing``): when the loop claims, how many rows, which exchanges a claim
leaves out, and when the probe of new rows looks: tables of steps on a clock."""

from __future__ import annotations

from typing import Any

import pytest

from relay.constants import HELD_CHARGE_INTERVAL_S
from relay.pacing import ClaimPacing, Counts

LINGER, POLL, BATCH = 0.05, 0.5, 40
ROOM = Counts(can_publish=True, capacity=100, in_flight=0, ready=0, unsettled=0, budget_waits=False)


def pacing(linger: float = LINGER, window: int = 100) -> ClaimPacing:
    return ClaimPacing(linger=linger, poll_interval=POLL, batch_size=BATCH, window=window, now=0.0)


# Each step, with room for a full batch throughout:
#   ("decide", at) -> (rows claimed now, seconds to wait otherwise)
#   ("claim", at, rows found, cut by the budget) -> whether the probe listens after it
#   ("ask",): rows may be due (the probe saw new rows, a settle made rows due again)
TIMING: dict[str, tuple[float, list[tuple[Any, ...]]]] = {
    "the first claim comes at once": (LINGER, [("decide", 0.0, (BATCH, POLL))]),
    "a full claim is followed by the next at once": (
        LINGER,
        [("claim", 0.0, BATCH, False, False), ("decide", 0.001, (BATCH, POLL))],
    ),
    "after a short claim the next waits a linger, however soon asked": (
        LINGER,
        [
            ("claim", 0.0, 10, False, False),
            ("ask",),
            ("decide", 0.01, (0, 0.04)),
            ("decide", 0.05, (BATCH, POLL)),
        ],
    ),
    "while claims find rows the next comes a linger later unasked": (
        LINGER,
        [
            ("claim", 0.0, 10, False, False),
            ("decide", 0.049, (0, 0.001)),
            ("decide", 0.05, (BATCH, POLL)),
            ("claim", 0.05, 0, False, False),  # found nothing, found rows 50 ms ago: streams
            ("decide", 0.1, (BATCH, POLL)),
        ],
    ),
    "claims that found nothing for a poll interval: the probe listens, a poll or asking": (
        LINGER,
        [
            ("claim", 0.0, 10, False, False),
            ("claim", 0.45, 0, False, False),
            ("claim", 0.5, 0, False, True),
            ("decide", 0.6, (0, 0.4)),  # the next poll, a poll interval after the last claim
            ("decide", 1.0, (BATCH, POLL)),
            ("ask",),
            ("decide", 0.6, (BATCH, POLL)),
        ],
    ),
    "a relay that never found rows listens and claims when asked": (
        LINGER,
        [
            ("claim", 0.0, 0, False, True),
            ("decide", 0.1, (0, 0.4)),
            ("ask",),
            ("decide", 0.1, (BATCH, POLL)),
        ],
    ),
    "without a linger no claim comes unasked, and the probe listens while rows flow": (
        0.0,
        [
            ("claim", 0.0, 10, False, True),
            ("decide", 0.001, (0, 0.499)),
            ("ask",),
            ("decide", 0.001, (BATCH, POLL)),
            ("claim", 0.001, 10, False, True),
        ],
    ),
    "a claim the byte budget cut short is followed by the next once there is room": (
        LINGER,
        [("claim", 0.0, 10, True, False), ("decide", 0.001, (BATCH, POLL))],
    ),
    "asked while a claim ran: the next comes once the linger after it is over": (
        LINGER,
        [
            ("began", 0.0),
            ("ask",),
            ("claimed", 0.0, 0, False, True),
            ("decide", 0.01, (0, 0.04)),
            ("decide", 0.05, (BATCH, POLL)),
        ],
    ),
}


@pytest.mark.parametrize(("linger", "steps"), TIMING.values(), ids=list(TIMING))
def test_when_the_loop_claims(linger: float, steps: list[tuple[Any, ...]]) -> None:
    p = pacing(linger)
    for op, *args in steps:
        if op == "decide":
            at, expected = args
            rows, wait = p.decide(at, ROOM)
            assert rows == expected[0], (op, *args)
            assert wait == pytest.approx(expected[1]), (op, *args)
        elif op == "ask":
            p.asked()
        elif op == "began":
            p.began(args[0])
        else:
            at, found, cut, listening = args
            if op == "claim":
                p.began(at)
            p.claimed(at, BATCH, found, found, cut)
            assert p.listening is listening, (op, *args)


# name: (window, counts) -> rows claimed; a batch of 40 (a quarter: 10)
SIZES: dict[str, tuple[int, Counts, int]] = {
    "an empty window: a batch": (100, ROOM, BATCH),
    "the broker cannot take rows, or the lease runs short": (
        100,
        ROOM._replace(can_publish=False),
        0,
    ),
    "a window's worth of outcomes waits to be settled": (100, ROOM._replace(unsettled=100), 0),
    "the byte budget waits for room": (100, ROOM._replace(budget_waits=True), 0),
    "a full window and a batch ready ahead": (
        100,
        ROOM._replace(capacity=0, in_flight=100, ready=BATCH),
        0,
    ),
    "a full window, nothing ready: a batch ahead": (
        100,
        ROOM._replace(capacity=0, in_flight=100),
        BATCH,
    ),
    "room for less than a quarter batch while rows are in flight: none": (
        100,
        ROOM._replace(capacity=5, in_flight=95, ready=BATCH),
        0,
    ),
    "room for a quarter batch: claimed": (
        100,
        ROOM._replace(capacity=10, in_flight=90, ready=BATCH),
        10,
    ),
    "a small window: a window ahead, not a batch": (4, ROOM._replace(capacity=4), 8),
    "a small window, less than a quarter batch, nothing under way: claimed": (
        2,
        ROOM._replace(capacity=2),
        4,
    ),
    "a small window, less than a quarter batch, rows in flight: none": (
        4,
        ROOM._replace(capacity=2, in_flight=2),
        0,
    ),
}


@pytest.mark.parametrize(("window", "counts", "rows"), SIZES.values(), ids=list(SIZES))
def test_how_many_rows_a_claim_asks_for(window: int, counts: Counts, rows: int) -> None:
    assert pacing(window=window).decide(0.0, counts).rows == rows


# Each step: (at, the last claim full?) -> the exchanges the claim at that time leaves out;
# the exchange "gone" is broken throughout.
SKIPS: dict[str, list[tuple[float, bool, frozenset[str]]]] = {
    "the broken exchange's rows are claimed with the rest when no backlog waits": [
        (0.0, False, frozenset()),
        (0.1, False, frozenset()),
    ],
    "in a backlog they are left out, but claimed once a charge interval": [
        (0.0, True, frozenset()),  # the first claim takes them
        (0.1, True, frozenset({"gone"})),
        (HELD_CHARGE_INTERVAL_S - 0.01, True, frozenset({"gone"})),
        (HELD_CHARGE_INTERVAL_S, True, frozenset()),
        (HELD_CHARGE_INTERVAL_S + 0.1, True, frozenset({"gone"})),
    ],
    "once the backlog is drained they are claimed at once": [
        (0.0, True, frozenset()),
        (0.1, True, frozenset({"gone"})),
        (0.2, False, frozenset()),
    ],
}


@pytest.mark.parametrize("steps", SKIPS.values(), ids=list(SKIPS))
def test_claims_leave_broken_exchanges_out_while_a_backlog_waits(
    steps: list[tuple[float, bool, frozenset[str]]],
) -> None:
    p = pacing()
    for at, full, skipped in steps:
        p.claimed(at, BATCH, BATCH if full else 0, BATCH if full else 0, cut=False)
        assert p.skip(at, frozenset({"gone"})) == skipped, at


def test_nothing_is_left_out_when_nothing_is_broken() -> None:
    p = pacing()
    p.claimed(0.0, BATCH, BATCH, BATCH, cut=False)
    assert p.skip(0.1, frozenset()) == frozenset()


def test_a_claim_whose_rows_were_dropped_still_counts_as_full_for_the_backlog() -> None:
    """Rows claimed under a lease that lapsed meanwhile are released, not kept: the claim
    still says other rows wait (``backlog``), but found none to publish: the next claim
    waits for the poll, or for asking once the linger is over."""
    p = pacing()
    p.began(0.0)
    p.claimed(0.0, BATCH, BATCH, 0, cut=False)
    assert p.backlog
    rows, wait = p.decide(0.01, ROOM)
    assert rows == 0
    assert wait == pytest.approx(POLL - 0.01)
