"""How long this relay may still publish the rows of its buckets. Pure: a clock reading in, a
verdict out.

A relay's buckets are leased to it by the database's clock (``relay.db.buckets``); once a
lease ends another relay may take the bucket and publish its rows. A relay that froze (a VM
migrated or suspended, a container throttled to nothing, a debugger) and woke after its
lease ended would otherwise publish rows it had claimed before: a row another relay had
published since, after which it had published the key's next row too (the queue saw A, B,
A). So a row goes on the wire only while the lease has more than ``margin`` seconds left,
and the loop releases what it claimed, unpublished, when it has not.

The lease's end is carried from the database's clock to this host's boot-time clock
(``lease_clock``, ``CLOCK_BOOTTIME``), which neither NTP nor a skewed wall clock moves, and
which, unlike ``CLOCK_MONOTONIC``, runs on while the machine is suspended: a relay woken from
a suspend past its lease knows it. Each turn leases the buckets for ``seconds`` from its
statement, which ran after the turn was asked for, so the lease ends no sooner than
``seconds`` after that moment on this clock.

The margin is how long a row published in time may still reach the broker: a confirm
timeout (the broker answered nothing), the watcher's period before it notices, and the close
of the half-open connection it then starts (``relay.broker.publisher``); ``margin_for``.
What keeps a key's rows in order is the check itself, made before every send: a row
published as a lease ends can only be published again by the next owner, never after a
later row of its key, which is claimed only once that row is settled.

A lease that lapsed and was renewed is a new one (``epoch``): a row claimed under the old
one may have been taken and published by another relay meanwhile (the renewal keeps only
the buckets no other relay took, but the rows this relay holds are its own to drop), so it
is released unpublished, whenever it would go out: the loop's rows claimed ahead, suspects
waiting to go out alone, trial rows of broken destinations.

What remains: a relay frozen between its check and its write (a few microseconds) still
writes; data the kernel or the broker already holds (a send buffer, a broker that stopped
reading) can arrive later than the margin; and a broker that received a row and processes
it late is beyond any relay's reach. Consumers that need strict order across such faults
order by the message id's sequence themselves.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from relay.constants import HALF_OPEN_CLOSE_S, WATCH_PERIOD_MAX_S
from relay.records import OutboxRow

# Why a row claimed for publishing is due again without having been published.
LEASE_SHORT = "claimed, not published: its bucket's lease was running out"
LEASE_LAPSED = "claimed, not published: its bucket's lease lapsed since it was claimed"


def _boot_clock() -> Callable[[], float]:
    """``CLOCK_BOOTTIME`` where the platform has one (Linux, where the relay runs); elsewhere
    the monotonic clock, which may stand still while the machine sleeps. The inbox, a library
    that applications developed on any laptop embed, imports this module too."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic
    return functools.partial(time.clock_gettime, boottime)


# The clock leases are carried on (see the module docstring).
lease_clock: Callable[[], float] = _boot_clock()


def watch_period(confirm_timeout: float) -> float:
    """How often the publisher looks for overdue confirms."""
    return min(WATCH_PERIOD_MAX_S, confirm_timeout / 4)


def margin_for(confirm_timeout: float) -> float:
    """The lease a row needs left to go out: the most that may pass between its publish and
    the moment the relay has given it up and dropped its connection."""
    return confirm_timeout + watch_period(confirm_timeout) + min(HALF_OPEN_CLOSE_S, confirm_timeout)


def longest_confirm_timeout(lease: float) -> float:
    """The confirm timeouts a lease of ``lease`` seconds outlives twice (``margin_for``: what
    the settings ask) are those below this: ``margin_for`` inverted, piece by piece."""
    half = lease / 2
    whole_watch = 4 * WATCH_PERIOD_MAX_S  # from here the watcher looks every second
    if half <= margin_for(whole_watch):  # the watcher a quarter, the close as long
        return half / (2 + 1 / 4)
    if half <= margin_for(HALF_OPEN_CLOSE_S):  # the close as long
        return (half - WATCH_PERIOD_MAX_S) / 2
    return half - WATCH_PERIOD_MAX_S - HALF_OPEN_CLOSE_S


class Lease:
    def __init__(self, margin: float, clock: Callable[[], float] = lease_clock) -> None:
        self.margin = margin
        self.clock = clock
        self._until = float("-inf")  # nothing is leased before the first turn
        # Counts the leases: a renewal of a lease that had run short starts a new one.
        self.epoch = 0

    def renewed(self, until: float) -> None:
        """A turn leased the buckets until ``until`` on the clock (``RetryingStore.turn``)."""
        if not self.holds():
            self.epoch += 1
        self._until = until

    def left(self) -> float:
        """Seconds of lease left (negative once it ended)."""
        return self._until - self.clock()

    def holds(self) -> bool:
        """A row may be published now: more than the margin is left."""
        return self.left() > self.margin


class Waiting:
    """Rows handed over for publishing that wait to go out (a suspect until nothing else is
    in flight, a trial row until its side channel opens), each with the lease it was handed
    over under: ``lapsed`` sorts out those whose lease lapsed meanwhile (``Lease.epoch``)."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._rows: dict[int, tuple[OutboxRow, int]] = {}

    def wait(self, row: OutboxRow) -> None:
        self._rows[row.id] = (row, self._lease.epoch)

    def lapsed(self, rows: Sequence[OutboxRow]) -> tuple[list[OutboxRow], list[OutboxRow]]:
        """``rows`` about to go out: (those to send, those whose lease lapsed while they
        waited). Either way they wait no more."""
        if not self._rows:
            return list(rows), []
        kept: list[OutboxRow] = []
        lapsed: list[OutboxRow] = []
        for row in rows:
            waited = self._rows.pop(row.id, None)
            fresh = waited is None or waited[0] is not row or waited[1] == self._lease.epoch
            (kept if fresh else lapsed).append(row)
        return kept, lapsed

    def forget(self, rows: Sequence[OutboxRow]) -> None:
        """``rows`` wait no more (released otherwise)."""
        for row in rows:
            self._rows.pop(row.id, None)

    def forget_all(self) -> None:
        self._rows.clear()
