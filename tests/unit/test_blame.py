"""Blame and the quarantine, table-driven: a channel close in, a verdict out; suspects in, the
order they go out alone. No server (the real broker's side: tests/integration/test_poison.py)."""

from __future__ import annotations

from typing import Any

import pytest

from relay.broker.blame import CLOSED_BY_BROKER, blame
from relay.broker.confirms import ConfirmTracker
from relay.broker.quarantine import Quarantine
from relay.records import Outcome
from tests.support.rows import row

NO_X = "NOT_FOUND - no exchange 'x' in vhost '/'"
REFUSED_X = "ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused for user 'u'"


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


@pytest.mark.parametrize("case", BLAME.values(), ids=list(BLAME))
def test_the_rows_blamed_become_suspects_unless_the_close_names_an_exchange(
    case: tuple[int, str, Any, set[int], str, str, str | None, int | None],
) -> None:
    code, text, alone, blamed, _culprit_reason, _innocent, exchange, _size = case
    verdict = blame(code, text, alone)
    tracker = ConfirmTracker(60.0)
    rows = (X1, X2, Y1, BIG, SMALL, DEFAULT)
    for r in rows:
        tracker.published(r, 0.0)
    tracker.channel_lost(
        verdict.innocent_reason, verdict.culprit, verdict.culprit_reason, verdict.suspects
    )
    settled = {s.row.id: s for s in tracker.take_settled()}
    assert {i for i, s in settled.items() if s.outcome is Outcome.FAILED} == blamed
    suspects = {i for i, s in settled.items() if s.suspect}
    if exchange is not None:
        assert suspects == set()
    elif blamed:
        assert suspects == blamed
    else:  # nobody named: every row lost is a suspect
        assert suspects == {r.id for r in rows}


S1, S2 = row(11, suspect=True), row(12, suspect=True)
PLAIN = row(13)

# Steps in order, each (call, argument) -> what it must answer:
#   ("admit", row) -> True: publish with the others; ("next", in_flight) -> the row out alone
#   ("answered", None), ("judge", (code, text)) -> the culprits' ids, ("release", None) -> ids
#   ("closed", None) -> nothing else may join the window
QUARANTINE: dict[str, list[tuple[tuple[str, Any], Any]]] = {
    "a plain row is published with the others": [
        (("admit", PLAIN), True),
        (("closed", None), False),
        (("next", 0), None),
    ],
    "a suspect waits until nothing is in flight, then goes out alone": [
        (("admit", S1), False),
        (("closed", None), True),
        (("next", 3), None),
        (("next", 0), S1),
        (("closed", None), True),
        (("next", 0), None),  # one at a time
    ],
    "suspects go out one after another, each once the last was answered": [
        (("admit", S1), False),
        (("admit", S2), False),
        (("next", 0), S1),
        (("answered", None), None),
        (("closed", None), True),
        (("next", 0), S2),
        (("answered", None), None),
        (("closed", None), False),
    ],
    "a close while one is out alone blames it, whatever the text": [
        (("admit", S1), False),
        (("next", 0), S1),
        (("judge", (406, "PRECONDITION_FAILED - unknown rule")), {11}),
        (("closed", None), False),
    ],
    "a close with none out alone blames nobody": [
        (("admit", S1), False),
        (("judge", (406, "PRECONDITION_FAILED - unknown rule")), set()),
        (("release", None), {11}),
    ],
    "a lost channel releases the waiting suspects and forgets the one out": [
        (("admit", S1), False),
        (("admit", S2), False),
        (("next", 0), S1),
        (("release", None), {12}),
        (("closed", None), False),
        (("next", 0), None),
    ],
}


@pytest.mark.parametrize("steps", QUARANTINE.values(), ids=list(QUARANTINE))
def test_quarantine(steps: list[tuple[tuple[str, Any], Any]]) -> None:
    quarantine = Quarantine()
    for (call, arg), want in steps:
        if call == "admit":
            got: Any = quarantine.admit(arg)
        elif call == "next":
            got = quarantine.next_alone(arg)
        elif call == "answered":
            quarantine.answered()
            got = None
        elif call == "judge":
            verdict = quarantine.judge(*arg)
            culprit = verdict.culprit or (lambda _row: False)
            got = {r.id for r in (S1, S2, PLAIN) if culprit(r)}
        elif call == "release":
            got = {r.id for r in quarantine.release()}
        else:
            got = quarantine.closed
        assert got == want, (call, arg)
