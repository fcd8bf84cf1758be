"""Destination breaking, table-driven: broker events in, decisions out. No server (the real
broker's side: tests/e2e/test_destinations.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from relay.broker.destinations import Admission, Destinations

P, T, H = Admission.PUBLISH, Admission.TRIAL, Admission.HOLD


def delay(failures: int) -> float:
    """The probe delay without jitter: 1, 2, 4, ... seconds."""
    return float(2 ** (failures - 1))


# Each case: events in order, each with its time, and what it must answer.
#   ("broke", exchange, now, declarable) -> True when newly broken
#   ("admit", exchange, now) -> Admission
#   ("declares", now) -> the exchanges to declare passively now
#   ("passed", exchange) -> rows held meanwhile (None: it was not broken)
#   ("failed", exchange, now), ("abandoned", exchange) -> None
CASES: dict[str, list[tuple[tuple[Any, ...], Any]]] = {
    "an unknown exchange is published": [(("admit", "x", 0.0), P)],
    "a refused exchange holds its rows until its probe is due, then one row is the trial": [
        (("broke", "x", 0.0, False), True),
        (("admit", "x", 0.5), H),
        (("admit", "y", 0.5), P),
        (("admit", "x", 1.0), T),
        (("admit", "x", 1.1), H),  # one trial at a time
    ],
    "breaking again while broken is not news": [
        (("broke", "x", 0.0, False), True),
        (("broke", "x", 0.2, False), False),
    ],
    "a failed trial doubles the delay, and a passed one ends it": [
        (("broke", "x", 0.0, False), True),
        (("admit", "x", 1.0), T),
        (("failed", "x", 1.5), None),
        (("admit", "x", 3.0), H),  # 1.5 + 2 s
        (("admit", "x", 3.5), T),
        (("passed", "x"), 1),  # the row held at 3.0
        (("admit", "x", 3.6), P),
        (("passed", "x"), None),
    ],
    "an abandoned trial lets the next row try at once": [
        (("broke", "x", 0.0, False), True),
        (("admit", "x", 1.0), T),
        (("abandoned", "x"), None),
        (("admit", "x", 1.0), T),
    ],
    "a missing exchange is declared on a timer, and its rows are never trials": [
        (("broke", "x", 0.0, True), True),
        (("declares", 0.5), []),
        (("admit", "x", 5.0), H),
        (("declares", 1.0), ["x"]),
        (("declares", 1.0), []),  # one declare at a time
        (("failed", "x", 1.2), None),
        (("declares", 2.0), []),
        (("declares", 3.2), ["x"]),
        (("passed", "x"), 1),
        (("declares", 10.0), []),
    ],
    "a probe ending after the exchange came back changes nothing": [
        (("failed", "x", 1.0), None),
        (("abandoned", "x"), None),
        (("admit", "x", 1.0), P),
    ],
}


@pytest.mark.parametrize("events", CASES.values(), ids=list(CASES))
def test_destinations(events: list[tuple[tuple[Any, ...], Any]]) -> None:
    destinations = Destinations(delay)
    calls: dict[str, Callable[..., Any]] = {
        "broke": lambda x, now, declarable: destinations.broke(
            x, "404 x", now, declarable=declarable
        ),
        "admit": destinations.admit,
        "declares": destinations.declares_due,
        "passed": destinations.passed,
        "failed": lambda x, now: destinations.failed(x, None, now),
        "abandoned": destinations.abandoned,
    }
    for (event, *args), expected in events:
        assert calls[event](*args) == expected, (event, args)


def test_held_rows_carry_the_broker_reason_and_the_state_says_how_many() -> None:
    destinations = Destinations(delay)
    destinations.broke(
        "", "403 ACCESS_REFUSED - access to exchange 'amq.default'", 0.0, declarable=False
    )
    assert destinations.admit("", 0.1) is H
    assert destinations.held_reason("") == (
        "the broker refuses exchange 'amq.default': "
        "403 ACCESS_REFUSED - access to exchange 'amq.default'"
    )
    destinations.failed("", "403 refused again", 1.0)
    assert destinations.broken() == {"": ("403 refused again", 1)}
    assert destinations.names() == frozenset({""})
