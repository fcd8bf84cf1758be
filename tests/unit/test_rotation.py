"""An inbox consumer's way through the broker's nodes (``relay.broker.rotation``), table-driven."""

from __future__ import annotations

import pytest

from relay.backoff import Backoff
from relay.broker.rotation import Rotation

# name -> (nodes, what each session did: "fail" or "ok"), the nodes the sessions ran on, and
# the failures in a row after each session
CASES: dict[str, tuple[list[str], list[str], list[str], list[int]]] = {
    "one node, failing": (["a"], ["fail", "fail", "ok"], ["a", "a", "a"], [1, 2, 0]),
    "the next node after a failure": (["a", "b", "c"], ["fail", "fail"], ["a", "b"], [1, 2]),
    "round again after the last": (
        ["a", "b"],
        ["fail", "fail", "fail"],
        ["a", "b", "a"],
        [1, 2, 3],
    ),
    "a stopped session stays on its node": (
        ["a", "b"],
        ["ok", "fail", "ok"],
        ["a", "a", "b"],
        [0, 1, 0],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_sessions_go_round_the_nodes(case: str) -> None:
    nodes, outcomes, expected_nodes, expected_failures = CASES[case]
    rotation = Rotation(nodes, Backoff(1.0, 8.0))
    visited, failures = [], []
    for outcome in outcomes:
        visited.append(rotation.node)
        if outcome == "fail":
            rotation.failed()
        else:
            rotation.worked()
        failures.append(rotation.failures)
    assert (visited, failures) == (expected_nodes, expected_failures)


def test_the_wait_grows_with_the_failures_in_a_row_up_to_the_maximum() -> None:
    rotation = Rotation(["a", "b"], Backoff(1.0, 8.0))
    waits = [rotation.failed() for _ in range(6)]
    assert [int(w) for w in waits[:4]] == [1, 2, 4, 8]  # each plus up to 1 s of jitter
    assert all(w <= 9.0 for w in waits)
    rotation.worked()
    assert rotation.failed() < 2.0


def test_a_rotation_needs_a_node() -> None:
    with pytest.raises(ValueError, match="needs a node"):
        Rotation([], Backoff(1.0, 8.0))
