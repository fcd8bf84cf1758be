"""Atomic writes' staging tables: which ones ``drop_abandoned_stages`` takes for leftovers.

A stage ``write_outbox`` holds (a lock on a connection of its own: PostgreSQL's advisory
lock, MySQL's named lock) is abandoned exactly when no one holds it, whatever its age; any
other stage once older than the limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from devtools.servers import MariaDBServer, wait_until
from relay.db.sink import STAGE_PREFIX, OutboxSink

DAY = 24 * 3600.0
# A hang guard, not a window: the server closes a connection idle for its wait_timeout (1 s
# here) by a timer of its own, which a busy machine delays a little.
DROPPED_S = 60.0
ALIVE = sa.text("SELECT count(*) FROM information_schema.processlist WHERE id = :id")


@pytest.fixture
def sink(database_url: str) -> Iterator[OutboxSink]:
    made = OutboxSink(database_url)
    yield made
    made.close()


def stages(sink: OutboxSink) -> list[str]:
    with sink.engine.connect() as conn:
        return [n for n in sa.inspect(conn).get_table_names() if n.startswith(STAGE_PREFIX)]


def test_a_stage_no_one_holds_is_dropped_once_older_than_the_limit(sink: OutboxSink) -> None:
    name = sink.create_stage()
    assert sink.drop_abandoned_stages(DAY) == []
    assert sink.drop_abandoned_stages(0) == [name]
    assert stages(sink) == []


@pytest.mark.databases("postgresql", "mariadb")
def test_a_held_stage_stays_while_held_and_goes_at_once_when_let_go(database_url: str) -> None:
    sink = OutboxSink(database_url)
    other = OutboxSink(database_url)  # another job's write, or `relay purge`
    try:
        with sink.held_stage() as name:
            assert other.drop_abandoned_stages(0) == []
            assert stages(sink) == [name]
        assert other.drop_abandoned_stages(DAY) == [name]
        assert stages(sink) == []
    finally:
        other.close()
        sink.close()


def test_a_held_stage_outlives_the_servers_idle_timeout(
    mariadb: MariaDBServer, mariadb_url: str
) -> None:
    """MySQL closes a connection idle for wait_timeout, and the stage's lock with it: a long
    write would see its stage dropped by the next purge."""
    usual = mariadb.sql("SELECT @@GLOBAL.wait_timeout").strip()
    sink = OutboxSink(mariadb_url)
    look, plain = sa.create_engine(mariadb_url), sa.create_engine(mariadb_url)
    looking = look.connect()  # before the change: the usual timeout, for the looks below
    mariadb.sql("SET GLOBAL wait_timeout = 1")
    try:
        with sink.held_stage() as name:
            # A connection with the server's timeout, idle from after the stage's last
            # statement: once the server has closed it, it would have closed the stage's too,
            # but for the stage's own session.
            with plain.connect() as idle:
                number = idle.execute(sa.select(sa.func.connection_id())).scalar_one()
            wait_until(
                lambda: not looking.execute(ALIVE, {"id": number}).scalar_one(),
                DROPPED_S,
                "the server to close an idle connection",
            )
            mariadb.sql(f"SET GLOBAL wait_timeout = {usual}")
            other = OutboxSink(mariadb_url)
            try:
                assert other.drop_abandoned_stages(0) == []
            finally:
                other.close()
        assert stages(sink) == [name]
    finally:
        mariadb.sql(f"SET GLOBAL wait_timeout = {usual}")
        looking.close()
        look.dispose()
        plain.dispose()
        sink.close()


def test_without_advisory_locks_a_held_stage_is_a_stage_like_any_other(
    sqlite_url: str,
) -> None:
    sink = OutboxSink(sqlite_url)
    try:
        with sink.held_stage() as name:
            assert sink.drop_abandoned_stages(DAY) == []
        assert sink.drop_abandoned_stages(0) == [name]
    finally:
        sink.close()
