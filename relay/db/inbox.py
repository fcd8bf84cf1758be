"""The inbox's database side: a message's key inserted first in its handler's transaction,
failed attempts counted in transactions of their own, old keys purged in bounded chunks.

The key goes in with the database's own "insert or ignore" (``ON CONFLICT DO NOTHING``,
``INSERT IGNORE``, ``INSERT OR IGNORE``), never a look then an insert: a second delivery of a
message being processed (redelivered to another consumer of the same name after a lost
connection) waits on the first one's uncommitted key, and finds it once that commits. Its
row count says which it was. ``INSERT IGNORE`` would also truncate a value too long for its
column; ``relay.inbox`` refuses such ids before they get here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from relay.constants import LAST_ERROR_MAX_CHARS
from relay.db.clock import database_time
from relay.db.engine import (
    create_engine,
    db_errors,
    delete_chunk,
    in_chunks,
    insert_or_ignore,
    run_delete,
    transaction,
)
from relay.db.schema import inbox_attempts, inbox_received
from relay.redact import redact_url

# What a handler writes with: the open transaction its message's key went into.
Transaction = sa.Connection


class InboxStore:
    """One consumer's rows of the inbox tables, on one database."""

    def __init__(self, url: str, consumer: str) -> None:
        # No test query per delivery: a dropped connection fails one delivery, requeued.
        self.engine = create_engine(url, pre_ping=False)
        self.consumer = consumer
        self.where = redact_url(url)
        dialect = self.engine.dialect.name
        # The key's insert; public for bench.inbox, which measures it alone.
        self.insert_key = insert_or_ignore(inbox_received, self.engine.dialect).values(
            consumer=sa.bindparam("consumer"), message_id=sa.bindparam("message_id")
        )
        self._count_attempt = _upsert_attempt(dialect)

    @contextmanager
    def receive(self, message_id: str) -> Iterator[Transaction | None]:
        """A transaction whose first statement inserts the message's key: yields it open, to
        commit with whatever the caller writes in it, or None (and rolls back) when the key
        was there already: the message was processed before."""
        with (
            db_errors("the inbox's transaction", self.where),
            self.engine.connect() as conn,
            conn.begin() as tx,
        ):
            inserted = conn.execute(
                self.insert_key,
                {"consumer": self.consumer, "message_id": message_id},
                execution_options={"preserve_rowcount": True},
            ).rowcount
            if not inserted:
                tx.rollback()
                yield None
                return
            yield conn

    def count_attempt(self, message_id: str, error: str) -> int:
        """One more failed attempt at the message, in a transaction of its own; returns how
        many there have been."""
        key = {"consumer": self.consumer, "message_id": message_id}
        with transaction(self.engine, "counting an attempt", self.where) as conn:
            conn.execute(self._count_attempt, {**key, "last_error": error[:LAST_ERROR_MAX_CHARS]})
            return int(conn.scalar(_attempts_of(), key) or 0)

    def attempts(self, message_id: str) -> int:
        """Failed attempts counted for the message so far."""
        key = {"consumer": self.consumer, "message_id": message_id}
        with db_errors("reading attempts", self.where), self.engine.connect() as conn:
            return int(conn.scalar(_attempts_of(), key) or 0)

    def purge(self, older_than: float, chunk: int, stop: threading.Event | None = None) -> int:
        """Delete this consumer's keys and attempts older than ``older_than`` seconds (by the
        database's clock), ``chunk`` rows per transaction, oldest first; returns how many. A
        set ``stop`` ends it after the chunk under way."""
        deleted = 0
        for table, time in (
            (inbox_received, inbox_received.c.received_at),
            (inbox_attempts, inbox_attempts.c.updated_at),
        ):
            old = sa.and_(table.c.consumer == self.consumer, time < database_time(-older_than))
            delete = delete_chunk(
                table, table.c.message_id, old, chunk=chunk, dialect=self.engine.dialect, first=time
            )
            deleted += in_chunks(
                self.engine,
                functools.partial(run_delete, delete),
                chunk=chunk,
                what="purging the inbox",
                where=self.where,
                stop=stop,
            )
        return deleted

    def close(self) -> None:
        self.engine.dispose()


def _attempts_of() -> sa.Select[tuple[int]]:
    return sa.select(inbox_attempts.c.attempts).where(
        inbox_attempts.c.consumer == sa.bindparam("consumer"),
        inbox_attempts.c.message_id == sa.bindparam("message_id"),
    )


def _upsert_attempt(dialect: str) -> sa.Insert:
    """A failed attempt's row inserted with a count of 1, or its count raised by one."""
    values = {
        "consumer": sa.bindparam("consumer"),
        "message_id": sa.bindparam("message_id"),
        "attempts": 1,
        "last_error": sa.bindparam("last_error"),
        "updated_at": database_time(),
    }
    raised = {
        "attempts": inbox_attempts.c.attempts + 1,
        "last_error": sa.bindparam("last_error"),
        "updated_at": database_time(),
    }
    if dialect == "mysql":
        statement = mysql_insert(inbox_attempts).values(values)
        return statement.on_duplicate_key_update(raised)
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    return (
        insert(inbox_attempts)
        .values(values)
        .on_conflict_do_update(index_elements=["consumer", "message_id"], set_=raised)
    )
