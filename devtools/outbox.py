"""Looking into an outbox from outside the relay: rows by status, the whole table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from relay.db.schema import outbox
from relay.records import PENDING


@contextmanager
def _connection(target: str | sa.Engine) -> Iterator[sa.Connection]:
    """A connection to ``target``, a URL (an engine just for this call) or an engine."""
    engine = target if isinstance(target, sa.Engine) else sa.create_engine(target)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        if engine is not target:
            engine.dispose()


def statuses(target: str | sa.Engine, *, leased: bool = False) -> dict[str, int]:
    """Rows by status (statuses with no row left out); with ``leased``, also under "leased"
    the pending rows a relay holds."""
    with _connection(target) as conn:
        q = sa.select(outbox.c.status, sa.func.count()).group_by(outbox.c.status)
        out = {status: int(count) for status, count in conn.execute(q)}
        if leased:
            held = sa.select(sa.func.count()).where(
                outbox.c.status == PENDING, outbox.c.lease_owner.is_not(None)
            )
            out["leased"] = int(conn.execute(held).scalar_one())
    return out


def rows(target: str | sa.Engine) -> list[Any]:
    """Every row, every column, in id order."""
    with _connection(target) as conn:
        return list(conn.execute(sa.select(outbox).order_by(outbox.c.id)))


def insert(target: str | sa.Engine, rows: list[dict[str, Any]]) -> None:
    """Rows as any SQL writer inserts them: the given columns only, values bound as they are
    (past SQLAlchemy's column types, so SQLite keeps an INTEGER payload as one), the database
    filling in the rest, in one transaction. Every row names the same columns."""
    columns = list(rows[0])
    statement = sa.text(
        f"INSERT INTO outbox ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"
    )
    engine = target if isinstance(target, sa.Engine) else sa.create_engine(target)
    try:
        with engine.begin() as conn:
            conn.execute(statement, rows)
    finally:
        if engine is not target:
            engine.dispose()
