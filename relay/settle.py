"""Settle policy: what each confirm outcome does to its row (sent, retried later, parked)."""

from __future__ import annotations

from collections.abc import Iterable

from relay.backoff import Backoff
from relay.records import PARKED, PENDING, Outcome, RowChange, SettleBatch, Settlement


class SettlePolicy:
    """ACKED rows become sent. DUPLICATE rows (their message was sent before) are dropped.
    LOST rows are due again at once and keep their attempt count:
    a broker restart is nobody's fault. REJECTED rows cannot succeed as stored and are parked
    at once. Every other outcome counts an attempt and is retried after a back-off, until
    ``max_attempts`` failures park the row with the reason in ``last_error``. A row is a
    suspect after an outcome that says so; a LOST row keeps its suspicion, any other outcome
    clears it."""

    def __init__(self, max_attempts: int, backoff: Backoff) -> None:
        self.max_attempts = max_attempts
        self.backoff = backoff

    def batch(self, settlements: Iterable[Settlement]) -> SettleBatch:
        sent: list[int] = []
        changes: list[RowChange] = []
        duplicates: list[int] = []
        for s in settlements:
            if s.outcome is Outcome.ACKED:
                sent.append(s.row.id)
            elif s.outcome is Outcome.DUPLICATE:
                duplicates.append(s.row.id)
            else:
                changes.append(self.change(s))
        return SettleBatch(tuple(sent), tuple(changes), tuple(duplicates))

    def change(self, s: Settlement) -> RowChange:
        error = f"{s.outcome.value}: {s.detail}" if s.detail else s.outcome.value
        attempts = s.row.attempts
        if s.outcome is Outcome.LOST:
            return RowChange(s.row.id, PENDING, attempts, 0.0, error, s.suspect or s.row.suspect)
        attempts += 1
        if s.outcome is Outcome.REJECTED or attempts >= self.max_attempts:
            return RowChange(s.row.id, PARKED, attempts, 0.0, error)
        delay = self.backoff.delay(attempts)
        return RowChange(s.row.id, PENDING, attempts, delay, error, s.suspect)
