"""What this relay knows of the sent log's completeness, and what follows for its readiness.
Pure: looks and failures in, with the clock's readings; a verdict out. The database side (the
look, the rebuild) is ``relay.db.sentlog``.

Claims take no row while the sent log is not complete (a crash or a failover emptied it on
PostgreSQL). The relay says the log complete (``relay_sent_log_complete`` 1) only from a
look that found it so, made after the last database call of this relay that failed: a crash
of the database is first seen as such a failure, and the log it emptied must not be called
complete on the strength of a look made before it. And a relay that cannot claim for longer
than ``patience`` (a lease: what a rollout or an operator waits for before taking a relay's
silence as a fault) is not ready, saying why.
"""

from __future__ import annotations


class SentLogWatch:
    """``patience``: seconds the log may be not known complete before the relay is unready;
    ``now``: the clock's reading at the start (the relay does not know yet)."""

    __slots__ = ("failed_at", "incomplete", "patience", "unknown_since")

    def __init__(self, patience: float, now: float) -> None:
        self.patience = patience
        # Since when the log has not been known complete, or None: it is.
        self.unknown_since: float | None = now
        # The last look found it incomplete (being rebuilt), not only unknown.
        self.incomplete = False
        # When a database call of this relay last failed.
        self.failed_at = float("-inf")

    @property
    def complete(self) -> bool:
        return self.unknown_since is None

    def looked(self, complete: bool, began: float, now: float) -> None:
        """A look that began at ``began`` answered: the log is ``complete``, or not. A look
        that found it complete but began before a call failed says nothing: it may have read
        the state row before a crash emptied it."""
        if complete and began <= self.failed_at:
            return
        self.incomplete = not complete
        if complete:
            self.unknown_since = None
        elif self.unknown_since is None:
            self.unknown_since = now

    def failed(self, now: float) -> None:
        """A database call of this relay failed (a look, or any other): what the last look
        said may no longer hold."""
        self.failed_at = now
        if self.unknown_since is None:
            self.unknown_since = now

    def unready(self, now: float) -> str | None:
        """Why the relay is not ready on the log's account, or None."""
        if self.unknown_since is None or now - self.unknown_since <= self.patience:
            return None
        waited = now - self.unknown_since
        if self.incomplete:
            return (
                f"the sent log has been incomplete for {waited:.0f} s (a crash or a failover "
                "emptied it): claiming nothing until it is rebuilt from its journal (see the "
                "sent_log_rebuild log lines)"
            )
        return (
            f"the sent log has not been known complete for {waited:.0f} s: its look fails "
            "(see the sent_log_failed log lines)"
        )
