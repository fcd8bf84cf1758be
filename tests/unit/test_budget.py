"""The byte budget (``relay.budget``): what it says as rows are held and settled, and whether
it or the outbox running dry ended a short claim."""

from __future__ import annotations

import pytest

from relay.budget import ByteBudget

# name: (sizes held, then settled as negative sizes, in order; room, spent, empty after them)
HOLDS = {
    "nothing held": ([], 1000, False, True),
    "some held": ([300, 200], 500, False, False),
    "exactly the budget is spent": ([600, 400], 0, True, False),
    "a row larger than the whole budget, held alone": ([5000], -4000, True, False),
    "settled down to nothing is empty again": ([600, 400, -400, -600], 1000, False, True),
    "a settle frees room below the budget": ([600, 400, -400], 400, False, False),
}


@pytest.mark.parametrize(("sizes", "room", "spent", "empty"), HOLDS.values(), ids=list(HOLDS))
def test_what_the_budget_says_as_rows_are_held_and_settled(
    sizes: list[int], room: int, spent: bool, empty: bool
) -> None:
    budget = ByteBudget(1000)
    for size in sizes:
        budget.hold(size)
    assert (budget.room, budget.spent, budget.empty) == (room, spent, empty)


# name: (rows, bytes claimed, room the claim had; whether the budget cut it short), budget 1000
CUTS = {
    "rows of 100 filling 450 of 500: one more would not fit": (4, 400, 450, True),
    "rows of 100 filling 300 of 500: the outbox ran dry": (3, 300, 500, False),
    "one more would exactly fit: the outbox ran dry": (4, 400, 500, False),
    "none claimed, room under half the budget: a row of half would not fit": (0, 0, 400, True),
    "none claimed, room over half the budget: the outbox is empty": (0, 0, 600, False),
    "none claimed with the whole budget: the outbox is empty": (0, 0, 1000, False),
}


@pytest.mark.parametrize(("rows", "claimed", "room", "cut"), CUTS.values(), ids=list(CUTS))
def test_a_short_claim_was_cut_by_the_budget_when_one_more_row_like_its_own_would_not_fit(
    rows: int, claimed: int, room: int, cut: bool
) -> None:
    assert ByteBudget(1000).cut_short(rows, claimed, room) is cut


# name: (steps: ("hold", bytes) held or, negative, settled; ("claim", rows, bytes, freed) a
# short claim of that many rows and bytes, held, made with the room there was, while settles
# freed ``freed`` bytes; whether claims then wait for a settle to free room), budget 1000
WAITS = {
    "nothing held": ([], False),
    "the budget spent": ([("hold", 1000)], True),
    "a claim of nothing the budget cut waits": ([("hold", 600), ("claim", 0, 0, 0)], True),
    "a settle that frees room ends the wait": (
        [("hold", 600), ("claim", 0, 0, 0), ("hold", -1)],
        False,
    ),
    "rows of 100 filling 400 of 450 wait": ([("hold", 550), ("claim", 4, 400, 0)], True),
    "a claim the outbox ended does not wait": ([("hold", 500), ("claim", 3, 300, 0)], False),
    "a claim of nothing with room over half the budget does not wait": (
        [("hold", 300), ("claim", 0, 0, 0)],
        False,
    ),
    "a settle frees room, the next claim is cut again: waits again": (
        [("hold", 600), ("claim", 0, 0, 0), ("hold", -50), ("claim", 0, 0, 0)],
        True,
    ),
    # Seen: a relay that claimed nothing for ever, its held rows all settled during the claim.
    "everything held settled during a cut claim of nothing: no wait, nothing left to end it": (
        [("hold", 600), ("claim", 0, 0, 600)],
        False,
    ),
    "room freed during a cut claim: the next has more room, no wait": (
        [("hold", 550), ("claim", 4, 400, 100)],
        False,
    ),
}


@pytest.mark.parametrize(("steps", "waits"), WAITS.values(), ids=list(WAITS))
def test_claims_wait_for_room_after_one_the_budget_cut(
    steps: list[tuple[int | str, ...]], waits: bool
) -> None:
    """A claim the budget cut found nothing that fits its room: one with no more room would
    find nothing either, however often the loop turns (an empty claim per turn, before)."""
    budget = ByteBudget(1000)
    for step in steps:
        match step:
            case ("hold", int(size)):
                budget.hold(size)
            case ("claim", int(rows), int(claimed), int(freed)):
                room = budget.room
                budget.hold(-freed)
                budget.hold(claimed)
                budget.cut_short(rows, claimed, room)
    assert budget.waits is waits
