"""One module per database, behind one interface (``Dialect``): every piece of SQL and every
session setting that differs between PostgreSQL, SQLite and MySQL/MariaDB.

The rest of the package asks ``of`` (a connection's, an engine's or SQLAlchemy's dialect) or
``for_url`` and never branches on a database's name (``tests/unit/test_dialects.py`` holds
it; the migrations, which are history, may). Modelled on SQLAlchemy's dialects and Alembic's
``ddl/``: a new database is a module here, listed in ``DIALECTS``.
"""

from __future__ import annotations

import sqlalchemy as sa

from relay.db.dialects import mysql, postgresql, sqlite
from relay.db.dialects.base import BINARY_RESULTS, Dialect
from relay.errors import ConfigError

DIALECTS: tuple[Dialect, ...] = (postgresql.DIALECT, sqlite.DIALECT, mysql.DIALECT)
_BY_NAME = {dialect.name: dialect for dialect in DIALECTS}
_BY_BACKEND = {backend: dialect for dialect in DIALECTS for backend in dialect.url_backends}
URL_BACKENDS = tuple(_BY_BACKEND)


def of(target: sa.Dialect | sa.Connection | sa.Engine | str) -> Dialect:
    """The dialect of a connection, an engine, SQLAlchemy's dialect, or of that name."""
    if isinstance(target, str):
        return _BY_NAME[target]
    dialect = target if isinstance(target, sa.Dialect) else target.dialect
    return _BY_NAME[dialect.name]


def for_url(url: sa.URL) -> Dialect:
    """The dialect a database URL reaches (``ConfigError`` for a database not listed)."""
    found = _BY_BACKEND.get(url.get_backend_name())
    if found is None:
        raise ConfigError(
            f"database URL scheme {url.drivername!r} is not one of "
            f"{', '.join(backend + '://' for backend in URL_BACKENDS)}"
        )
    return found


def url_problem(backend: str, path: str, query: dict[str, list[str]]) -> str | None:
    """Why a URL of ``backend`` (one of ``URL_BACKENDS``) with this path and query cannot hold
    the outbox, or None (``relay.settings`` checks it at start)."""
    return _BY_BACKEND[backend].url_problem(path, query)


__all__ = ["BINARY_RESULTS", "DIALECTS", "URL_BACKENDS", "Dialect", "for_url", "of", "url_problem"]
