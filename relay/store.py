"""The outbox store: claim due rows under a lease, settle them, and the few admin writes.

The only module that talks SQL at run time. It is synchronous on purpose: the relay calls it
from a worker thread (``asyncio.to_thread``) so that pika's I/O loop on the event-loop thread
keeps turning while a query runs, and both PostgreSQL (psycopg) and SQLite (sqlite3) work
through one tested code path instead of two async drivers.

Claiming never uses a "last published id" cursor: ids are assigned at insert and committed
in another order, so a cursor skips rows that commit late. A claim instead takes due pending
rows (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so concurrent relays take disjoint rows) and
pushes their ``next_attempt_at`` one lease ahead, in one committed statement. No transaction
stays open while the broker is asked; a relay that dies leaves rows that are due again when
the lease runs out.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, Protocol

import psycopg
import psycopg.sql
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from relay.errors import InputError, SchemaMissingError, StoreError
from relay.records import (
    PARKED,
    PENDING,
    SENT,
    STATUSES,
    BacklogStats,
    NewMessage,
    OutboxRow,
    OutboxStatus,
    Selection,
    SettleBatch,
)
from relay.schema import NOTIFY_CHANNEL, outbox
from relay.settings import redact_url

log = logging.getLogger(__name__)

_ROW_COLUMNS = (
    outbox.c.id,
    outbox.c.message_id,
    outbox.c.exchange,
    outbox.c.routing_key,
    outbox.c.payload,
    outbox.c.content_type,
    outbox.c.headers,
    outbox.c.created_at,
    outbox.c.attempts,
    outbox.c.last_error,
)
# Keeps every statement's parameter count far below SQLite's and PostgreSQL's limits.
_CHUNK = 1000


class Store(Protocol):
    def claim(self, limit: int, now: datetime) -> list[OutboxRow]: ...

    def settle(self, batch: SettleBatch, now: datetime) -> None: ...

    def backlog(self, now: datetime) -> BacklogStats: ...

    def enqueue(self, messages: Sequence[NewMessage], now: datetime) -> list[str]: ...

    def close(self) -> None: ...


def create_engine(url: str, *, relay_session: bool = True) -> sa.Engine:
    """An engine for ``url``; with ``relay_session``, with the session settings the relay's
    own claims and settles want (not for migrations or writers)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise StoreError(f"database URL {redact_url(url)!r} is not valid: {exc}") from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "postgresql" and not relay_session:
        return sa.create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": 5})
    if parsed.get_backend_name() == "postgresql":
        # statement_timeout: a claim must not wait forever behind a lock (LOCK TABLE, a stuck
        # migration); it fails, is logged, and is retried after a back-off.
        # enable_bitmapscan=off: right after a bulk load (a Spark job's million rows) the
        # table's statistics still say "few pending rows", and the planner then picks a
        # bitmap scan of *every* due row plus a sort for each claim of 500 (measured: 50 ms
        # instead of 9 ms at 60k due rows). Without bitmap scans the claim walks the partial
        # index in order and stops at its LIMIT, whatever the statistics say; the relay's
        # other statements are primary-key lookups, which this does not affect.
        # synchronous_commit=off: a claim or settle lost in a database crash only makes rows
        # due again, so they are published twice, never lost; not waiting for the WAL flush
        # takes a disk flush off every batch. Writes that must be durable (enqueue) turn it
        # back on for their transaction.
        options = "-c statement_timeout=30000 -c enable_bitmapscan=off -c synchronous_commit=off"
        connect_args = {
            "connect_timeout": 5,
            "application_name": "outbox-relay",
            "options": options,
        }
        return sa.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    engine = sa.create_engine(parsed, connect_args={"timeout": 30})
    sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets the relay read while a writer (Spark, enqueue) holds the write lock; the
    # busy timeout makes writers queue instead of failing with "database is locked".
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


class SqlStore:
    def __init__(self, url: str, owner: str, lease: float, *, ordered: bool = False) -> None:
        """``ordered``: claim a row with an ordering key only when no earlier row with the
        same key is pending (claimed or not), so that each key's rows are published and
        confirmed in id order, across retries, restarts and relays. Parked rows do not
        block their key: a row that cannot be sent must not stop the ones after it."""
        self.engine = create_engine(url)
        self.owner = owner
        self.lease = timedelta(seconds=lease)
        self.ordered = ordered
        self._where = redact_url(url)
        # SQLite has one writer at a time and makes others wait by sleeping in growing steps;
        # the relay's own claim and settle threads queue on a lock instead, at once.
        sqlite = self.engine.dialect.name == "sqlite"
        self._writing: AbstractContextManager[Any] = threading.Lock() if sqlite else nullcontext()

    def claim(self, limit: int, now: datetime) -> list[OutboxRow]:
        due = (
            sa.select(outbox.c.id)
            .where(outbox.c.status == PENDING, outbox.c.next_attempt_at <= now)
            .order_by(outbox.c.next_attempt_at, outbox.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        if self.ordered:
            earlier = outbox.alias("earlier")
            due = due.where(
                sa.or_(
                    outbox.c.ordering_key.is_(None),
                    ~sa.exists().where(
                        earlier.c.ordering_key == outbox.c.ordering_key,
                        earlier.c.status == PENDING,
                        earlier.c.id < outbox.c.id,
                    ),
                )
            )
        stmt = (
            sa.update(outbox)
            .where(outbox.c.id.in_(due.scalar_subquery()))
            .values(next_attempt_at=now + self.lease, lease_owner=self.owner)
            .returning(*_ROW_COLUMNS)
        )
        with _db_errors("claim", self._where), self._writing, self.engine.begin() as conn:
            rows = [OutboxRow(**r._mapping) for r in conn.execute(stmt)]
        rows.sort(key=lambda r: r.id)
        return rows

    def settle(self, batch: SettleBatch, now: datetime) -> None:
        if not batch:
            return
        sent = (
            sa.update(outbox)
            .where(outbox.c.id.in_(sa.bindparam("ids", expanding=True)))
            .where(outbox.c.status == PENDING)
            .values(status=SENT, sent_at=now, lease_owner=None)
        )
        # A failure is written only while the row is still ours: if our lease ran out and
        # another relay holds it now, its outcome decides. An ack is written regardless:
        # it proves delivery whoever holds the row.
        changed = (
            sa.update(outbox)
            .where(
                outbox.c.id == sa.bindparam("row_id"),
                outbox.c.status == PENDING,
                outbox.c.lease_owner == self.owner,
            )
            .values(
                status=sa.bindparam("new_status"),
                attempts=sa.bindparam("new_attempts"),
                next_attempt_at=sa.bindparam("new_next_attempt_at"),
                last_error=sa.bindparam("new_last_error"),
                lease_owner=None,
            )
        )
        with _db_errors("settle", self._where), self._writing, self.engine.begin() as conn:
            for i in range(0, len(batch.sent), _CHUNK):
                conn.execute(sent, {"ids": list(batch.sent[i : i + _CHUNK])})
            if batch.changes:
                conn.execute(
                    changed,
                    [
                        {
                            "row_id": c.id,
                            "new_status": c.status,
                            "new_attempts": c.attempts,
                            "new_next_attempt_at": c.next_attempt_at,
                            "new_last_error": c.last_error[:2000],
                        }
                        for c in batch.changes
                    ],
                )

    @property
    def notifies(self) -> bool:
        """The database announces new rows (PostgreSQL's NOTIFY, raised by a trigger)."""
        return self.engine.dialect.name == "postgresql"

    def listen(self, wake: Callable[[], None], stopped: threading.Event) -> None:
        """Call ``wake`` whenever rows were inserted, until ``stopped`` is set (checked every
        second). Blocks: run it in a thread. A lost connection raises StoreError; the
        caller reconnects, and its polling covers the gap."""
        conninfo = self.engine.url.set(drivername="postgresql").render_as_string(False)
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                conn.execute(
                    psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(NOTIFY_CHANNEL))
                )
                wake()  # rows may have come while we were not listening
                while not stopped.is_set():
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        wake()
        except psycopg.Error as exc:
            raise StoreError(f"listen on {self._where} failed: {exc}") from exc

    def backlog(self, now: datetime) -> BacklogStats:
        stmt = sa.select(sa.func.count(), sa.func.min(outbox.c.next_attempt_at)).where(
            outbox.c.status == PENDING, outbox.c.next_attempt_at <= now
        )
        with _db_errors("backlog", self._where), self.engine.connect() as conn:
            count, oldest = conn.execute(stmt).one()
        age = (now - oldest).total_seconds() if oldest is not None else 0.0
        return BacklogStats(due=int(count), oldest_due_age=max(0.0, age))

    def enqueue(self, messages: Sequence[NewMessage], now: datetime) -> list[str]:
        ids = [m.message_id or str(uuid.uuid4()) for m in messages]
        rows = [
            {
                "message_id": message_id,
                "exchange": m.exchange,
                "routing_key": m.routing_key,
                "payload": m.payload,
                "content_type": m.content_type,
                "headers": m.headers,
                "ordering_key": m.ordering_key,
                "created_at": now,
                "next_attempt_at": now,
            }
            for m, message_id in zip(messages, ids, strict=True)
        ]
        if rows:
            with _db_errors("enqueue", self._where), self.engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.text("SET LOCAL synchronous_commit = on"))
                conn.execute(sa.insert(outbox), rows)
        return ids

    def close(self) -> None:
        self.engine.dispose()


@contextmanager
def _db_errors(what: str, where: str) -> Iterator[None]:
    """Turn the driver's errors into StoreError (chained), naming the call and the database."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        if _missing_table(exc):
            raise _schema_missing(where) from exc
        first_line = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
        raise StoreError(
            f"{what} on {where} failed: {type(exc.orig).__name__}: {first_line}"
        ) from exc
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"{what} on {where} failed: {exc}") from exc


class OutboxAdmin:
    """The operator's reads and writes (``relay status``, ``replay``, ``purge``). Each write
    is short: replay changes only parked rows, and purge deletes sent rows in chunks of its
    own transactions, so neither holds locks that would stall the relays."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, relay_session=False)
        self._where = redact_url(url)

    def status(self, now: datetime, reasons: int = 10) -> OutboxStatus:
        pending = outbox.c.status == PENDING
        due = sa.and_(pending, outbox.c.next_attempt_at <= now)
        totals = sa.select(
            *(sa.func.count().filter(outbox.c.status == s) for s in STATUSES),
            sa.func.count().filter(due),
            sa.func.min(outbox.c.next_attempt_at).filter(due),
            sa.func.count().filter(pending, outbox.c.lease_owner.is_not(None),
                                   outbox.c.next_attempt_at > now),
        )  # fmt: skip
        by_reason = (
            sa.select(outbox.c.last_error, sa.func.count().label("rows"))
            .where(outbox.c.status == PARKED)
            .group_by(outbox.c.last_error)
            .order_by(sa.desc("rows"), outbox.c.last_error)
            .limit(reasons)
        )
        with _db_errors("status", self._where), self.engine.connect() as conn:
            *counts, due_rows, oldest, leased = conn.execute(totals).one()
            parked = [(r.last_error or "", int(r.rows)) for r in conn.execute(by_reason)]
        age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
        return OutboxStatus(dict(zip(STATUSES, map(int, counts), strict=True)), int(due_rows),
                            age, int(leased), parked)  # fmt: skip

    def replay(self, selection: Selection, now: datetime, dry_run: bool) -> list[OutboxRow]:
        """Move the selected parked rows back to pending, due now, with their attempts reset;
        returns them (as they were) in id order. With ``dry_run``, changes nothing."""
        where = [outbox.c.status == PARKED]
        if selection.ids:
            where.append(outbox.c.id.in_(selection.ids))
        if selection.first_id is not None:
            where.append(outbox.c.id >= selection.first_id)
        if selection.last_id is not None:
            where.append(outbox.c.id <= selection.last_id)
        if selection.reason:
            where.append(outbox.c.last_error.contains(selection.reason, autoescape=True))
        if selection.exchange is not None:
            where.append(outbox.c.exchange == selection.exchange)
        if selection.created_before is not None:
            where.append(outbox.c.created_at < selection.created_before)
        chosen = sa.select(*_ROW_COLUMNS).where(*where).order_by(outbox.c.id)
        with _db_errors("replay", self._where), self.engine.begin() as conn:
            rows = [OutboxRow(**r._mapping) for r in conn.execute(chosen)]
            replay = (
                sa.update(outbox)
                .where(outbox.c.status == PARKED)
                .where(outbox.c.id.in_(sa.bindparam("ids", expanding=True)))
                .values(status=PENDING, attempts=0, next_attempt_at=now, lease_owner=None)
            )
            for i in range(0, 0 if dry_run else len(rows), _CHUNK):
                conn.execute(replay, {"ids": [r.id for r in rows[i : i + _CHUNK]]})
        return rows

    def purge(
        self, sent_before: datetime, chunk: int, progress: Callable[[int], None] | None = None
    ) -> int:
        """Delete sent rows sent before ``sent_before``, ``chunk`` rows per transaction;
        returns the rows deleted."""
        deleted, after = 0, 0
        while True:
            count, after = self.purge_chunk(sent_before, chunk, after)
            deleted += count
            if count < chunk:
                return deleted
            if progress is not None:
                progress(deleted)

    def purge_chunk(self, sent_before: datetime, chunk: int, after: int = 0) -> tuple[int, int]:
        """One transaction of ``purge``: up to ``chunk`` rows with ids above ``after``.
        Walking the primary key keeps every chunk as cheap as the first. Returns (rows
        deleted, the id to continue after)."""
        ids = (
            sa.select(outbox.c.id)
            .where(outbox.c.id > after, outbox.c.status == SENT, outbox.c.sent_at < sent_before)
            .order_by(outbox.c.id)
            .limit(chunk)
        )
        with _db_errors("purge", self._where), self.engine.begin() as conn:
            batch = list(conn.scalars(ids))
            if batch:
                conn.execute(sa.delete(outbox).where(outbox.c.id.in_(batch),
                                                     outbox.c.status == SENT))  # fmt: skip
        return len(batch), batch[-1] if batch else after

    def close(self) -> None:
        self.engine.dispose()


def _schema_missing(where: str) -> SchemaMissingError:
    return SchemaMissingError(f"the outbox table does not exist in {where}: run `relay migrate`")


@contextmanager
def _one_off(url: str, what: str) -> Iterator[sa.Connection]:
    """One transaction on a short-lived engine with plain (durable) sessions, for the
    commands that run once (migrate, the batch writer's staging steps)."""
    engine = create_engine(url, relay_session=False)
    try:
        with _db_errors(what, redact_url(url)), engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def _missing_table(exc: sa.exc.DBAPIError) -> bool:
    return getattr(exc.orig, "sqlstate", None) == "42P01" or "no such table" in str(exc.orig)


def migrate(url: str, revision: str = "head", *, downgrade: bool = False) -> None:
    """Upgrade (or downgrade) the database to ``revision`` with the migrations shipped in
    the package."""
    config = Config()
    config.set_main_option("script_location", str(resources.files("relay.migrations")))
    with _one_off(url, "migrate") as conn:
        config.attributes["connection"] = conn
        (command.downgrade if downgrade else command.upgrade)(config, revision)


# Columns a batch writer (the Spark writer) stages; the database fills in the rest.
STAGED_COLUMNS = (
    "message_id", "exchange", "routing_key", "payload", "content_type", "headers", "ordering_key"
)  # fmt: skip
# Staged beside them, not inserted: the row's place in the writer's input (see merge_staging).
STAGED_POSITION = "position"


def _staging_table(name: str, unlogged: bool = False) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        *(sa.Column(c, outbox.c[c].type, nullable=True) for c in STAGED_COLUMNS),
        sa.Column(STAGED_POSITION, sa.BigInteger(), nullable=True),
        prefixes=["UNLOGGED"] if unlogged else [],
    )


def create_staging(url: str, name: str) -> None:
    """An empty staging table for one batch write; fails clearly if the outbox is missing."""
    with _one_off(url, f"creating staging table {name}") as conn:
        if not sa.inspect(conn).has_table("outbox"):
            raise _schema_missing(redact_url(url))
        # Unlogged on PostgreSQL: staged rows need no crash safety (a crashed write is
        # re-run), and skipping the WAL makes the staging write cheaper than a plain append.
        _staging_table(name, unlogged=conn.dialect.name == "postgresql").create(conn)


def merge_staging(url: str, name: str, *, keep_order: bool = False) -> tuple[int, int]:
    """Insert the staged rows whose message_id is not in the outbox yet, in one transaction,
    then drop the staging table. Returns (rows staged, rows inserted).

    Task retries and speculative tasks may have staged a row twice, and a re-run of the job
    stages rows the outbox already has: both are skipped by message_id, the idempotency key.
    A null payload aborts the whole merge: nothing is inserted.

    ``keep_order``: rows get their ids in staged position order, so that rows sharing an
    ordering key are published in the writer's order. Otherwise in message_id order: the
    unique index then fills from one end instead of at random places, which makes the
    merge faster (a million rows, one core: about 8 s instead of 10.5 s here).
    """
    stage = _staging_table(name)
    is_null = sa.or_(stage.c.payload.is_(None), stage.c.message_id.is_(None))
    with _one_off(url, f"merging staging table {name} into the outbox") as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SET LOCAL synchronous_commit = on"))
            # A larger sort budget: a big batch sorts in a few long runs (a million rows still
            # spill to a temporary file), not in many short ones of the 4 MB default.
            conn.execute(sa.text("SET LOCAL work_mem = '256MB'"))
        # One scan of the staging table for both numbers.
        staged, nulls = conn.execute(
            sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(sa.case((is_null, 1), else_=0)), 0)
            )
        ).one()
        if nulls:
            raise InputError(f"{nulls} rows have a null payload (or key): nothing was written")
        # SQLite parses "SELECT ... FROM stage ON CONFLICT" as a join unless the SELECT
        # has a WHERE clause (its documented upsert ambiguity): hence WHERE true.
        staged_rows = (
            sa.select(*(stage.c[c] for c in STAGED_COLUMNS))
            .where(sa.true())
            .order_by(stage.c[STAGED_POSITION] if keep_order else stage.c.message_id)
        )
        insert = _insert_ignoring_duplicates(conn.dialect.name).from_select(
            list(STAGED_COLUMNS), staged_rows
        )
        inserted = conn.execute(insert, execution_options={"preserve_rowcount": True}).rowcount
        stage.drop(conn)
    return int(staged), int(inserted)


def drop_staging(url: str, name: str) -> None:
    with _one_off(url, f"dropping staging table {name}") as conn:
        _staging_table(name).drop(conn, checkfirst=True)


def _insert_ignoring_duplicates(dialect: str) -> Any:
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    return insert(outbox).on_conflict_do_nothing(index_elements=["message_id"])


def jdbc_target(url: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties for a database URL (for Spark's JDBC writer)."""
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        host = parsed.host or "localhost"
        port = f":{parsed.port}" if parsed.port else ""
        props = {"driver": "org.postgresql.Driver", "user": parsed.username or ""}
        if parsed.password:
            props["password"] = str(parsed.password)
        return f"jdbc:postgresql://{host}{port}/{parsed.database}", props
    if backend == "sqlite" and parsed.database:
        return f"jdbc:sqlite:{parsed.database}", {"driver": "org.sqlite.JDBC",
                                                  "busy_timeout": "30000"}  # fmt: skip
    raise InputError(f"{redact_url(url)}: the Spark writer supports PostgreSQL and SQLite files")
