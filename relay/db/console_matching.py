"""Which parked rows a console change by filter takes (``relay.db.console_actions``): those
its filter selects that were parked by its bound, a chunk at a time, and how many it leaves
because they were parked after it. A cause is the rows' own column (migration 0018), a
range of the index of causes: a change by cause reads only its rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from relay.console_constants import CONSOLE_CHUNK_ROWS, CONSOLE_NAMED_IDS
from relay.console_records import LeftAfter, ParkedFilter
from relay.db.console import parked_where
from relay.db.console_counts import parked_after, parked_time
from relay.db.engine import transaction
from relay.db.schema import outbox


def matching(
    engine: sa.Engine, where: str, chosen: ParkedFilter, bound: Any
) -> Iterator[list[int]]:
    """The ids of the parked rows ``chosen`` selects that were parked by ``bound``, a chunk
    at a time (none empty), each chunk read after the one before was changed (keyset on
    the parking time, so that no row is read twice and none is missed, whether a chunk's
    rows were changed or not). ``where``: the database, as errors name it."""
    after: tuple[Any, int] | None = None
    read = [outbox.c.id, parked_time]
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
        yield [int(r.id) for r in rows]
        after = (rows[-1].next_attempt_at, int(rows[-1].id))


def parked_since(engine: sa.Engine, where: str, chosen: ParkedFilter, bound: Any) -> LeftAfter:
    """The parked rows ``chosen`` selects that were parked after ``bound`` (a change leaves
    them): few, those of the last seconds, counted, and the first named."""
    after = [*parked_where(chosen), parked_time > bound]
    first = sa.select(outbox.c.id).where(*after).order_by(outbox.c.id)
    with transaction(engine, "console count", where) as conn:
        rows = int(conn.execute(sa.select(sa.func.count()).where(*after)).scalar_one())
        named = conn.execute(first.limit(CONSOLE_NAMED_IDS)).all()
    return LeftAfter(rows, tuple(int(r.id) for r in named))
