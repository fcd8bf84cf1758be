"""How long this relay may still publish the rows of its buckets. Pure: a clock reading in, a
verdict out.

A relay's buckets are leased to it by the database's clock (``relay.db.buckets``); once a
lease ends another relay may take the bucket and publish its rows. A relay that froze (a VM
migrated, a container throttled to nothing, a debugger) and woke after its lease ended would
otherwise publish rows it had claimed before: a row another relay had published since, after
which it had published the key's next row too (the queue saw A, B, A). So a row goes on the
wire only while the lease has more than ``margin`` seconds left, and the loop releases what
it claimed, unpublished, when it has not.

The lease's end is carried from the database's clock to this host's monotonic clock (which
neither NTP nor a skewed wall clock moves): each turn leases the buckets for ``seconds`` from
its statement, which ran after the turn was asked for, so the lease ends no sooner than
``seconds`` after that moment on the monotonic clock.

The margin is the confirm timeout: a row published in time is answered, or given up if the
broker falls quiet, before another relay may take it. (Twice that, the longest a row waits
while others are answered, left a relay in the fault suite, lease 5 s and confirm timeout
2 s, one second to renew in: under load its turns came later, and it paused five times in
20 s. With one timeout it has three: ``RELAY_LEASE`` must be more than twice the timeout.)
What keeps a key's rows in order is the check itself, made before every send: a row
published as a lease ends can only be published again by the next owner, never after a
later row of its key, which is claimed only once that row is settled.
"""

from __future__ import annotations

from collections.abc import Callable

# Why a row claimed for publishing is due again without having been published.
LEASE_SHORT = "claimed, not published: its bucket's lease was running out"


class Lease:
    def __init__(self, margin: float, clock: Callable[[], float]) -> None:
        self.margin = margin
        self._clock = clock
        self._until = float("-inf")  # nothing is leased before the first turn

    def renewed(self, until: float) -> None:
        """A turn leased the buckets until ``until`` on the clock (``RetryingStore.turn``)."""
        self._until = until

    def left(self) -> float:
        """Seconds of lease left (negative once it ended)."""
        return self._until - self._clock()

    def holds(self) -> bool:
        """A row may be published now: more than the margin is left."""
        return self.left() > self.margin
