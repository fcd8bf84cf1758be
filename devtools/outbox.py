"""Looking into an outbox from outside the relay: rows by status, the whole table."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from relay.db.columns import sent_key_value
from relay.db.dialects import of
from relay.db.schema import (
    outbox,
    outbox_buckets,
    outbox_sent,
    outbox_sent_journal,
    outbox_sent_legacy,
)
from relay.records import SENT

_IDS_PER_QUERY = 1000
# The sent log, and that of the releases before migration 0015, which their relays write.
_LOGS = (outbox_sent, outbox_sent_legacy)


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


def statuses(target: str | sa.Engine) -> dict[str, int]:
    """Messages by status (statuses with none left out), "sent" counting the sent log too."""
    with _connection(target) as conn:
        q = sa.select(outbox.c.status, sa.func.count()).group_by(outbox.c.status)
        out = {status: int(count) for status, count in conn.execute(q)}
        logged = _logged(conn)
        if logged:
            out[SENT] = out.get(SENT, 0) + logged
    return out


def owners(target: str | sa.Engine) -> dict[str, int]:
    """Relay name -> the buckets it owns (lease running or not); a relay that stopped
    cleanly owns none."""
    with _connection(target) as conn:
        q = (
            sa.select(outbox_buckets.c.owner, sa.func.count())
            .where(outbox_buckets.c.owner.is_not(None))
            .group_by(outbox_buckets.c.owner)
        )
        return {owner: int(count) for owner, count in conn.execute(q)}


def fates(target: str | sa.Engine, message_ids: Iterable[str]) -> dict[str, str]:
    """Each message id's status: its row's, or "sent" when its key is in the sent log (ids
    found nowhere are left out)."""
    wanted = sorted(set(message_ids))
    found: dict[str, str] = {}
    with _connection(target) as conn:
        for i in range(0, len(wanted), _IDS_PER_QUERY):
            chunk = wanted[i : i + _IDS_PER_QUERY]
            query = sa.select(outbox.c.message_id, outbox.c.status)
            found |= {m: s for m, s in conn.execute(query.where(outbox.c.message_id.in_(chunk)))}
            found |= dict.fromkeys(sent_already(conn, [m for m in chunk if m not in found]), SENT)
    return found


def sent_already(conn: sa.Connection, message_ids: Iterable[str]) -> set[str]:
    """Which of ``message_ids`` a sent log holds (their keys computed here: the lookup is
    one probe of each log's primary key per id)."""
    keys = {sent_key_value(i, conn.dialect): i for i in message_ids}
    return {
        keys[key]
        for log in _LOGS
        for key in conn.scalars(sa.select(log.c.key).where(log.c.key.in_(list(keys))))
    }


def sent_ids(target: str | sa.Engine) -> set[int]:
    """The ids of the rows sent: kept whole, or in a sent log."""
    with _connection(target) as conn:
        kept = set(conn.scalars(sa.select(outbox.c.id).where(outbox.c.status == SENT)))
        return kept.union(*(conn.scalars(sa.select(log.c.id)) for log in _LOGS))


def sent_logged(target: str | sa.Engine) -> int:
    """Entries in the sent logs."""
    with _connection(target) as conn:
        return _logged(conn)


def sent_latencies(target: str | sa.Engine) -> list[float]:
    """Each sent message's seconds from ``created_at`` to ``sent_at``: rows kept whole, and
    the sent log's entries."""
    with _connection(target) as conn:
        return [
            (sent - created).total_seconds()
            for table, where in ((outbox, [outbox.c.status == SENT]), *((log, []) for log in _LOGS))
            for created, sent in conn.execute(
                sa.select(table.c.created_at, table.c.sent_at).where(*where)
            )
        ]


def empty(target: str | sa.Engine) -> None:
    """Delete every row and every sent log entry: a fresh start for a measurement that
    writes the same message ids again (the log would have them dropped).

    On PostgreSQL by TRUNCATE, which leaves no dead tuples: deleting left every earlier case's
    rows and log entries for the next case's inserts, probes and vacuums to step over (the
    1,000,000-row case of ``bench.run``, measured after 21 cases of 100,000, drained at
    10,283 rows/s with PostgreSQL at 0.065 CPU s per 1,000 rows; with TRUNCATE, 15,181 and
    0.021)."""
    with _connection(target) as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            # The journal too: a rebuild after a crash would bring its entries back.
            tables = (outbox, *_LOGS, outbox_sent_journal)
            conn.execute(sa.text(f"TRUNCATE {', '.join(t.name for t in tables)}"))
        elif conn.dialect.name == "mysql":  # the same reason: InnoDB's purge of deleted rows
            for table in (outbox, *_LOGS):
                conn.execute(sa.text(f"TRUNCATE TABLE {table.name}"))
        else:
            for table in (outbox, *_LOGS):
                conn.execute(sa.delete(table))


def log_acked(
    conn: sa.Connection, message_id: str, row_id: int, created_at: Any, sent_at: Any
) -> None:
    """A sent log entry written as an ack writes it: in the log, and where the log is
    journaled (``relay.db.sentlog``), in a journal row of its own, which the relays' reads by
    sent time go to there."""
    key = sent_key_value(message_id, conn.dialect)
    entry = {"key": key, "id": row_id, "created_at": created_at, "sent_at": sent_at}
    conn.execute(sa.insert(outbox_sent).values(entry))
    if of(conn).journals_sent_log:
        arrays = {"message_keys": [key], "ids": [row_id], "created_at": [created_at]}
        conn.execute(sa.insert(outbox_sent_journal).values(sent_at=sent_at, id=row_id, **arrays))


def _logged(conn: sa.Connection) -> int:
    counts = (sa.select(sa.func.count()).select_from(log) for log in _LOGS)
    return sum(int(conn.execute(count).scalar_one()) for count in counts)


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


# The entries of a journal row that ``age_sent_log`` writes: an ack statement's at most.
_AGED_ROW_ENTRIES = 1000


def age_sent_log(
    target: str | sa.Engine, entries: int, days: float = 6.0, first: int = 0, logged: bool = True
) -> None:
    """A PostgreSQL sent log aged by plain SQL: ``entries`` acks of messages ``aged-N``
    (``N`` from ``first``) spread evenly over the last ``days``, as the relays would have
    left them, in the journal (a row per thousand entries) and, unless not ``logged`` (what
    a crash leaves of it), in the log."""
    rows = -(-entries // _AGED_ROW_ENTRIES)
    journal = sa.text(
        "INSERT INTO outbox_sent_journal (sent_at, id, message_keys, ids, created_at) "
        "SELECT now() - make_interval(secs => :span * (1 - r / CAST(:rows AS float))), "
        "1000000000 + :first + r * :per, "
        "array(SELECT CAST(md5('aged-' || (:first + r * :per + k)) AS uuid) "
        "      FROM generate_series(0, :per - 1) k), "
        "array(SELECT 1000000000 + :first + r * :per + k FROM generate_series(0, :per - 1) k), "
        "array_fill(now() - make_interval(secs => :span), ARRAY[:per]) "
        "FROM generate_series(0, :rows - 1) r"
    )
    log = sa.text(
        "INSERT INTO outbox_sent_log (key, id, created_at, sent_at) "
        "SELECT e.key, e.id, e.created_at, j.sent_at FROM outbox_sent_journal j, "
        "unnest(j.message_keys, j.ids, j.created_at) AS e(key, id, created_at) "
        "WHERE j.id >= 1000000000 + :first ON CONFLICT DO NOTHING"
    )
    values = {"rows": rows, "per": _AGED_ROW_ENTRIES, "span": days * 86400, "first": first}
    with _connection(target) as conn, conn.begin():
        conn.execute(journal, values)
        if logged:
            conn.execute(log, {"first": first})
