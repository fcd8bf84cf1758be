"""Which parked rows a console change by filter takes (``relay.db.console_actions``): those
its filter selects that were parked by its bound, a chunk at a time, and how many it leaves
because they were parked after it.

A filter by cause is decided of each row read, by its reason's cause (``reason_cause``, the
overview's grouping), in Python: not by the reasons the overview's walk read, which stops
after its budget and would leave the rows of reasons it never reached; and not by the
cause's regular expressions rewritten in three databases' SQL. A change by cause so reads
every parked row its other fields select by its bound, a short transaction a chunk, and
changes those of its cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from relay.console_constants import CONSOLE_CHUNK_ROWS, CONSOLE_NAMED_IDS
from relay.console_records import LeftAfter, ParkedFilter
from relay.db.console import parked_where, reason_cause, reason_key
from relay.db.console_counts import parked_after, parked_time
from relay.db.engine import transaction
from relay.db.schema import outbox


def matching(
    engine: sa.Engine, where: str, chosen: ParkedFilter, bound: Any
) -> Iterator[list[int]]:
    """The ids of the parked rows ``chosen`` selects that were parked by ``bound``, a chunk
    at a time (none empty), each chunk read after the one before was changed (keyset on
    the parking time, so that no row is read twice and none is missed, whether a chunk's
    rows were changed or left parked as of another cause). ``where``: the database, as
    errors name it."""
    after: tuple[Any, int] | None = None
    read = [outbox.c.id, parked_time, *([reason_key.label("reason")] if chosen.cause else [])]
    while True:
        conditions = [*parked_where(chosen), parked_time <= bound]
        if after is not None:
            conditions.append(parked_after(after))
        statement = (
            sa.select(*read)
            .where(*conditions)
            .order_by(parked_time, outbox.c.id)
            .limit(CONSOLE_CHUNK_ROWS)
        )
        with transaction(engine, "console select", where) as conn:
            rows = conn.execute(statement).all()
        if not rows:
            return
        ids = [int(r.id) for r in rows if not chosen.cause or _of(chosen, r.reason)]
        if ids:
            yield ids
        after = (rows[-1].next_attempt_at, int(rows[-1].id))


def parked_since(engine: sa.Engine, where: str, chosen: ParkedFilter, bound: Any) -> LeftAfter:
    """The parked rows ``chosen`` selects that were parked after ``bound`` (a change leaves
    them): few, those of the last seconds, counted by reason when a cause is chosen, and
    the first named."""
    after = [*parked_where(chosen), parked_time > bound]
    first = sa.select(outbox.c.id).where(*after).order_by(outbox.c.id)
    with transaction(engine, "console count", where) as conn:
        if not chosen.cause:
            rows = int(conn.execute(sa.select(sa.func.count()).where(*after)).scalar_one())
            named = conn.execute(first.limit(CONSOLE_NAMED_IDS)).all()
            return LeftAfter(rows, tuple(int(r.id) for r in named))
        reasons = conn.execute(
            sa.select(reason_key, sa.func.count()).where(*after).group_by(reason_key)
        ).all()
        ours = {reason: int(n) for reason, n in reasons if _of(chosen, reason)}
        if not ours:
            return LeftAfter(0, ())
        # Only the reasons of the cause: no row of another is read again.
        named = conn.execute(first.where(reason_key.in_(ours)).limit(CONSOLE_NAMED_IDS)).all()
    return LeftAfter(sum(ours.values()), tuple(int(r.id) for r in named))


def _of(chosen: ParkedFilter, reason: str | None) -> bool:
    return reason_cause(reason) == chosen.cause
