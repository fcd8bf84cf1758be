"""Settle batching (``relay.batching``): when gathered outcomes are settled, alone or taken
along by a claim: a table of steps on a clock, linger 50 ms, a batch of 4."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from relay.batching import SettleBatching
from relay.records import Outcome, Settlement
from tests.support.rows import row

LINGER = 0.05
BATCH = 4

# Each step, at a clock reading (seconds), and what it must answer:
#   ("add", at, outcomes, pressed) -> whether the settle task is to look now
#   ("due", at, pressed) -> whether the settle task settles now
#   ("until", at) -> seconds until due unpressed (None: nothing waits)
#   ("ride", at, backlog) -> how many outcomes the claim takes along
#   ("take",) -> how many the settle takes; ("put_back", n) -> how many then wait
CASES: dict[str, list[tuple[Any, ...]]] = {
    "the first outcome sets the settle time and has the settle task wait for it": [
        ("add", 0.0, 1, False, True),
        ("due", 0.0, False, False),
        ("until", 0.0, 0.15),  # its settle time (a linger) and two lingers more
        ("add", 0.01, 1, False, False),  # later ones wait with it
        ("until", 0.01, 0.14),
    ],
    "nothing added, nothing to look at": [
        ("add", 0.0, 0, False, False),
        ("until", 0.0, None),
        ("due", 1.0, True, False),
    ],
    "a batch's worth is settled at once": [
        ("add", 0.0, 3, False, True),
        ("add", 0.01, 1, False, True),
        ("due", 0.01, False, True),
    ],
    "a pressed loop (the budget spent, the relay stopping) has them settled at once": [
        ("add", 0.0, 1, False, True),
        ("add", 0.01, 1, True, True),
        ("due", 0.01, True, True),
        ("due", 0.01, False, False),
    ],
    "the first claim after the settle time takes them along": [
        ("add", 0.0, 2, False, True),
        ("ride", 0.049, False, 0),
        ("ride", 0.05, False, 2),
        ("until", 0.05, None),
        ("add", 0.06, 1, False, True),  # the next ones set a new settle time
        ("ride", 0.1, False, 0),
        ("ride", 0.11, False, 1),
    ],
    "nothing rides on a claim in a backlog": [
        ("add", 0.0, 2, False, True),
        ("ride", 0.1, True, 0),
        ("due", 0.1, False, False),
    ],
    "no claim took them within two lingers of their settle time: settled alone": [
        ("add", 0.0, 1, False, True),
        ("due", 0.149, False, False),
        ("due", 0.151, False, True),
        ("until", 0.2, 0.0),
    ],
    "outcomes a settle could not record wait again, first": [
        ("add", 0.0, 2, False, True),
        ("take", 2),
        ("add", 0.01, 1, False, True),
        ("put_back", 3),
    ],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=list(CASES))
def test_settle_batching(steps: list[tuple[Any, ...]]) -> None:
    batching = SettleBatching(LINGER, False, BATCH, now=0.0)
    ids = itertools.count(1)
    taken: list[Settlement] = []
    for op, *args, expected in steps:
        if op == "add":
            at, count, pressed = args
            added = [Settlement(row(next(ids)), Outcome.ACKED) for _ in range(count)]
            assert batching.add(at, added, pressed) is expected, (op, *args)
        elif op == "due":
            assert batching.due(*args) is expected, (op, *args)
        elif op == "until":
            until = batching.until(*args)
            assert until == (None if expected is None else pytest.approx(expected)), (op, *args)
        elif op == "ride":
            assert len(batching.ride(*args)) == expected, (op, *args)
        elif op == "take":
            taken = batching.take()
            assert len(taken) == expected
            assert len(batching) == 0
        else:
            newer = [s.row.id for s in batching.waiting]
            batching.put_back(taken)
            assert [s.row.id for s in batching.waiting] == [s.row.id for s in taken] + newer
            assert len(batching) == expected


def test_with_per_key_ordering_the_very_next_claim_takes_them_along() -> None:
    """No settle linger: a key's next row is claimed once its last is settled."""
    batching = SettleBatching(LINGER, True, BATCH, now=0.0)
    batching.add(0.0, [Settlement(row(1), Outcome.ACKED)], pressed=False)
    assert len(batching.ride(0.0, backlog=False)) == 1
