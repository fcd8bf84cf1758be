"""What a claim leaves out and takes (``relay.held``): a table of claim and settle steps."""

from __future__ import annotations

from typing import Any

import pytest

from relay.held import HeldRows

# Each step: ("claim", found positions, full?, the ids it must leave out, the ids it takes)
# or ("settle", ids). Positions are (due time, id).
CASES: dict[str, list[tuple[Any, ...]]] = {
    "a claim from the start leaves out every held row": [
        ("claim", [(1, 1), (1, 2)], False, [], {1, 2}),
        ("claim", [(1, 3)], False, [1, 2], {3}),
    ],
    "a full claim reads on, leaving out only the held rows beyond it": [
        ("claim", [(5, 9)], False, [], {9}),  # held, due later than the next claim's position
        ("claim", [(1, 1), (1, 2)], True, [9], {1, 2}),
        ("claim", [(2, 3), (3, 4)], True, [9], {3, 4}),
        ("settle", [9]),
        ("claim", [(4, 5)], False, [], {5}),
    ],
    "a short claim sends the next one back to the start": [
        ("claim", [(1, 1), (1, 2)], True, [], {1, 2}),
        ("claim", [(2, 3)], False, [], {3}),
        ("claim", [], False, [1, 2, 3], set()),
    ],
    "a row found while still held (its settle committing) is not taken twice": [
        ("claim", [(1, 1), (1, 2)], True, [], {1, 2}),
        ("claim", [(2, 3), (9, 1)], False, [], {3}),  # row 1, due again, found reading on
        ("settle", [1]),
        ("claim", [(9, 1)], False, [2, 3], {1}),
    ],
    "a full claim that met a row still held sends the next one back to the start": [
        ("claim", [(1, 1), (1, 2)], True, [], {1, 2}),
        ("claim", [(2, 3), (9, 1), (10, 4)], True, [], {3, 4}),  # row 1 due again, held
        ("settle", [1]),
        ("claim", [(9, 1)], True, [2, 3, 4], {1}),  # from the start: not passed by
    ],
    "settled rows are left out no more": [
        ("claim", [(1, 1), (1, 2)], False, [], {1, 2}),
        ("settle", [1, 2]),
        ("claim", [], False, [], set()),
    ],
}


# Cases where claims never read on (per-key ordering): a full claim leaves the next at the
# start too.
FROM_THE_START: dict[str, list[tuple[Any, ...]]] = {
    "a full claim does not set a position": [
        ("claim", [(1, 1), (1, 2)], True, [], {1, 2}),
        ("claim", [(1, 3)], True, [1, 2], {3}),
    ],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=list(CASES))
def test_held_rows(steps: list[tuple[Any, ...]]) -> None:
    play(HeldRows(), steps)


@pytest.mark.parametrize("steps", FROM_THE_START.values(), ids=list(FROM_THE_START))
def test_held_rows_never_read_on(steps: list[tuple[Any, ...]]) -> None:
    play(HeldRows(read_on=False), steps)


def play(held: HeldRows, steps: list[tuple[Any, ...]]) -> None:
    for step in steps:
        if step[0] == "settle":
            held.settled(step[1])
            continue
        _, found, full, left_out, taken = step
        assert sorted(held.left_out()) == left_out
        assert held.claimed(found, full) == taken
