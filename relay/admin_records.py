"""What the admin commands read and select (``relay status``, ``relay replay``): records of
the admin store (``relay.db.outbox.OutboxAdmin``). Here, beside ``relay.records`` and below
both, not in ``relay.admin``: the database fills and reads them, and imports nothing of the
admin commands (``tests/unit/test_layers.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """What ``relay status`` reports."""

    # Messages by status, every status present; "sent" counts the sent log and the sent rows
    # kept whole. Counted up to BACKLOG_EXACT_ROWS each, estimated beyond.
    counts: dict[str, int]
    due: int
    oldest_due_age: float
    relays: dict[str, int]  # relay name -> buckets it owns under a live lease
    parked_reasons: list[tuple[str, int]]  # (last error, rows), most rows first
    # Pending rows that failed before, as (exchange, last error, rows), most rows first: a
    # broken destination's rows show here until they are parked.
    retrying: list[tuple[str, str, int]]
    recent: RecentSent
    # Rows the relays dropped unpublished, their message id being in the sent log (written
    # again after it was sent), since the outbox was made.
    duplicates: int


@dataclass(frozen=True, slots=True)
class RecentSent:
    """The messages sent in the last ``RECENT_SENT_S`` seconds, and their latency from
    created to sent (seconds; 0 when none)."""

    messages: int = 0
    latency_mean: float = 0.0
    latency_max: float = 0.0


@dataclass(frozen=True, slots=True)
class Selection:
    """Which parked (or sent) rows ``relay replay`` moves back to pending; the fields narrow
    together."""

    ids: tuple[int, ...] = ()
    first_id: int | None = None
    last_id: int | None = None
    reason: str | None = None  # a part of last_error
    exchange: str | None = None
    older_than: float | None = None  # seconds since created, by the database's clock
    sent_since: datetime | None = None  # sent at or after (sent rows only)
    sent_until: datetime | None = None  # sent before (sent rows only)

    def __bool__(self) -> bool:
        return any(getattr(self, name) not in ((), None) for name in self.__slots__)
