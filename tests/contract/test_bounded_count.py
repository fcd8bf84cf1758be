"""bounded_count on every database: exact up to its bound; beyond it, the planner's estimate
where the database has one (PostgreSQL, MariaDB and MySQL), and the bound plus one on SQLite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from relay.db.due import due_now
from relay.db.outbox import OutboxWriter
from relay.db.schema import outbox
from relay.db.statements import bounded_count
from relay.records import NewMessage

ROWS = 3000
DUE = sa.select(outbox.c.id).where(due_now())


@pytest.fixture
def filled(database_url: str) -> Iterator[sa.Engine]:
    writer = OutboxWriter(database_url)
    writer.enqueue([NewMessage(b"x") for _ in range(ROWS)])
    if writer.engine.dialect.name == "postgresql":
        with writer.engine.connect() as conn:
            # Autovacuum's work in production; MySQL estimates a range by diving into its index.
            conn.execute(sa.text("ANALYZE outbox"))
            conn.commit()
    yield writer.engine
    writer.close()


def test_up_to_its_bound_the_count_is_exact(filled: sa.Engine) -> None:
    with filled.connect() as conn:
        assert bounded_count(conn, DUE, ROWS) == ROWS
        assert bounded_count(conn, DUE.where(outbox.c.id < 0), 10) == 0


def test_beyond_its_bound_the_count_is_the_planners_estimate(filled: sa.Engine) -> None:
    bound = 100
    with filled.connect() as conn:
        count = bounded_count(conn, DUE, bound)
    if filled.dialect.name == "sqlite":
        assert count == bound + 1
    else:
        assert ROWS / 2 <= count <= ROWS * 2
