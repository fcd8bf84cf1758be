"""Engines for the outbox database, and the error wrapping every database call shares.

Two kinds of session, by what their writes must survive:

- ``relay_session=True`` (the relay's claims, settles, turns, probe and purges):
  ``synchronous_commit=off`` on PostgreSQL, ``synchronous=NORMAL`` on SQLite (in WAL mode:
  no fsync at commit, only at checkpoints). A claim or settle lost in a database or machine
  crash only makes rows due again, so they are published twice, never lost; not waiting for
  the flush takes a disk flush off every batch. And bounded, so that a relay that froze or
  vanished holds nothing for long: the server ends a statement that runs, or waits for a
  lock, too long, and a transaction left idle (``DB_*`` in ``relay.constants``); TCP
  keepalives on both ends find a silent peer in seconds. The one exception, the purge of
  PostgreSQL's sent log journal, commits durably (``relay.db.sentlog.purge_chunk`` says why).
- ``inbox_session=True`` (an inbox consumer's, its handlers' writes among them): durable, as
  below, and bounded where a wait is never a handler's own work: a lock waited for
  (another consumer's handler of the same id) and a statement run longer than the relay's
  limits fail, instead of holding a delivery and its connection indefinitely. No limit on
  an idle transaction: a handler may call out between its statements.
- the default (writers, operators, migrations, the Spark writer's merge, the inbox):
  durable commits whatever the server's default (``synchronous_commit=on`` on PostgreSQL,
  ``synchronous=FULL`` on SQLite). A message a writer was told is in the outbox must be
  there after a crash, and a message an inbox acked must stay processed (on a server set to
  ``synchronous_commit=off``, a crash lost 6 of 3,000 messages an inbox had acked). TCP
  keepalives here too.

Writers' and operators' engines test a pooled connection before using it (``pre_ping``):
they make a call now and then, and a connection the database dropped meanwhile would fail
it. The relay's and the inbox's do not: their connections are busy, a dropped one fails one
call, which is retried (SQLAlchemy then discards every pooled connection of that age), and a
test query per call was a round trip on every claim, settle and delivery.

MySQL and MariaDB (URLs ``mysql://``, ``mariadb://``; the driver is mysqlclient, the C
client SQLAlchemy also defaults to): every session runs in UTC (``relay.db.clock``) and in
strict mode (a value too long for its column fails its statement, never truncated); the
relay's own read committed, with lock and statement timeouts. A server older than
``MARIADB_MIN_VERSION`` / ``MYSQL_MIN_VERSION`` is refused at connect (``ConfigError``: no
retry makes it work). MySQL's durability is the server's (``innodb_flush_log_at_trx_commit``
has no per-session setting), so relay sessions there commit durably too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from relay.db.dialects import for_url
from relay.errors import SchemaMissingError, StoreError
from relay.redact import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


def create_engine(
    url: str, *, relay_session: bool = False, inbox_session: bool = False, pre_ping: bool = True
) -> sa.Engine:
    """An engine for ``url`` with durable sessions; with ``relay_session``, with the session
    settings the relay's own claims and settles want; with ``inbox_session``, an inbox's;
    ``pre_ping``, testing a pooled connection before each use, where ``relay_session`` is off
    (see the module docstring)."""
    parsed = _url(url)
    return for_url(parsed).engine(
        parsed,
        relay_session=relay_session,
        inbox_session=inbox_session,
        pre_ping=pre_ping and not relay_session,
    )


def create_async_engine(url: str) -> AsyncEngine:
    """An asyncio engine for ``url`` with an inbox's sessions (``inbox_session``), on the
    drivers' asyncio flavours: psycopg's own for PostgreSQL, aiomysql for MySQL and MariaDB,
    aiosqlite for SQLite (the ``asyncio`` extra). The session settings are the blocking
    engine's, applied through SQLAlchemy's adapters to the same events. (SQLAlchemy's
    asyncio needs greenlet, which the relay itself does without: the dialects import it
    only here.)"""
    parsed = _url(url)
    return for_url(parsed).async_engine(parsed)


def _url(url: str) -> sa.URL:
    try:
        return sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise StoreError(f"database URL {redact_url(url)!r} is not valid: {exc}") from exc


@contextmanager
def db_errors(what: str, where: str) -> Iterator[None]:
    """Turn the driver's errors into StoreError (chained), naming the call and the database."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        if _missing_table(exc):
            raise schema_missing(where, _missing_table_name(exc)) from exc
        first_line = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
        summary = f"{what} on {where} failed"
        raise StoreError(
            f"{summary}: {type(exc.orig).__name__}: {first_line}", summary=summary
        ) from exc
    except sa.exc.SQLAlchemyError as exc:
        summary = f"{what} on {where} failed"
        raise StoreError(f"{summary}: {exc}", summary=summary) from exc


@contextmanager
def transaction(engine: sa.Engine, what: str, where: str) -> Iterator[sa.Connection]:
    """One transaction on ``engine``; the driver's errors become StoreError naming ``where``
    (the database as the user wrote it, password redacted)."""
    with db_errors(what, where), engine.begin() as conn:
        yield conn


def schema_missing(where: str, table: str = "outbox") -> SchemaMissingError:
    return SchemaMissingError(f"the {table} table does not exist in {where}: run `relay migrate`")


# MySQL's error number for "table doesn't exist".
_MYSQL_NO_SUCH_TABLE = 1146


def _missing_table_name(exc: sa.exc.DBAPIError) -> str:
    """The table the driver's error names (PostgreSQL: relation "t"; SQLite: no such
    table: t; MySQL: Table 'db.t'), or "outbox"."""
    found = re.search(
        r"""relation "(\w+)"|no such table: (\w+)|Table '\w+\.(\w+)'""", str(exc.orig)
    )
    return next((name for name in found.groups() if name), "outbox") if found else "outbox"


def _missing_table(exc: sa.exc.DBAPIError) -> bool:
    if getattr(exc.orig, "sqlstate", None) == "42P01" or "no such table" in str(exc.orig):
        return True
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return len(args) > 0 and args[0] == _MYSQL_NO_SUCH_TABLE
