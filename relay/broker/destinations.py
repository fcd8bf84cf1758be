"""Destination circuit breaking: which exchanges the broker refuses, and when to try again.

Pure logic, no I/O and no pika (like ``relay.broker.confirms``): the publisher tells it what the
broker said, and asks it what to do with each row.

A destination is an exchange ("" is the default exchange). A publish to an exchange that does
not exist (``404 NOT_FOUND - no exchange``) or that the user may not write to (``403
ACCESS_REFUSED - access to exchange``) makes the broker close the channel, and every
unconfirmed publish on it goes with it. Publishing the next row for that exchange would only
close the next channel, so the first such close marks the exchange *broken*, and its rows are
then *held*: charged an attempt and a back-off, as a failed publish is, but not published.
Every probe delay, which grows with each failed probe, the publisher checks it again on a
channel of its own (``relay.broker.publisher``), and once it passes the exchange's held rows are
due at once instead of waiting out their back-off:

- an exchange that did not exist (404) is *declared passively*: a declare-ok means it exists.
  This needs no row, so it runs on a timer, however long the rows' back-off is;
- an exchange refused (403) exists, and a passive declare needs no permission, so it would
  prove nothing: one of its rows is published as a *trial* instead, alone on a channel of
  its own, when one is due. Any answer (ack, nack, return) means it takes messages again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class Admission(enum.Enum):
    PUBLISH = "publish"  # the exchange is not known to be broken
    TRIAL = "trial"  # refused, and its probe is due: publish this row alone, on its own channel
    HOLD = "hold"  # broken: charge the row an attempt without publishing it


@dataclass(slots=True)
class _Broken:
    reason: str  # the broker's reply code and text
    declarable: bool  # it did not exist: a passive declare tells when it does
    probe_at: float
    failures: int = 1  # the close that broke it, then every failed probe
    probing: bool = False  # a probe (a passive declare or a trial row) is out
    held: int = 0  # rows held since it broke


def display(exchange: str) -> str:
    """An exchange's name as operators read it (RabbitMQ's name for the default exchange)."""
    return exchange or "amq.default"


class Destinations:
    """The broken exchanges; ``probe_delay(failures)`` is seconds until the next trial."""

    def __init__(self, probe_delay: Callable[[int], float]) -> None:
        self._probe_delay = probe_delay
        self._broken: dict[str, _Broken] = {}

    def broke(self, exchange: str, reason: str, now: float, *, declarable: bool) -> bool:
        """The broker refused a publish to ``exchange`` (``declarable``: because it does not
        exist); True when it was not broken yet."""
        state = self._broken.get(exchange)
        if state is not None:
            state.reason, state.declarable = reason, declarable
            return False
        self._broken[exchange] = _Broken(reason, declarable, now + self._probe_delay(1))
        return True

    def admit(self, exchange: str, now: float) -> Admission:
        state = self._broken.get(exchange)
        if state is None:
            return Admission.PUBLISH
        if not state.declarable and not state.probing and now >= state.probe_at:
            state.probing = True
            return Admission.TRIAL
        state.held += 1
        return Admission.HOLD

    def declares_due(self, now: float) -> list[str]:
        """The missing exchanges to declare passively now; each is then being probed."""
        due = [
            name
            for name, s in self._broken.items()
            if s.declarable and not s.probing and now >= s.probe_at
        ]
        for name in due:
            self._broken[name].probing = True
        return due

    def held_reason(self, exchange: str) -> str:
        """A held row's outcome detail: the same words as for the row whose publish broke it,
        so that every row of the destination is parked, in the end, with one reason."""
        return refused(exchange, self._broken[exchange].reason)

    def passed(self, exchange: str) -> int | None:
        """A probe passed: the exchange takes messages. The rows held since it broke, or
        None when it was not broken."""
        state = self._broken.pop(exchange, None)
        return None if state is None else state.held

    def failed(self, exchange: str, reason: str | None, now: float) -> None:
        """A probe failed (``reason``: the broker's new one, None when it did not answer):
        still broken, the next probe later."""
        state = self._broken.get(exchange)
        if state is None:
            return  # another probe passed meanwhile
        state.failures += 1
        state.reason = reason or state.reason
        state.probing = False
        state.probe_at = now + self._probe_delay(state.failures)

    def abandoned(self, exchange: str) -> None:
        """A probe ended without a verdict (the connection went, a trial row was malformed):
        the next one may start at once."""
        state = self._broken.get(exchange)
        if state is not None:
            state.probing = False

    def names(self) -> frozenset[str]:
        return frozenset(self._broken)

    def broken(self) -> dict[str, tuple[str, int]]:
        """Each broken exchange: (the broker's reason, rows held since it broke)."""
        return {name: (s.reason, s.held) for name, s in self._broken.items()}


def refused(exchange: str, reason: str) -> str:
    return f"the broker refuses exchange {display(exchange)!r}: {reason}"
