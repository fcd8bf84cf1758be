"""Atomic writes' staging tables: which ones ``drop_abandoned_stages`` takes for leftovers.

A stage ``write_outbox`` holds (a lock on a connection of its own: PostgreSQL's advisory
lock, MySQL's named lock) is abandoned exactly when no one holds it, whatever its age; any
other stage once older than the limit."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from devtools.servers import MariaDBServer
from relay.db.sink import STAGE_PREFIX, OutboxSink

DAY = 24 * 3600.0


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
    mariadb.sql("SET GLOBAL wait_timeout = 1")
    try:
        with sink.held_stage() as name:
            time.sleep(2.5)
            mariadb.sql(f"SET GLOBAL wait_timeout = {usual}")
            other = OutboxSink(mariadb_url)
            try:
                assert other.drop_abandoned_stages(0) == []
            finally:
                other.close()
        assert stages(sink) == [name]
    finally:
        mariadb.sql(f"SET GLOBAL wait_timeout = {usual}")
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
