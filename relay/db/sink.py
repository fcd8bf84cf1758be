"""The Spark writer's side of the outbox: each task's rows in, idempotently, fast.

Every row carries a deterministic ``message_id`` (``relay.identity``), unique in the outbox, so
a retried task, a speculative copy or a re-run inserts nothing twice: rows whose id is there
already are skipped. Two ways in:

- ``append`` (the default): one transaction per task, committed by the task. On PostgreSQL
  the chunks are ``COPY``-ed (binary) straight into the outbox in segments of
  ``SPARK_SEGMENT_BYTES``, each inside a savepoint (the fastest path PostgreSQL has); only a
  segment that hits an id already there (a retry, a re-run) is rolled back, and it and the
  rest of the task go through a temporary table and ``INSERT ... ON CONFLICT DO NOTHING``.
  At most ``SPARK_SAVEPOINTS_MAX`` savepoints per task. Nothing is left behind when a task
  dies: an open transaction and a temporary table vanish with the connection.
- ``stage`` / ``merge`` (``atomic``): tasks fill a staging table of the write's own; the
  driver's commit inserts it into the outbox in one transaction and drops it. The leftovers
  of a killed driver are found and dropped by ``drop_abandoned_stages`` (run by every atomic
  write and by ``relay purge``): ``write_outbox`` holds a lock of its stage on a connection
  of its own while it writes (``held_stage``; an advisory lock on PostgreSQL, a named lock on
  MySQL), so a stage whose lock no one holds is abandoned at once, and a live one is never
  touched; other stages (SQLite, ``format("outbox")`` without ``write_outbox``) are named
  with their creation time and dropped once older than a limit.

MySQL and MariaDB have no COPY: there the rows go in as multi-row INSERTs that skip ids
already in the outbox (``ON DUPLICATE KEY UPDATE`` of nothing; not ``INSERT IGNORE``, which
would also turn a value too long for its column into a truncated one).

A writer does nothing about the sent log: a message id acked before and written again goes
in like a new one, and the relay's claim drops it unpublished (``relay.db.claims``). The
counts ``append`` and ``merge`` return are the rows written to the outbox, those among them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
import sqlalchemy as sa
from psycopg import sql

from relay.constants import (
    SPARK_SAVEPOINTS_MAX,
    SPARK_SEGMENT_BYTES,
    SPARK_STAGE_LOCK_CLASS,
)
from relay.db.clock import epoch_seconds
from relay.db.dialects import of
from relay.db.engine import create_engine, db_errors, schema_missing, transaction
from relay.db.schema import WRITTEN_COLUMNS, outbox
from relay.errors import StoreError
from relay.redact import redact_url

# Staged beside them, not inserted: the row's place in the DataFrame (partition, row).
POSITION = "position"
STAGE_PREFIX = "outbox_stage_"
# outbox_stage_<creation, epoch seconds>_<12 random hex digits>[_held]
_STAGE_NAME = re.compile(rf"^{STAGE_PREFIX}(\d+)_([0-9a-f]{{12}})(_held)?$")
HELD = "_held"
# A staged row's position: the partition in the high bits, the row within it in the low ones
# (as Spark's monotonically_increasing_id).
PARTITION_SHIFT = 33
_INCOMING = "outbox_incoming"
# PostgreSQL's binary COPY stream: its header (signature, flags, extension length), its end.
COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
COPY_TRAILER = b"\xff\xff"


class Chunk(Protocol):
    """Rows a writer hands in, in WRITTEN_COLUMNS order (the Spark writer builds them from
    Arrow batches, relay.spark.rows)."""

    def __len__(self) -> int: ...

    def copy_data(self, first_position: int | None = None) -> memoryview:
        """The rows in PostgreSQL's binary COPY format, without the stream's signature and
        trailer; with ``first_position``, one more bigint field numbering them from it."""

    def tuples(self, first_position: int | None = None) -> list[tuple[Any, ...]]:
        """The rows as tuples; with ``first_position``, numbered from it in a last field."""


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
        self._dialect = of(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def check(self) -> None:
        """Fails clearly (SchemaMissingError) when the outbox table is not there. Every write
        starts with it, on the driver, before any task runs."""
        with transaction(self.engine, "checking the outbox table", self._where) as conn:
            if not sa.inspect(conn).has_table("outbox"):
                raise schema_missing(self._where)

    def append(self, chunks: Iterable[Chunk]) -> tuple[int, int]:
        """Insert the rows whose message_id is new, in one transaction, in order.
        Returns (rows given, rows inserted)."""
        counted = _Counted(chunks)
        with transaction(self.engine, "appending to the outbox", self._where) as conn:
            if self._dialect.copies_rows:
                inserted = _copy_new(conn, iter(counted))
            else:
                inserted = sum(_insert_new(conn, chunk) for chunk in counted)
        return counted.rows, inserted

    def create_stage(self) -> str:
        """A new, empty staging table (unlogged on PostgreSQL: a crashed write is re-run),
        named with the database's time: ``drop_abandoned_stages`` judges its age by the same
        clock, whichever hosts the driver and the purge run on."""
        with transaction(self.engine, "creating a staging table", self._where) as conn:
            name = _stage_name(conn)
            _staging_table(name, unlogged=self._dialect.copies_rows).create(conn)
        return name

    @contextmanager
    def held_stage(self) -> Iterator[str]:
        """A new staging table that is this process's until the block ends: its lock is held
        on a connection of its own meanwhile, and ``drop_abandoned_stages`` drops it as soon
        as no one holds it (the process died, its connection with it), whatever its age.
        SQLite has no such locks: there a plain ``create_stage``."""
        if not self._dialect.stage_locks:
            yield self.create_stage()
            return
        with db_errors("creating a held staging table", self._where), self.engine.connect() as conn:
            self._dialect.hold_stage_session(conn)
            name = _stage_name(conn, held=True)
            while not _try_stage_lock(conn, name):  # a live stage's lock number (PostgreSQL)
                name = _stage_name(conn, held=True)
            _staging_table(name, unlogged=self._dialect.copies_rows).create(conn)
            conn.commit()
            try:
                yield name
            finally:
                _unlock_stage(conn, name)
                conn.commit()

    def stage(self, name: str, chunks: Iterable[Chunk], partition: int) -> int:
        """Append one task's rows to staging table ``name``; returns how many."""
        counted = _Counted(chunks)

        def first(chunk: Chunk) -> int:
            """The position of ``chunk``'s first row (the latest chunk counted)."""
            return stage_position(partition, counted.rows - len(chunk))

        columns = (*WRITTEN_COLUMNS, POSITION)
        insert = sa.insert(_staging_table(name))
        with transaction(self.engine, f"staging rows into {name}", self._where) as conn:
            if self._dialect.copies_rows:
                _copy(conn, name, columns, (c.copy_data(first(c)) for c in counted))
            else:
                for chunk in counted:
                    conn.execute(insert, _params(columns, chunk.tuples(first(chunk))))
        return counted.rows

    def merge(self, name: str, *, keep_order: bool) -> int:
        """Insert the staged rows whose message_id is new, in one transaction, and drop the
        staging table. Returns the rows inserted.

        ``keep_order``: ids follow the staged positions, so that rows sharing an ordering key
        are published in the DataFrame's order. Otherwise message_id order: the unique index
        then fills from one end instead of at random places, which makes the merge faster.

        On PostgreSQL a plain INSERT is tried first, in a savepoint: it costs 20% less than
        one with ON CONFLICT (bench/spark_write.py). Only a merge that meets an id already
        there (a re-run; a task staged twice) is rolled back and done again ignoring them.
        """
        stage = _staging_table(name)
        what = f"merging staging table {name} into the outbox"
        with transaction(self.engine, what, self._where) as conn:
            if self._dialect.copies_rows:
                self._dialect.prepare_merge(conn)
                savepoint = conn.begin_nested()
                try:
                    inserted = _insert_staged(conn, stage, keep_order=keep_order, all_new=True)
                    savepoint.commit()
                except sa.exc.IntegrityError as exc:
                    if not isinstance(exc.orig, psycopg.errors.UniqueViolation):
                        raise
                    savepoint.rollback()
                    inserted = _insert_staged(conn, stage, keep_order=keep_order)
            else:
                inserted = _insert_staged(conn, stage, keep_order=keep_order)
            stage.drop(conn)
        return inserted

    def drop_stage(self, name: str) -> None:
        with transaction(self.engine, f"dropping staging table {name}", self._where) as conn:
            _staging_table(name).drop(conn, checkfirst=True)

    def drop_abandoned_stages(self, older_than_s: float) -> list[str]:
        """Drop the leftovers of writes whose driver was killed: held staging tables whose
        lock no one holds, and the others once created more than ``older_than_s`` seconds
        ago. Returns their names."""
        abandoned = []
        what = "dropping abandoned staging tables"
        with db_errors(what, self._where), self.engine.connect() as conn:
            cutoff = epoch_seconds(conn) - older_than_s
            names = sa.inspect(conn).get_table_names()
            conn.commit()
            for name in names:
                if (found := _STAGE_NAME.match(name)) is None:
                    continue
                if found[3] and self._dialect.stage_locks:
                    # Taking the lock proves its writer gone, and keeps another purge off
                    # while this one drops it.
                    if not _try_stage_lock(conn, name):
                        continue
                    try:
                        self.drop_stage(name)
                    finally:
                        _unlock_stage(conn, name)
                        conn.commit()
                elif int(found[1]) > cutoff:
                    continue
                else:
                    self.drop_stage(name)
                abandoned.append(name)
        return abandoned


def _stage_name(conn: sa.Connection, *, held: bool = False) -> str:
    """A new staging table's name, with the database's time: ``drop_abandoned_stages``
    judges its age by the same clock, whichever hosts the driver and the purge run on."""
    name = f"{STAGE_PREFIX}{int(epoch_seconds(conn))}_{uuid.uuid4().hex[:12]}"
    return name + HELD if held else name


def _try_stage_lock(conn: sa.Connection, name: str) -> bool:
    """Takes held staging table ``name``'s lock on ``conn`` if no one holds it; whether it
    did. A session's lock, not a transaction's: it stays until ``_unlock_stage`` or until the
    connection ends."""
    return of(conn).try_stage_lock(conn, name, _advisory_lock(name))


def _unlock_stage(conn: sa.Connection, name: str) -> None:
    of(conn).unlock_stage(conn, name, _advisory_lock(name))


def _advisory_lock(name: str) -> tuple[int, int]:
    """A held staging table's lock number, where locks are numbered (PostgreSQL's advisory
    locks): (class, the name's random part as
    a signed 32-bit number; 48 bits less, but a clash only makes ``held_stage`` draw another
    name, or keeps a leftover a while longer)."""
    found = _STAGE_NAME.match(name)
    assert found is not None, name
    return SPARK_STAGE_LOCK_CLASS, int(found[2][:8], 16) - 2**31


class _Counted:
    """``chunks``, counting their rows as they go by."""

    def __init__(self, chunks: Iterable[Chunk]) -> None:
        self._chunks = chunks
        self.rows = 0

    def __iter__(self) -> Iterator[Chunk]:
        for chunk in self._chunks:
            self.rows += len(chunk)
            yield chunk


def _copy_new(conn: sa.Connection, chunks: Iterator[Chunk]) -> int:
    """PostgreSQL: COPY ``chunks`` into the outbox, a segment of them per savepoint, until a
    segment meets an id already there or the savepoints run out; from then on through the
    temporary table. Returns the rows inserted."""
    inserted = 0
    for _ in range(SPARK_SAVEPOINTS_MAX):
        first = next(chunks, None)
        if first is None:
            return inserted
        segment = [first]
        savepoint = conn.begin_nested()
        try:
            _copy(conn, "outbox", WRITTEN_COLUMNS, _segment_data(segment, chunks))
        except psycopg.errors.UniqueViolation:
            savepoint.rollback()
            return inserted + _insert_through(conn, [*segment, *chunks])
        savepoint.commit()
        inserted += sum(map(len, segment))
    return inserted + _insert_through(conn, chunks)


def _segment_data(segment: list[Chunk], chunks: Iterator[Chunk]) -> Iterator[memoryview]:
    """The COPY data of ``segment`` (one chunk), then of further chunks taken from ``chunks``
    and added to ``segment`` until it holds SPARK_SEGMENT_BYTES."""
    size = 0
    for chunk in segment:
        data = chunk.copy_data()
        size += len(data)
        yield data
    while size < SPARK_SEGMENT_BYTES and (more := next(chunks, None)) is not None:
        segment.append(more)
        data = more.copy_data()
        size += len(data)
        yield data


def _insert_through(conn: sa.Connection, chunks: Iterable[Chunk]) -> int:
    """PostgreSQL: each chunk into the temporary table, then its new rows into the outbox."""
    incoming = _staging_table(_INCOMING, temporary=True)
    inserted = 0
    for n, chunk in enumerate(chunks):
        if n == 0:
            incoming.create(conn)
        conn.execute(sa.delete(incoming))
        _copy(conn, _INCOMING, (*WRITTEN_COLUMNS, POSITION), [chunk.copy_data(0)])
        inserted += _insert_staged(conn, incoming, keep_order=True)
    return inserted


def _insert_new(conn: sa.Connection, chunk: Chunk) -> int:
    """Where rows are not COPY-ed: the chunk's rows whose id is new."""
    result = conn.execute(
        of(conn).insert_skipping(outbox, ["message_id"]),
        _params(WRITTEN_COLUMNS, chunk.tuples()),
        execution_options={"preserve_rowcount": True},
    )
    return int(result.rowcount)


def _params(columns: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``rows`` as executemany parameters (SQLite has no COPY)."""
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _copy(
    conn: sa.Connection, table: str, columns: Sequence[str], data: Iterable[memoryview]
) -> None:
    """PostgreSQL's binary COPY FROM STDIN of ``data`` (rows in the binary format, ``Chunk``)
    into ``table``, on ``conn``'s transaction. A duplicate message_id raises psycopg's
    UniqueViolation (the caller's cue); other driver errors become StoreError."""
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            copy.write(COPY_SIGNATURE)
            for block in data:
                copy.write(block)
            copy.write(COPY_TRAILER)
    except psycopg.errors.UniqueViolation:
        raise
    except psycopg.Error as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise StoreError(f"COPY into {table} failed: {type(exc).__name__}: {first_line}") from exc


def _insert_staged(
    conn: sa.Connection, source: sa.Table, *, keep_order: bool, all_new: bool = False
) -> int:
    """Insert ``source``'s rows into the outbox, in order; those whose id is there already are
    left out, unless ``all_new`` says there are none (then one fails the statement)."""
    # SQLite parses "SELECT ... FROM stage ON CONFLICT" as a join unless the SELECT has a
    # WHERE clause (its documented upsert ambiguity): hence WHERE true.
    rows = (
        sa.select(*(source.c[c] for c in WRITTEN_COLUMNS))
        .where(sa.true())
        .order_by(source.c[POSITION] if keep_order else source.c.message_id)
    )
    selected = (list(WRITTEN_COLUMNS), rows)
    statement = of(conn).insert_skipping(outbox, ["message_id"], selected, all_new=all_new)
    result = conn.execute(statement, execution_options={"preserve_rowcount": True})
    return int(result.rowcount)
