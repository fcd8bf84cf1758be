"""A lease carried on the host's clock (``relay.lease``): when it holds, when a renewal starts
a new one, and which waiting rows a lapse drops."""

from __future__ import annotations

import time

import pytest

from relay.lease import Lease, Waiting, lease_clock, longest_confirm_timeout, margin_for
from tests.support.rows import row


@pytest.mark.parametrize(
    ("confirm_timeout", "margin"),
    [
        (30.0, 30.0 + 1.0 + 5.0),  # the default: the watcher looks every second
        (2.0, 2.0 + 0.5 + 2.0),  # a short timeout: a quarter of it, and a close as long
        (0.4, 0.4 + 0.1 + 0.4),
    ],
)
def test_the_margin_covers_the_timeout_the_watchers_look_and_the_close(
    confirm_timeout: float, margin: float
) -> None:
    assert margin_for(confirm_timeout) == pytest.approx(margin)


@pytest.mark.parametrize("confirm_timeout", [0.4, 2.0, 4.0, 4.5, 5.0, 7.0, 10.0, 30.0, 300.0])
def test_the_longest_confirm_timeout_a_lease_outlives_inverts_the_margin(
    confirm_timeout: float,
) -> None:
    """The settings' error says which timeouts a lease outlives: those below the one whose
    margin is half the lease."""
    lease = 2 * margin_for(confirm_timeout)
    assert longest_confirm_timeout(lease) == pytest.approx(confirm_timeout)


def test_the_lease_clock_is_never_behind_the_monotonic_one() -> None:
    """CLOCK_BOOTTIME: it counts what CLOCK_MONOTONIC does, and the time suspended too."""
    boot, mono = lease_clock(), time.monotonic()
    assert boot >= mono - 1e-3


# Each step: ("at", clock reading) | ("renew", lease until) -> (holds, epoch) after it.
STEPS = {
    "nothing is leased before the first turn": [(("at", 0.0), (False, 0))],
    "the first renewal starts the first lease": [(("renew", 10.0), (True, 1))],
    "renewals in time keep the lease": [
        (("renew", 10.0), (True, 1)),
        (("at", 5.0), (True, 1)),
        (("renew", 15.0), (True, 1)),
    ],
    "within the margin of its end it no longer holds": [
        (("renew", 10.0), (True, 1)),
        (("at", 8.0), (False, 1)),
    ],
    "a renewal after it ran short is a new lease": [
        (("renew", 10.0), (True, 1)),
        (("at", 30.0), (False, 1)),
        (("renew", 40.0), (True, 2)),
    ],
}


@pytest.mark.parametrize("steps", STEPS.values(), ids=list(STEPS))
def test_a_lease(steps: list[tuple[tuple[str, float], tuple[bool, int]]]) -> None:
    now = [0.0]
    lease = Lease(2.0, lambda: now[0])
    for (step, value), (holds, epoch) in steps:
        if step == "at":
            now[0] = value
        else:
            lease.renewed(value)
        assert (lease.holds(), lease.epoch) == (holds, epoch)


def test_rows_that_waited_through_a_lapse_are_sorted_out() -> None:
    now = [0.0]
    lease = Lease(1.0, lambda: now[0])
    lease.renewed(10.0)
    waiting = Waiting(lease)
    suspect, trial, fresh, other = row(1), row(2), row(3), row(4)
    waiting.wait(suspect)
    waiting.wait(trial)
    waiting.forget([trial])  # released otherwise: waits no more
    assert waiting.lapsed([suspect]) == ([suspect], [])  # same lease: goes out
    waiting.wait(suspect)
    now[0] = 20.0
    lease.renewed(30.0)  # it lapsed: a new lease
    waiting.wait(fresh)
    sent, lapsed = waiting.lapsed([suspect, fresh, other])
    assert (sent, lapsed) == ([fresh, other], [suspect])
    assert waiting.lapsed([suspect]) == ([suspect], []), "sorted out once, then forgotten"
