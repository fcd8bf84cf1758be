"""Relays of two protocols never own buckets at once (``relay.buckets.fence``), table-driven."""

from __future__ import annotations

import pytest

from relay.buckets import Fence, fence

# name -> (mine, the protocols of relays holding buckets, of every relay present, of those
# counted among the relays, the least protocol the schema admits), the fence
CASES: dict[str, tuple[int, list[int], list[int], list[int], int, Fence | None]] = {
    "alone": (2, [], [], [], 1, None),
    "among its own protocol": (2, [2, 2], [2, 2], [2, 2], 1, None),
    "an older relay holds buckets: wait": (2, [1], [1], [1], 1, Fence.WAIT_FOR_OLDER),
    "an older relay waiting, holding none: go": (2, [], [1], [], 1, None),
    "an older relay counted, holding none: wait": (2, [], [1], [1], 1, Fence.WAIT_FOR_OLDER),
    "an older relay holding, not present: wait": (2, [1], [], [], 1, Fence.WAIT_FOR_OLDER),
    "a newer relay holds buckets: yield": (1, [2], [2], [2], 1, Fence.YIELD_TO_NEWER),
    "a newer relay waiting, holding none: yield": (1, [], [2], [], 1, Fence.YIELD_TO_NEWER),
    "older and newer at once: yield first": (2, [1], [1, 3], [1, 3], 1, Fence.YIELD_TO_NEWER),
    "its own and an older holding: wait": (3, [3, 2], [3, 2], [3, 2], 1, Fence.WAIT_FOR_OLDER),
    "the schema admits its protocol exactly: go": (2, [], [], [], 2, None),
    "the schema admits newer protocols only: retired": (2, [], [], [], 3, Fence.RETIRED),
    "retired, though alone among older relays": (2, [1], [1], [1], 3, Fence.RETIRED),
    "retired, though a newer relay is there": (2, [3], [3], [3], 3, Fence.RETIRED),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_relay_stands_aside_for_another_protocol(case: str) -> None:
    mine, holding, announced, counted, least, expected = CASES[case]
    assert fence(mine, holding, announced, least, counted) is expected


def test_two_protocols_never_both_go() -> None:
    """Whatever two relays of different protocols see of each other, at most one takes; and
    a newer relay takes nothing while an older one is counted among the relays (one of a
    release before protocols takes its share of free buckets whatever it sees)."""
    for older, newer in ((1, 2), (2, 3), (1, 3)):
        for older_holds in (False, True):
            for newer_holds in (False, True):
                for older_counted in (False, True):
                    seen_by_older = fence(older, [newer] if newer_holds else [], [newer])
                    seen_by_newer = fence(
                        newer,
                        [older] if older_holds else [],
                        [older],
                        counted=[older] if older_counted else [],
                    )
                    assert seen_by_older is Fence.YIELD_TO_NEWER
                    waits = older_holds or older_counted
                    assert seen_by_newer is (Fence.WAIT_FOR_OLDER if waits else None)
