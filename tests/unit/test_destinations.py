"""Destination breaking and channel-close blame, table-driven: broker events in, decisions out.
No server (the real broker's side: tests/e2e/test_destinations.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from relay.broker.blame import CLOSED_BY_BROKER, blame, suspect
from relay.broker.destinations import Admission, Destinations
from tests.support.rows import row

P, T, H = Admission.PUBLISH, Admission.TRIAL, Admission.HOLD
NO_X = "NOT_FOUND - no exchange 'x' in vhost '/'"
REFUSED_X = "ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused for user 'u'"


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


X1, X2, Y1 = row(1, exchange="x"), row(2, exchange="x"), row(3, exchange="y")
BIG, SMALL = row(4, payload=b"z" * 200), row(5, payload=b"z" * 50)
DEFAULT = row(6, exchange="")
INNOCENT = "lost with a channel the broker closed for another row"

# (code, text, the row out alone or None) -> rows blamed of (X1, X2, Y1, BIG, SMALL, DEFAULT), the
# culprits' reason (a part), the others' reason (a part), the exchange broken, the size learned
BLAME: dict[str, tuple[int, str, Any, set[int], str, str, str | None, int | None]] = {
    "404 names the exchange: its rows are the culprits, the others innocent": (
        404,
        NO_X,
        None,
        {1, 2},
        "the broker refuses exchange 'x': 404",
        INNOCENT,
        "x",
        None,
    ),
    "403 on an exchange the user may not write to": (
        403,
        REFUSED_X,
        None,
        {1, 2},
        "refuses exchange 'x': 403",
        INNOCENT,
        "x",
        None,
    ),
    "403 on the default exchange": (
        403,
        "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'u'",
        None,
        {6},
        "refuses exchange 'amq.default'",
        INNOCENT,
        "",
        None,
    ),
    "406 too large names a size: larger rows are the culprits, and suspects": (
        406,
        "PRECONDITION_FAILED - message size 200 is larger than configured max size 100",
        None,
        {4},
        CLOSED_BY_BROKER,
        INNOCENT,
        None,
        100,
    ),
    "a text that names nothing: every row is a suspect": (
        403,
        "ACCESS_REFUSED - cannot publish to internal exchange 'amq.rabbitmq.trace'",
        None,
        set(),
        "",
        CLOSED_BY_BROKER,
        None,
        None,
    ),
    "a row out alone is the culprit, whatever the text": (
        406,
        "PRECONDITION_FAILED - unknown rule",
        Y1,
        {3},
        CLOSED_BY_BROKER,
        INNOCENT,
        None,
        None,
    ),
    "a row out alone to a missing exchange: the culprit, and the exchange broken": (
        404,
        NO_X,
        X2,
        {2},
        "refuses exchange 'x'",
        INNOCENT,
        "x",
        None,
    ),
    "404 for a queue (a passive declare) names no exchange": (
        404,
        "NOT_FOUND - no queue 'q' in vhost '/'",
        None,
        set(),
        "",
        CLOSED_BY_BROKER,
        None,
        None,
    ),
}


@pytest.mark.parametrize("case", BLAME.values(), ids=list(BLAME))
def test_blame(case: tuple[int, str, Any, set[int], str, str, str | None, int | None]) -> None:
    code, text, alone, blamed, culprit_reason, innocent_reason, exchange, size = case
    verdict = blame(code, text, alone)
    culprit = verdict.culprit or (lambda _row: False)
    assert {r.id for r in (X1, X2, Y1, BIG, SMALL, DEFAULT) if culprit(r)} == blamed
    assert culprit_reason in verdict.culprit_reason
    assert innocent_reason in verdict.innocent_reason
    assert (verdict.exchange, verdict.max_message_size) == (exchange, size)
    # Only a close that names no row makes suspects of the rows it took down.
    assert (CLOSED_BY_BROKER in verdict.innocent_reason) == (verdict.culprit is None)


def test_a_suspect_is_known_by_its_last_error() -> None:
    assert suspect(row(1, last_error=f"lost: {CLOSED_BY_BROKER}: 406 x"))
    assert not suspect(row(1, last_error=f"lost: {INNOCENT}: 404 x"))
    assert not suspect(row(1))
