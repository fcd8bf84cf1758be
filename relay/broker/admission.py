"""What the publisher does with a row handed to it: decided once, here. Pure: no I/O.

- ``LOSE``: there is no confirm channel to publish on; due again at once, unpublished.
- ``HOLD``: its exchange is broken (``relay.broker.destinations``): charged an attempt, as a
  failed publish is, without being published.
- ``TRIAL``: its exchange is refused and a probe is due: published alone, on a channel of
  its own (``relay.broker.probes``).
- ``ALONE``: a suspect (``relay.broker.quarantine``): published once nothing else is in
  flight.
- ``SEND``: published now on the confirm channel.

A row admitted is not yet on the wire: the one place a row is sent (the publisher's
``_send``) checks the relay's lease last (``relay.lease``), as a suspect or a trial row may
wait there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from relay.broker.destinations import Admission, Destinations
from relay.records import OutboxRow

NO_CHANNEL = "no channel to publish on"


class Decision(enum.Enum):
    SEND = "send"
    ALONE = "alone"
    TRIAL = "trial"
    HOLD = "hold"
    LOSE = "lose"


@dataclass(frozen=True, slots=True)
class Admitted:
    decision: Decision
    reason: str = ""  # HOLD's and LOSE's outcome detail


# The decisions that carry no reason of their row's, made once: one is made per row published,
# and a new frozen dataclass each time was a tenth of the publisher's own CPU.
_SEND = Admitted(Decision.SEND)
_ALONE = Admitted(Decision.ALONE)
_TRIAL = Admitted(Decision.TRIAL)
_NO_CHANNEL = Admitted(Decision.LOSE, NO_CHANNEL)


def admit(row: OutboxRow, channel_open: bool, destinations: Destinations, now: float) -> Admitted:
    if not channel_open:
        return _NO_CHANNEL
    destination = destinations.admit(row.exchange, now)
    if destination is Admission.HOLD:
        return Admitted(Decision.HOLD, destinations.held_reason(row.exchange))
    if destination is Admission.TRIAL:
        return _TRIAL
    if row.suspect:
        return _ALONE
    return _SEND
