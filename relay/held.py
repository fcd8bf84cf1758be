"""The rows a relay holds (claimed, not yet settled) and where its next claim reads on. Pure: no
I/O. The claim store (``relay.db.claims``) asks it which rows a claim leaves out and tells it
what each claim found and each settle recorded, from its claim and settle threads.

A claim never takes a row this relay holds. Claiming never uses a "last published id" cursor:
ids are assigned at insert and committed in another order, so a cursor skips rows that commit
late. A claim reads on from where the last one stopped in the due order (a keyset position)
only while claims come back full; the first claim that comes back short resets it, and the
next one reads the due rows from the start again, leaving out every row held. A row that
committed late behind the position, or was left out (an earlier row of its key pending, its
exchange skipped), is so claimed once the relay has caught up. Reading every claim from the
start read the rows in flight again each time: 8.9 us of database CPU per row against 2.2 us
(``bench/claim_designs.py``).

A claim reading on leaves out only the held rows that lay beyond the position when a claim
from the start set it (every row claimed since lies behind the position): scanning every held
row (two windows' worth) for each claim was 7% of the relay's CPU (py-spy).

A settle forgets its rows once it has committed, not before: a claim that started meanwhile
must still leave them out, since its snapshot may predate the settle. So between the commit
and the forgetting, a row the settle made due again at once is, in the database, due and
beyond the position, and not among the rows a claim reading on leaves out: that claim finds
it. It is still held here, so ``claimed`` drops it (taking it again would hold it twice, and
the settle's forgetting would then lose track of the second hold), and sends the next claim
back to the start, which takes it once it is forgotten. A full claim reading on would
otherwise set the position past it, and under a sustained backlog (every claim full) the row
would wait until the backlog ended: a row made due again starved behind new rows.

Nor does a claim read on where the rows it passes may become due behind it: with per-key
ordering (``read_on=False``) a row whose key has an earlier row pending is left out, and once
that row is settled it lies behind the position. The claim store also sends a claim back to
the start at least every ``READ_ON_MAX_S`` (``relay.db.claims``), for a row that committed
late behind the position.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

# A row's place in the due order: (its due time as the driver returns it, its id).
Position = tuple[Any, int]


class HeldRows:
    """Thread-safe between one claim (or turn) at a time and the settles. ``read_on``: full
    claims read on from where they stopped (else every claim reads from the start)."""

    def __init__(self, read_on: bool = True) -> None:
        self._read_on = read_on
        self._lock = threading.Lock()
        self._held: dict[int, Any] = {}  # id -> its due time when claimed
        self._beyond: dict[int, Any] = {}  # held rows beyond the position when it was set
        # Where the next claim reads on from (None: from the start). Read and written by the
        # claims and turns only, which the store runs one at a time.
        self.after: Position | None = None

    def ids(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def left_out(self) -> list[int]:
        """The held rows the next claim (from ``after``) could meet: to leave out. Taken
        before the claim's snapshot: a row settled after this is gone, or due again, there."""
        after = self.after
        with self._lock:
            if after is None:
                return list(self._held)
            self._beyond = {
                i: at for i, at in self._beyond.items() if i in self._held and (at, i) > after
            }
            return list(self._beyond)

    def claimed(self, found: Sequence[Position], full: bool) -> set[int]:
        """A claim found the rows ``found`` (their positions, in due order); ``full``: it
        took as many as it asked for, so the next one reads on after the last. Returns the
        ids now held: those found less any still held (see the module docstring)."""
        position = found[-1] if full and found and self._read_on else None
        with self._lock:
            taken = {i for _, i in found if i not in self._held}
            if len(taken) < len(found):
                position = None  # a row due again, still held: the next claim takes it
            for at, i in found:
                if i in taken:
                    self._held[i] = at
            if position is not None and self.after is None:
                self._beyond = {i: at for i, at in self._held.items() if (at, i) > position}
        self.after = position
        return taken

    def settled(self, ids: Iterable[int]) -> None:
        """These rows' outcomes are committed: no longer held."""
        with self._lock:
            for i in ids:
                self._held.pop(i, None)

    def restart(self) -> None:
        """The next claim reads from the start (new buckets' due rows may lie behind)."""
        self.after = None
