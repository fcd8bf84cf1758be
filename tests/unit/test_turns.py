"""The relay's turns (``relay.turns``): when its lease running short is logged. What turns do
to the loop (the lease renewed, the fence, a retired relay) is in ``test_loop.py``."""

from __future__ import annotations

import logging

import pytest

from relay.backoff import Backoff
from relay.lease import Lease
from relay.metrics import Metrics
from relay.retrying import RetryingStore
from relay.turns import Turns
from tests.support.fakes import InMemoryStore

# Each step: ("at", clock reading) | ("renew", lease until) -> (holds, lines logged so far);
# a margin of 2 s.
STEPS = {
    "a lease that holds logs nothing": [(("renew", 10.0), (True, 0)), (("at", 5.0), (True, 0))],
    "running short is logged once, however often asked": [
        (("renew", 10.0), (True, 0)),
        (("at", 8.5), (False, 1)),
        (("at", 9.0), (False, 1)),
        (("at", 20.0), (False, 1)),
    ],
    "and once again each time it runs short after a renewal": [
        (("renew", 10.0), (True, 0)),
        (("at", 9.0), (False, 1)),
        (("renew", 20.0), (True, 1)),
        (("at", 19.0), (False, 2)),
    ],
}


@pytest.mark.parametrize("steps", STEPS.values(), ids=list(STEPS))
def test_a_lease_running_short_is_logged_once_each_time(
    steps: list[tuple[tuple[str, float], tuple[bool, int]]], caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    lease = Lease(2.0, lambda: now[0])
    metrics = Metrics()
    store = RetryingStore(InMemoryStore(), Backoff(0.01, 0.05), metrics, lambda: None, lease.clock)
    turns = Turns(store, lease, metrics, 1.0, turned=lambda: None, retire=lambda: None)
    caplog.set_level(logging.WARNING, logger="relay.turns")
    for (step, value), (holds, logged) in steps:
        if step == "at":
            now[0] = value
        else:
            lease.renewed(value)
        assert turns.holds() is holds
        lines = [r for r in caplog.records if getattr(r, "action", None) == "lease_short"]
        assert len(lines) == logged, (step, value)
