"""relay.db.clock on both databases: the times it computes are the database's own, exact
to the offsets asked, and they compare rightly with the times already stored."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from relay.db.clock import database_time, epoch_seconds, seconds_since
from relay.db.engine import create_engine
from relay.db.schema import outbox

# SQLite's clock has milliseconds.
EXACT = 0.002


@pytest.fixture
def conn(database_url: str) -> Iterator[sa.Connection]:
    engine = create_engine(database_url)
    with engine.begin() as connection:
        yield connection
    engine.dispose()


@pytest.mark.parametrize("offset", [-86_400.0, -600.0, -1.5, 0.0, 0.25, 120.0, 604_800.0])
def test_an_offset_time_is_that_many_seconds_from_the_databases_now(
    conn: sa.Connection, offset: float
) -> None:
    # One statement: both sides read the same instant of the database's clock.
    moved = conn.execute(sa.select(seconds_since(database_time(offset)))).scalar_one()
    assert moved == pytest.approx(-offset, abs=EXACT)


@pytest.mark.parametrize("offset", [-3.0, 0.0, 3.0])
def test_a_bound_offset_works_as_a_literal_one(conn: sa.Connection, offset: float) -> None:
    bound = database_time(sa.bindparam("offset", type_=sa.Float()))
    moved = conn.execute(sa.select(seconds_since(bound)), {"offset": offset}).scalar_one()
    assert moved == pytest.approx(-offset, abs=EXACT)


def test_the_databases_clock_is_this_hosts_here(conn: sa.Connection) -> None:
    """The tests run on the database's host, unskewed: both clocks agree. The database read
    its clock after this host's first reading and before its second, give or take the
    database clock's resolution."""
    before = time.time()
    read = epoch_seconds(conn)
    after = time.time()
    assert before - EXACT <= read <= after + EXACT


def test_stored_times_compare_with_computed_ones(conn: sa.Connection) -> None:
    """A row's column defaults (SQLite: CURRENT_TIMESTAMP, whole seconds) and the times the
    relay writes order as times, on SQLite's text too."""
    conn.execute(sa.insert(outbox).values(message_id="m", payload=b"p"))
    conn.execute(sa.update(outbox).values(sent_at=database_time(0.5)))
    one = sa.select(sa.func.count()).select_from(outbox)
    assert conn.execute(one.where(outbox.c.created_at <= database_time())).scalar_one() == 1
    assert conn.execute(one.where(outbox.c.created_at > database_time(-5))).scalar_one() == 1
    assert conn.execute(one.where(outbox.c.sent_at > database_time())).scalar_one() == 1
    assert conn.execute(one.where(outbox.c.sent_at < database_time(1.0))).scalar_one() == 1
    assert conn.execute(sa.select(seconds_since(sa.null()))).scalar_one() is None
