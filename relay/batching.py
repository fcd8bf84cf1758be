"""Settle batching: the outcomes the broker's answers made, gathered until they are settled
together. Pure: a clock reading and the loop's state in, a decision out; the settle task
(``relay.settler``) writes them.

Each settle costs the database and the relay about as much whether it carries five outcomes or
five hundred (a round trip, a wake-up of a backend and of a worker thread, a plan), so at a
steady stream outcomes wait up to ``settle_linger`` after the first of them (their settle
time), and the first claim after that takes them along (``ride``: the settle and the claim in
one call to the database's thread). The settle task settles them on its own (``due``) when a
batch's worth waits (claims pause while a window's worth does), when the loop waits on the
settle (``pressed``: the byte budget is spent, or the relay stops), or when no claim took them
within two lingers of their settle time (claims come a linger apart, and a little later: the
relay stopped claiming). In a backlog nothing rides: settles run beside the claims, their round
trips overlapping.

The settle linger is the linger, but with per-key ordering none: a key's next row is claimed
only once its last is settled (lingering there too, a key advanced a row per two or three
lingers), and each settle asks for a claim (the settle task's ``ordering``).
"""

from __future__ import annotations

from relay.records import Settlement


class SettleBatching:
    def __init__(self, linger: float, ordering: bool, batch: int, now: float) -> None:
        self.linger = linger
        self.ordering = ordering
        self.settle_linger = 0.0 if ordering else linger
        self.batch = batch  # outcomes settled at once as soon as they wait
        self.waiting: list[Settlement] = []
        self._settle_at = now  # when those waiting are to be settled, by a claim or alone

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, now: float, settlements: list[Settlement], pressed: bool) -> bool:
        """Outcomes to settle; whether the settle task is to look now: the first of them sets
        their settle time (the task then waits for it), and any that make the settle ``due``
        are for it at once."""
        if not settlements:
            return False
        first = not self.waiting
        if first:
            self._settle_at = now + self.settle_linger
        self.waiting.extend(settlements)
        return first or self.due(now, pressed)

    def due(self, now: float, pressed: bool) -> bool:
        """Whether the settle task settles what waits now, rather than leaving it for a
        claim to take along. ``pressed``: the loop waits on the settle."""
        count = len(self.waiting)
        return bool(count) and (
            count >= self.batch or now >= self._settle_at + 2 * self.linger or pressed
        )

    def until(self, now: float) -> float | None:
        """Seconds until what waits is ``due`` unpressed; None: nothing waits."""
        if not self.waiting:
            return None
        return max(0.0, self._settle_at + 2 * self.linger - now)

    def ride(self, now: float, backlog: bool) -> list[Settlement]:
        """The outcomes the next claim takes along, taken: at a steady stream, those whose
        settle time has come; none in a ``backlog``."""
        if backlog or not self.waiting or now < self._settle_at:
            return []
        return self.take()

    def take(self) -> list[Settlement]:
        """Every outcome waiting, taken for a settle."""
        pending, self.waiting = self.waiting, []
        return pending

    def put_back(self, pending: list[Settlement]) -> None:
        """``pending``, taken, could not be settled (the relay stops, the database down past
        the drain's deadline): they wait again, first."""
        self.waiting[:0] = pending
