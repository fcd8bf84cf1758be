"""Atomic writes' staging tables: which ones ``drop_abandoned_stages`` takes for leftovers.

A stage ``write_outbox`` holds (PostgreSQL: an advisory lock on a connection of its own) is
abandoned exactly when no one holds it, whatever its age; any other stage once older than
the limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

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


def test_a_held_stage_stays_while_held_and_goes_at_once_when_let_go(postgresql_url: str) -> None:
    sink = OutboxSink(postgresql_url)
    other = OutboxSink(postgresql_url)  # another job's write, or `relay purge`
    try:
        with sink.held_stage() as name:
            assert other.drop_abandoned_stages(0) == []
            assert stages(sink) == [name]
        assert other.drop_abandoned_stages(DAY) == [name]
        assert stages(sink) == []
    finally:
        other.close()
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
