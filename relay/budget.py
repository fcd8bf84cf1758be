"""The byte budget: how many payload bytes the relay holds (claimed and not yet settled) against
``RELAY_MAX_INFLIGHT_BYTES``. Pure: sizes in, verdicts out.

A row is held from its claim until its settle is recorded, whether it waits for room in the
window, is on the wire, or awaits its confirm, and every claimed row is settled exactly once:
so the rows held never add up to more than the budget, but for a single row larger than the
whole of it, claimed when nothing else is held (``empty``: the claim's ``first_always``) and
published alone. A claim asks the database for due rows that fit ``room``; at the budget
(``spent``), or after a claim the budget cut short (``cut_short``), claims pause until settles
free room (``waits``): a claim with no more room than the last would find nothing new.
"""

from __future__ import annotations


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._cut_at: int | None = None  # the room of the last claim the budget cut short

    def hold(self, size: int) -> None:
        """``size`` bytes were claimed (or, negative, settled)."""
        self.held += size
        if self._cut_at is not None and self.room > self._cut_at:
            self._cut_at = None

    @property
    def room(self) -> int:
        """Bytes a claim may still take (negative past the budget: a big row went alone)."""
        return self.limit - self.held

    @property
    def spent(self) -> bool:
        return self.held >= self.limit

    @property
    def waits(self) -> bool:
        """Claims wait for a settle to free room: the budget is spent, or the last claim
        ended short by it and no room was freed since."""
        return self.spent or self._cut_at is not None

    @property
    def empty(self) -> bool:
        """Nothing is held: the next claim takes its first row whatever its size."""
        return not self.held

    def cut_short(self, rows: int, claimed: int, room: int) -> bool:
        """Did the budget, rather than the outbox running dry, end a short claim of ``rows``
        rows and ``claimed`` bytes, made with ``room`` bytes of room? Guessed without another
        query: one more row like these (having claimed none, of half the budget) would not
        have fit. Then the next claim waits for more room than this one had (``waits``),
        unless settles beside the claim freed it already: called once the claim is back and
        held, with the room it was made with. A wrong guess costs one empty claim, or a wait
        for the next settle."""
        typical = claimed / rows if rows else self.limit / 2
        cut = claimed + typical > room
        # Freed while the claim ran, the room ends the wait now: no later settle might (a
        # claim of nothing, its held rows all settled meanwhile, had claims wait for ever).
        if cut and self.room <= room - claimed:
            self._cut_at = room - claimed
        return cut
