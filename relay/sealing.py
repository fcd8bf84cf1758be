"""How far the sent log's journal may be sealed into a run (``relay.db.sentruns``). Pure: the
relay's monotonic clock and the database's in, a time out.

A seal takes the journal's entries sent before a time; an entry that commits after the seal,
sent before that time, is in no run and in no tail a crash copies back (claims would publish
its id again while the log is recovering). An entry's sent time is its ack statement's
start by the database's clock, and an ack commits or fails within ``margin`` of it (its
statements and the pauses between them are bounded). Sealing up to the database's time
less the margin is safe while that clock only moves on at its pace: a step forward of
more than the margin, with an ack in flight, sealed past an entry that then committed.

So a seal goes only as far as a time the database's clock read at least ``margin`` ago by
the relay's monotonic clock (every ack that began before that reading has ended since),
and never past the database's time less the margin now (after a step back, an ack begun
since the reading may be sent before it). Without a step, the two are a check interval
apart at most."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

# Readings kept per ``settle_s`` at most: the relay looks again at once while a merge goes
# on (thousands of looks in a settle time), and a reading a sixteenth of it late costs a
# seal that much of its span.
READINGS_PER_SETTLE = 16


@dataclass
class SealBound:
    """The database's times this relay read (``read``) and the bound they give."""

    margin_s: float
    # Seconds a reading must age by the monotonic clock before a seal may reach it (0: no
    # ack can be in flight, as where a tool seals an aged log).
    settle_s: float
    readings: list[tuple[float, datetime]] = field(default_factory=list)

    def read(self, monotonic: float, database: datetime) -> datetime | None:
        """Remember the database's time ``database`` read at ``monotonic``; the time a seal may
        go up to now (None: no reading is old enough yet)."""
        if not self.readings or monotonic - self.readings[-1][0] >= (
            self.settle_s / READINGS_PER_SETTLE
        ):
            self.readings.append((monotonic, database))
        ripe = [seen for at, seen in self.readings if at <= monotonic - self.settle_s]
        if not ripe:
            return None
        # The readings after the one used stay: each is the bound of a later seal.
        self.readings = self.readings[len(ripe) - 1 :]
        return min(ripe[-1], database - timedelta(seconds=self.margin_s))
