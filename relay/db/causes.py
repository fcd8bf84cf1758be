"""Parked rows given their cause (``outbox.cause``, ``relay.causes.stored_cause``) where they
have none: rows parked by relays of a release before migration 0018, which write no cause.
Each relay of this release sorts them, a chunk at a time (``relay.daemon``); until then the
console lists them as one line of rows not yet sorted.
"""

from __future__ import annotations

import sqlalchemy as sa

from relay.causes import stored_cause
from relay.db.engine import create_engine, transaction
from relay.db.schema import outbox
from relay.records import PARKED
from relay.redact import redact_url

# A parked row without a cause: a range of the console's index by cause, where there is one.
_WITHOUT_CAUSE = sa.and_(outbox.c.status == PARKED, outbox.c.cause.is_(None))
# A row's cause written only while it is as it was read: still parked, still without a
# cause, with the same error (a relay of the release before may have parked it again since
# with another).
_SORTED = (
    sa.update(outbox)
    .where(
        outbox.c.id == sa.bindparam("row_id"),
        _WITHOUT_CAUSE,
        outbox.c.last_error.is_not_distinct_from(sa.bindparam("was")),
    )
    .values(cause=sa.bindparam("sorted"))
)


class CauseSorter:
    """Gives parked rows without a cause theirs."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, relay_session=True)
        self._where = redact_url(url)

    def sort(self, chunk: int) -> int:
        """Give at most ``chunk`` parked rows without a cause theirs, in one short
        transaction. Returns how many were read: fewer than ``chunk``, none is left."""
        with transaction(self.engine, "sorting parked rows by cause", self._where) as conn:
            rows = conn.execute(
                sa.select(outbox.c.id, outbox.c.last_error).where(_WITHOUT_CAUSE).limit(chunk)
            ).all()
            if rows:
                conn.execute(
                    _SORTED,
                    [
                        {
                            "row_id": r.id,
                            "was": r.last_error,
                            "sorted": stored_cause(r.last_error or ""),
                        }
                        for r in rows
                    ],
                )
        return len(rows)

    def close(self) -> None:
        self.engine.dispose()
