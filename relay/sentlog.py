"""What this relay knows of the sent log's completeness, and what follows for its readiness.
Pure: looks and failures in, with the clock's readings; a verdict out. The database side (the
look, the rebuild) is ``relay.db.sentlog``.

While the sent log is incomplete (a crash or a failover emptied it on PostgreSQL), claims
look each id up in the runs and in the journal's unsealed tail themselves, or, where there is
no run yet, take no row; once it is recovering (the tail copied back, the runs answering for
the rest: ``relay.db.sentruns``) or complete, in the log and the runs, or the log alone. The
relay says what a look found only from a look made after the last database call of this
relay that failed: a crash of the database is first seen as such a failure, and the log it
emptied must not be called complete on the strength of a look made before it. And a relay
that cannot claim for longer than ``patience`` (a lease: what a rollout or an operator waits
for before taking a relay's silence as a fault) is not ready, saying why.
"""

from __future__ import annotations

import enum


class SentLogState(enum.Enum):
    """What the sent log's state row says (``relay.db.sentlog``)."""

    COMPLETE = "complete"
    RECOVERING = "recovering"  # claims go on, looking the runs up too
    INCOMPLETE = "incomplete"  # claims look up the tail too (nothing without a run)


class SentLogWatch:
    """``patience``: seconds the log may be not known complete before the relay is unready;
    ``now``: the clock's reading at the start (the relay does not know yet)."""

    __slots__ = ("failed_at", "patience", "seen", "unknown_since")

    def __init__(self, patience: float, now: float) -> None:
        self.patience = patience
        # Since when the log has not been known good for claims, or None: it is.
        self.unknown_since: float | None = now
        # What the last look found (None: no look yet, or a call failed since).
        self.seen: SentLogState | None = None
        # When a database call of this relay last failed.
        self.failed_at = float("-inf")

    @property
    def complete(self) -> bool:
        return self.seen is SentLogState.COMPLETE

    @property
    def recovering(self) -> bool:
        return self.seen is SentLogState.RECOVERING

    def looked(self, state: SentLogState, began: float, now: float) -> None:
        """A look that began at ``began`` found ``state``. A look that began before a call
        failed says nothing but an incomplete log: it may have read the state row before a
        crash emptied it."""
        if state is not SentLogState.INCOMPLETE and began <= self.failed_at:
            return
        self.seen = state
        if state is not SentLogState.INCOMPLETE:
            self.unknown_since = None
        elif self.unknown_since is None:
            self.unknown_since = now

    def failed(self, now: float) -> None:
        """A database call of this relay failed (a look, or any other): what the last look
        said may no longer hold."""
        self.failed_at = now
        self.seen = None
        if self.unknown_since is None:
            self.unknown_since = now

    def unready(self, now: float) -> str | None:
        """Why the relay is not ready on the log's account, or None."""
        if self.unknown_since is None or now - self.unknown_since <= self.patience:
            return None
        waited = now - self.unknown_since
        if self.seen is SentLogState.INCOMPLETE:
            return (
                f"the sent log has been incomplete for {waited:.0f} s (a crash or a failover "
                "emptied it): claims look each id up in the journal's tail until it is "
                "copied back, and take nothing where no run bounds that tail (see the "
                "sent_log_rebuild log lines)"
            )
        return (
            f"the sent log has not been known good for claims for {waited:.0f} s: no look "
            "has found it so since a database call failed (see the sent_log_failed and "
            "database_retry log lines)"
        )
