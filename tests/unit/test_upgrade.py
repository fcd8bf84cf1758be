"""Which live relays stand in the way of a migration (``relay.upgrade``), table-driven."""

from __future__ import annotations

import pytest

from relay.upgrade import LiveRelay, blockers, least_protocol

OLD = LiveRelay("old", 1, 64)
NEW = LiveRelay("new", 2, 64)
WAITING_OLD = LiveRelay("old-waiting", 1, 0)

# name -> (live relays, the least protocol the migration needs, downgrade), the blockers
CASES: dict[str, tuple[list[LiveRelay], int | None, bool, list[LiveRelay]]] = {
    "no relay: upgrade": ([], 2, False, []),
    "no relay: downgrade": ([], None, True, []),
    "a migration any relay runs beside": ([OLD, NEW], None, False, []),
    "an older relay holds buckets": ([OLD, NEW], 2, False, [OLD]),
    "an older relay present, holding none": ([WAITING_OLD, NEW], 2, False, []),
    "every relay speaks the protocol needed": ([NEW], 2, False, []),
    "a newer protocol needed than any here": ([OLD, NEW], 3, False, [OLD, NEW]),
    "a downgrade, relays holding buckets": ([OLD, NEW], None, True, [OLD, NEW]),
    "a downgrade, relays holding none": ([WAITING_OLD], None, True, []),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_relays_in_a_migrations_way(case: str) -> None:
    live, least, downgrade, expected = CASES[case]
    assert blockers(live, least, downgrade) == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [([], None), ([None, None], None), ([None, 2], 2), ([3, None, 2], 3)],
)
def test_a_migrations_least_protocol_is_its_steps_greatest(
    steps: list[int | None], expected: int | None
) -> None:
    assert least_protocol(steps) == expected
