"""The outbox table: the one definition used by Alembic, the relay and the Spark writer.

Times are stored in UTC. Headers are JSON *text* (not a JSON column) so that any writer,
including Spark's JDBC writer which binds strings, can insert them on every database; the
relay parses them and parks a row whose headers are not a JSON object.

The columns' types, each database's own, are ``relay.db.columns``'s. MySQL and MariaDB
(dialect ``mysql``) have no partial indexes: each of the outbox's indexes there starts with
the status instead, which keeps the claim's walk to the pending rows.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from relay.console_constants import CONSOLE_EXCHANGE_KEY, CONSOLE_REASON_PREFIX
from relay.db.columns import (
    LONG_TEXT,
    PAYLOAD,
    ROW_ID,
    SHORT_TEXT,
    STATUS_TEXT,
    UTCDateTime,
    new_message_id,
    stored_now,
)
from relay.db.dialects import of
from relay.db.schema.metadata import metadata
from relay.records import PARKED, PENDING, SENT, STATUSES

# Partial indexes MySQL does without (``_partial_index``): there every row pays for every
# index, at insert and at delete, and the due index, led by the status, serves their few
# reads. The parked rows are a range of it (status 'parked'); ``relay status``'s list of
# retrying rows walks its pending range, and a hastened exchange's rows are its pending rows
# due later. Each index less cut MariaDB's CPU per relayed row by about 2.5 us (of 32).
MYSQL_SKIPPED_INDEXES = ("outbox_parked_idx", "outbox_retrying_idx")


def index_columns(dialect: sa.Dialect, columns: list[str]) -> list[str]:
    """A partial index's columns as created on ``dialect``: led by the status on MySQL,
    which has no partial indexes (see the module docstring)."""
    return of(dialect).index_columns(columns)


outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", ROW_ID, primary_key=True),
    sa.Column(
        "message_id",
        SHORT_TEXT.with_variant(sa.Text(collation="C"), "postgresql"),
        nullable=False,
        server_default=new_message_id(),
    ),
    sa.Column("exchange", SHORT_TEXT, nullable=False, server_default=""),
    sa.Column("routing_key", SHORT_TEXT, nullable=False, server_default=""),
    sa.Column("payload", PAYLOAD, nullable=False),
    sa.Column(
        "content_type", SHORT_TEXT, nullable=False, server_default="application/octet-stream"
    ),
    sa.Column("headers", LONG_TEXT, nullable=True),
    # Rows with the same ordering key are published in id order when ordering is on.
    sa.Column("ordering_key", SHORT_TEXT, nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("next_attempt_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("status", STATUS_TEXT, nullable=False, server_default=PENDING),
    sa.Column("sent_at", UTCDateTime(), nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    # ``relay.records.OutboxRow.suspect``: its own column, not a word in last_error (which is
    # for operators, and which ``relay replay --reason`` selects by).
    sa.Column("suspect", sa.Boolean(), nullable=False, server_default=sa.false()),
    # The last error's cause (``relay.causes``), written with it by the relay (migration
    # 0018): the console lists, counts and selects parked rows by it through an index, and
    # a cause is a function of the whole error, not of its first characters. NULL for a row
    # parked by a relay of a release before, until a relay sorts it (``relay.db.causes``).
    sa.Column("cause", SHORT_TEXT, nullable=True),
    sa.CheckConstraint(
        "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")", name="outbox_status_valid"
    ),
    sa.UniqueConstraint("message_id", name="outbox_message_id_key"),
    # SQLite: an id is never given again, even after the highest row was deleted (migration
    # 0008 says why). PostgreSQL's sequence and InnoDB's counter never go back.
    sqlite_autoincrement=True,
)


def _has_partial_indexes(*_args: Any, dialect: sa.Dialect, **_kw: Any) -> bool:
    return of(dialect).partial_indexes


def _partial_index(name: str, *columns: sa.Column[Any], where: sa.ColumnElement[bool]) -> None:
    """An index of the outbox's rows that match ``where`` only; on MySQL, of every row, led
    by the status (``index_columns``), or none (``MYSQL_SKIPPED_INDEXES``)."""
    partial = sa.Index(name, *columns, postgresql_where=where, sqlite_where=where)
    partial.ddl_if(callable_=_has_partial_indexes)
    if name not in MYSQL_SKIPPED_INDEXES:
        sa.Index(name, outbox.c.status, *columns).ddl_if(dialect="mysql")


# "Find due rows" reads only pending rows, which stay few while sent rows pile up: a partial
# index keeps the claim query's cost independent of the table's history.
_partial_index(
    "outbox_due_idx",
    outbox.c.next_attempt_at,
    outbox.c.id,
    where=outbox.c.status == PENDING,
)

# The ordered claim asks "is an earlier row of this key still pending?" for each candidate.
_partial_index(
    "outbox_ordering_idx",
    outbox.c.ordering_key,
    outbox.c.id,
    where=sa.and_(outbox.c.status == PENDING, outbox.c.ordering_key.is_not(None)),
)

# ``relay status`` counts parked rows, and ``relay replay`` finds them, without reading the
# pending ones; the index has no entry for any other row, so it costs the relay nothing.
_partial_index(
    "outbox_parked_idx",
    outbox.c.id,
    where=outbox.c.status == PARKED,
)

# Pending rows that failed before: ``relay status`` lists them by exchange, and a destination
# found again hastens them. Only a failed attempt (an update that moves the row in the due
# index anyway) adds an entry.
_partial_index(
    "outbox_retrying_idx",
    outbox.c.exchange,
    where=sa.and_(outbox.c.status == PENDING, outbox.c.attempts > 0),
)

# Sent rows kept whole (``keep_sent = messages``): ``relay status``, the purge and replay by
# time find them by their sent time. Empty when acked rows leave the outbox.
_partial_index(
    "outbox_sent_idx",
    outbox.c.sent_at,
    where=outbox.c.status == SENT,
)


# The operator console (``relay.db.console``) lists parked rows most recently parked first
# (a parked row's ``next_attempt_at`` is when it was parked), by cause and by exchange, a
# page at a time. Partial: a writer's INSERT (a pending row) adds no entry to any of them,
# only a row being parked does. Not on MySQL (no partial indexes): there every writer's
# INSERT would pay for them, and the console reads its pages by walking the parked range
# of the due index instead.
def reason_prefix(column: sa.ColumnElement[str | None]) -> sa.ColumnElement[str]:
    """The first ``CONSOLE_REASON_PREFIX`` characters of a last error, as the console's index
    holds them (a B-tree entry must stay small; an error may be long). Its numbers are
    literals, so that a query's expression is the index's."""
    return sa.func.substr(
        column, sa.literal_column("1"), sa.literal_column(str(CONSOLE_REASON_PREFIX))
    )


def exchange_key(column: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
    """An exchange as the console's index of parked rows holds it: its first
    ``CONSOLE_EXCHANGE_KEY`` characters, the whole of any name a broker takes (migration
    0017: the exchange whole, 6,000 random bytes of it, failed a relay's settle on
    PostgreSQL: "index row size exceeds btree maximum 2704"). Its numbers are literals, so
    that a query's expression is the index's."""
    return sa.func.substr(
        column, sa.literal_column("1"), sa.literal_column(str(CONSOLE_EXCHANGE_KEY))
    )


# The console's index of parked rows by exchange (migration 0017; 0014 held it whole).
CONSOLE_EXCHANGE_INDEX = (
    "outbox_parked_exchange_key_idx",
    exchange_key(outbox.c.exchange),
    outbox.c.next_attempt_at,
    outbox.c.id,
)
# The console's index of parked rows by cause (migration 0018).
CONSOLE_CAUSE_INDEX = (
    "outbox_parked_cause_idx",
    outbox.c.cause,
    outbox.c.next_attempt_at,
    outbox.c.id,
)
CONSOLE_INDEXES = (
    ("outbox_parked_time_idx", outbox.c.next_attempt_at, outbox.c.id),
    (
        "outbox_parked_reason_idx",
        reason_prefix(outbox.c.last_error),
        outbox.c.next_attempt_at,
        outbox.c.id,
    ),
    CONSOLE_EXCHANGE_INDEX,
    CONSOLE_CAUSE_INDEX,
)
for _name, *_columns in CONSOLE_INDEXES:
    _parked = outbox.c.status == PARKED
    sa.Index(_name, *_columns, postgresql_where=_parked, sqlite_where=_parked).ddl_if(
        callable_=_has_partial_indexes
    )
# Parked rows by message id, byte by byte (migration 0016; on PostgreSQL by the operators of
# text_pattern_ops, whatever the database's collation): the console's search by a message
# id's prefix reads one range of it (``Dialect.prefixed``). Not in CONSOLE_INDEXES, which
# migration 0014 builds.
CONSOLE_MESSAGE_INDEX = sa.Index(
    "outbox_parked_message_idx",
    outbox.c.message_id,
    postgresql_where=outbox.c.status == PARKED,
    sqlite_where=outbox.c.status == PARKED,
    postgresql_ops={"message_id": "text_pattern_ops"},
).ddl_if(callable_=_has_partial_indexes)


# What a claimed row carries to the publisher (``relay.records.OutboxRow``'s fields).
# The columns a writer fills (the Spark writer, ``relay enqueue``; a plain-SQL writer may also
# give ``created_at``); the database fills in the rest. A writer's role may insert these
# and no others (``relay.db.roles``): an id ahead of the sequence, or a row written as sent
# or with attempts spent, is not a writer's to make.
WRITTEN_COLUMNS = (
    "message_id",
    "exchange",
    "routing_key",
    "payload",
    "content_type",
    "headers",
    "ordering_key",
)
WRITER_COLUMNS = (*WRITTEN_COLUMNS, "created_at")

ROW_COLUMNS = (
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
    outbox.c.suspect,
)
