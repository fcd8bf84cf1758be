"""The Spark writer's side of the outbox: each task's rows in, idempotently, fast.

Every row carries a deterministic ``message_id`` (``relay.identity``), unique in the outbox, so
a retried task, a speculative copy or a re-run inserts nothing twice: rows whose id is there
already are skipped. Two ways in:

- ``append`` (the default): one transaction per task, committed by the task. On PostgreSQL
  each chunk is first ``COPY``-ed straight into the outbox inside a savepoint (the fastest
  path PostgreSQL has); only a chunk that hits an id already there (a retry, a re-run) is
  rolled back and goes through a temporary table and ``INSERT ... ON CONFLICT DO NOTHING``.
  Nothing is left behind when a task dies: an open transaction and a temporary table
  vanish with the connection.
- ``stage`` / ``merge`` (``atomic``): tasks fill a staging table of the write's own; the
  driver's commit inserts it into the outbox in one transaction and drops it. Staging
  tables are named with their creation time, so that the leftovers of a killed driver are
  found and dropped (``drop_abandoned_stages``, run by every atomic write and by
  ``relay purge``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from relay.constants import MERGE_WORK_MEM
from relay.db.clock import epoch_seconds
from relay.db.engine import create_engine, db_errors, schema_missing, transaction
from relay.db.schema import outbox
from relay.errors import StoreError
from relay.settings import redact_url

# The columns a writer fills; the database fills in the rest.
WRITTEN_COLUMNS = (
    "message_id",
    "exchange",
    "routing_key",
    "payload",
    "content_type",
    "headers",
    "ordering_key",
)
# Staged beside them, not inserted: the row's place in the DataFrame (partition, row).
POSITION = "position"
STAGE_PREFIX = "outbox_stage_"
_STAGE_NAME = re.compile(rf"^{STAGE_PREFIX}(\d+)_[0-9a-f]+$")
# A staged row's position: the partition in the high bits, the row within it in the low ones
# (as Spark's monotonically_increasing_id).
PARTITION_SHIFT = 33
_INCOMING = "outbox_incoming"


def _staging_table(name: str, *, unlogged: bool = False, temporary: bool = False) -> sa.Table:
    options: dict[str, Any] = {"postgresql_on_commit": "DROP"} if temporary else {}
    return sa.Table(
        name,
        sa.MetaData(),
        *(sa.Column(c, outbox.c[c].type, nullable=True) for c in WRITTEN_COLUMNS),
        sa.Column(POSITION, sa.BigInteger(), nullable=True),
        prefixes=["UNLOGGED"] if unlogged else ["TEMPORARY"] if temporary else [],
        **options,
    )


def stage_position(partition: int, row: int) -> int:
    return (partition << PARTITION_SHIFT) + row


class OutboxSink:
    """Writes rows into the outbox at ``url`` (durable sessions)."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self._where = redact_url(url)
        self._postgresql = self.engine.dialect.name == "postgresql"

    def close(self) -> None:
        self.engine.dispose()

    def check(self) -> None:
        """Fails clearly (SchemaMissingError) when the outbox table is not there. Every write
        starts with it, on the driver, before any task runs."""
        with transaction(self.engine, "checking the outbox table", self._where) as conn:
            if not sa.inspect(conn).has_table("outbox"):
                raise schema_missing(self._where)

    def append(self, chunks: Iterable[Sequence[tuple[Any, ...]]]) -> tuple[int, int]:
        """Insert the rows whose message_id is new, in one transaction, in order.
        Returns (rows given, rows inserted)."""
        rows = inserted = 0
        with transaction(self.engine, "appending to the outbox", self._where) as conn:
            incoming = False
            for chunk in chunks:
                rows += len(chunk)
                if not self._postgresql:
                    inserted += self._insert_new(conn, chunk)
                    continue
                savepoint = conn.begin_nested()
                try:
                    _copy(conn, "outbox", WRITTEN_COLUMNS, chunk)
                    savepoint.commit()
                    inserted += len(chunk)
                except psycopg.errors.UniqueViolation:
                    savepoint.rollback()
                    if not incoming:
                        _staging_table(_INCOMING, temporary=True).create(conn)
                        incoming = True
                    inserted += self._insert_through(conn, chunk)
            inserted -= _sent_before(conn)
        return rows, inserted

    def _insert_new(self, conn: sa.Connection, chunk: Sequence[tuple[Any, ...]]) -> int:
        statement = sqlite_insert(outbox).on_conflict_do_nothing(index_elements=["message_id"])
        result = conn.execute(
            statement,
            _params(WRITTEN_COLUMNS, chunk),
            execution_options={"preserve_rowcount": True},
        )
        return int(result.rowcount)

    def _insert_through(self, conn: sa.Connection, chunk: Sequence[tuple[Any, ...]]) -> int:
        """PostgreSQL: the chunk into the temporary table, then its new rows into the outbox."""
        incoming = _staging_table(_INCOMING)
        conn.execute(sa.delete(incoming))
        _copy(conn, _INCOMING, (*WRITTEN_COLUMNS, POSITION), [(*r, i) for i, r in enumerate(chunk)])
        return _insert_ignoring_duplicates(conn, incoming, keep_order=True)

    def create_stage(self) -> str:
        """A new, empty staging table (unlogged on PostgreSQL: a crashed write is re-run),
        named with the database's time: ``drop_abandoned_stages`` judges its age by the same
        clock, whichever hosts the driver and the purge run on."""
        with transaction(self.engine, "creating a staging table", self._where) as conn:
            name = f"{STAGE_PREFIX}{int(epoch_seconds(conn))}_{uuid.uuid4().hex[:12]}"
            _staging_table(name, unlogged=self._postgresql).create(conn)
        return name

    def stage(self, name: str, chunks: Iterable[Sequence[tuple[Any, ...]]], partition: int) -> int:
        """Append one task's rows to staging table ``name``; returns how many."""
        rows = 0
        columns = (*WRITTEN_COLUMNS, POSITION)
        insert = sa.insert(_staging_table(name))
        with transaction(self.engine, f"staging rows into {name}", self._where) as conn:
            for chunk in chunks:
                positioned = [
                    (*r, stage_position(partition, rows + i)) for i, r in enumerate(chunk)
                ]
                rows += len(chunk)
                if self._postgresql:
                    _copy(conn, name, columns, positioned)
                else:
                    conn.execute(insert, _params(columns, positioned))
        return rows

    def merge(self, name: str, *, keep_order: bool) -> int:
        """Insert the staged rows whose message_id is new, in one transaction, and drop the
        staging table. Returns the rows inserted.

        ``keep_order``: ids follow the staged positions, so that rows sharing an ordering key
        are published in the DataFrame's order. Otherwise message_id order: the unique index
        then fills from one end instead of at random places, which makes the merge faster.
        """
        stage = _staging_table(name)
        what = f"merging staging table {name} into the outbox"
        with transaction(self.engine, what, self._where) as conn:
            if self._postgresql:
                conn.execute(sa.text(f"SET LOCAL work_mem = '{MERGE_WORK_MEM}'"))
            inserted = _insert_ignoring_duplicates(conn, stage, keep_order=keep_order)
            inserted -= _sent_before(conn)
            stage.drop(conn)
        return inserted

    def drop_stage(self, name: str) -> None:
        with transaction(self.engine, f"dropping staging table {name}", self._where) as conn:
            _staging_table(name).drop(conn, checkfirst=True)

    def drop_abandoned_stages(self, older_than_s: float) -> list[str]:
        """Drop the staging tables created more than ``older_than_s`` seconds ago (the
        leftovers of writes whose driver was killed); returns their names."""
        with db_errors("listing staging tables", self._where), self.engine.connect() as conn:
            cutoff = epoch_seconds(conn) - older_than_s
            names = sa.inspect(conn).get_table_names()
        abandoned = [
            n for n in names if (m := _STAGE_NAME.match(n)) is not None and int(m[1]) <= cutoff
        ]
        for name in abandoned:
            self.drop_stage(name)
        return abandoned


def _sent_before(conn: sa.Connection) -> int:
    """Rows this transaction wrote that the dedupe trigger dropped again, their message id
    being in the sent log (migration 0004; PostgreSQL counts them in a setting of the
    transaction, SQLite never writes them)."""
    if conn.dialect.name != "postgresql":
        return 0
    dropped = "SELECT coalesce(nullif(current_setting('outbox.sent_before', true), ''), '0')"
    return int(conn.exec_driver_sql(dropped).scalar_one())


def _params(columns: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``rows`` as executemany parameters (SQLite has no COPY)."""
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _copy(
    conn: sa.Connection, table: str, columns: Sequence[str], rows: Iterable[tuple[Any, ...]]
) -> None:
    """PostgreSQL's COPY FROM STDIN of ``rows`` into ``table``, on ``conn``'s transaction.
    A duplicate message_id raises psycopg's UniqueViolation (the caller's cue); other driver
    errors become StoreError."""
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    except psycopg.errors.UniqueViolation:
        raise
    except psycopg.Error as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise StoreError(f"COPY into {table} failed: {type(exc).__name__}: {first_line}") from exc


def _insert_ignoring_duplicates(conn: sa.Connection, source: sa.Table, *, keep_order: bool) -> int:
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    # SQLite parses "SELECT ... FROM stage ON CONFLICT" as a join unless the SELECT has a
    # WHERE clause (its documented upsert ambiguity): hence WHERE true.
    rows = (
        sa.select(*(source.c[c] for c in WRITTEN_COLUMNS))
        .where(sa.true())
        .order_by(source.c[POSITION] if keep_order else source.c.message_id)
    )
    statement = (
        insert(outbox)
        .from_select(list(WRITTEN_COLUMNS), rows)
        .on_conflict_do_nothing(index_elements=["message_id"])
    )
    result = conn.execute(statement, execution_options={"preserve_rowcount": True})
    return int(result.rowcount)
