"""The database's clock, as SQL: every time that decides anything is the database's.

Relays run on several hosts whose clocks drift from each other and from the database (by
seconds, by minutes after a bad NTP day). A lease ended by one relay's clock and judged by
another's is taken over while its holder still works on it (a relay 10 minutes ahead
published 2,994 of 6,000 rows twice), and a due test by a late clock holds new rows back
(10 minutes behind: nothing published for 10 minutes). So the claim's due test, the lease's
end, a retry's next attempt, ``sent_at``, ages and cut-offs are computed by the database in
the statement that uses them, from one clock; the relay sends only durations. Its own clock
is for local timers (monotonic) and log lines.

PostgreSQL: ``statement_timestamp()``, the start of the current statement (``now()`` would
be the transaction's start, which a settle's several statements share; the difference is
milliseconds, but statement time is what the statement saw). SQLite: its ``'now'``, which
is this host's clock: an embedded database has one host and so one clock. SQLite stores the
times as text, in the format SQLAlchemy writes (``YYYY-MM-DD HH:MM:SS.ffffff``), so that
they compare with the values already stored by text order; its clock has milliseconds.
MySQL and MariaDB: ``utc_timestamp(6)``, fixed for the statement like PostgreSQL's, stored as
``DATETIME(6)`` (``relay.db.columns.UTCDateTime``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from relay.db.columns import UTCDateTime
from relay.db.dialects import of


def _seconds(value: float | sa.ColumnElement[float]) -> sa.ColumnElement[float]:
    if isinstance(value, sa.ColumnElement):
        return value
    return sa.literal(float(value), sa.Float())


class database_time(FunctionElement[Any]):
    """The database's current time plus ``seconds`` (a number or a bound parameter; negative
    for the past)."""

    type = UTCDateTime()
    inherit_cache = True

    def __init__(self, seconds: float | sa.ColumnElement[float] = 0.0) -> None:
        super().__init__(_seconds(seconds))


class seconds_between(FunctionElement[float]):
    """Seconds from the time ``start`` to the time ``end`` (columns, aggregates of them or
    ``database_time()``); NULL when either is NULL."""

    type = sa.Float()
    inherit_cache = True

    def __init__(self, start: sa.ColumnElement[Any], end: sa.ColumnElement[Any]) -> None:
        super().__init__(start, end)


def _argument(element: FunctionElement[Any], compiler: Any, **kw: Any) -> str:
    (argument,) = element.clauses
    return str(compiler.process(argument, **kw))


@compiles(database_time)
def _database_time(element: database_time, compiler: Any, **kw: Any) -> str:
    return of(compiler.dialect).database_time(_argument(element, compiler, **kw))


@compiles(seconds_between)
def _seconds_between(element: seconds_between, compiler: Any, **kw: Any) -> str:
    start, end = (compiler.process(c, **kw) for c in element.clauses)
    return of(compiler.dialect).seconds_between(start, end)


def seconds_since(moment: sa.ColumnElement[Any]) -> sa.ColumnElement[float]:
    """Seconds from the time ``moment`` to the database's current time."""
    return seconds_between(moment, database_time())


def epoch_seconds(conn: sa.Connection) -> float:
    """The database's current time in Unix seconds."""
    epoch: sa.ColumnElement[Any] = sa.literal_column(of(conn).epoch)
    return float(conn.execute(sa.select(seconds_since(epoch))).scalar_one())
