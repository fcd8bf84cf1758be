"""What the publisher does with a row handed over (``relay.broker.admission``), table-driven."""

from __future__ import annotations

import pytest

from relay.broker.admission import NO_CHANNEL, Decision, admit
from relay.broker.destinations import Destinations
from tests.support.rows import row

REFUSED, MISSING = "refused", "missing"


def destinations() -> Destinations:
    """``refused`` broken by a 403 (its probe due after 1 s), ``missing`` by a 404."""
    broken = Destinations(lambda _failures: 1.0)
    broken.broke(REFUSED, "403 ACCESS_REFUSED", 0.0, declarable=False)
    broken.broke(MISSING, "404 NOT_FOUND", 0.0, declarable=True)
    return broken


# (exchange, suspect, channel open, now) -> (decision, a part of the reason)
CASES = {
    "a plain row is sent": (("ok", False, True, 0.5), (Decision.SEND, "")),
    "a suspect waits to go out alone": (("ok", True, True, 0.5), (Decision.ALONE, "")),
    "no channel: lost, whatever else": (("ok", True, False, 0.5), (Decision.LOSE, NO_CHANNEL)),
    "a refused exchange's row is held": ((REFUSED, False, True, 0.5), (Decision.HOLD, "403")),
    "its probe due: one row is the trial": ((REFUSED, False, True, 1.0), (Decision.TRIAL, "")),
    "a suspect of a refused exchange is the trial": (
        ("refused", True, True, 1.0),
        (Decision.TRIAL, ""),
    ),
    "a missing exchange's rows are held, never trials": (
        ("missing", False, True, 5.0),
        (Decision.HOLD, "404"),
    ),
}


@pytest.mark.parametrize(("given", "expected"), CASES.values(), ids=list(CASES))
def test_admission(given: tuple[str, bool, bool, float], expected: tuple[Decision, str]) -> None:
    exchange, suspect, channel_open, now = given
    admitted = admit(row(1, exchange=exchange, suspect=suspect), channel_open, destinations(), now)
    assert admitted.decision is expected[0]
    assert expected[1] in admitted.reason
