"""Which rows are due, in SQL: the relay's claim statement, and the backlog it works through.

A claim is a plain SELECT: it writes nothing. Each relay claims due rows of its own buckets
only (``relay.buckets``), and only of the buckets whose lease has at least the claim's margin
left by the database's clock: a relay that froze past its lease, or whose turns fail, claims
nothing from a bucket it may be about to lose. What a claim returns is read row by row by
``relay.db.decode``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from relay.db.buckets import owned_now
from relay.db.clock import database_time, seconds_since
from relay.db.columns import sent_key
from relay.db.dialects import of
from relay.db.schema import (
    ROW_COLUMNS,
    bucket_column,
    outbox,
    outbox_buckets,
    outbox_sent,
    outbox_sent_legacy,
)
from relay.db.sentlog import claimable, complete, recovering
from relay.db.sentruns import looked_up
from relay.db.statements import bounded_count
from relay.records import PENDING, BacklogStats

# The claimed columns as the driver returns them, without SQLAlchemy's result processing
# (``relay.db.decode`` says why).
_RAW = sa.types.NullType()
# A claimed row's place in the due order, as the driver returns it: bound back unchanged
# (``relay.held``'s position), it compares with the stored values as they compare among
# themselves.
_DUE_AT = sa.type_coerce(outbox.c.next_attempt_at, _RAW).label("due_at")
# Columns not read from a row larger than the largest message (``oversize``).
_NOT_READ_WHEN_OVERSIZE = ("payload", "headers")


def due_now() -> sa.ColumnElement[bool]:
    """A pending row that is due (rows a relay holds among them)."""
    return sa.and_(outbox.c.status == PENDING, outbox.c.next_attempt_at <= database_time())


def due_backlog(conn: sa.Connection, exact_upto: int) -> BacklogStats:
    """The due rows (those in flight among them), counted up to ``exact_upto`` and
    estimated beyond (``relay.db.statements.bounded_count``): a ``count(*)`` of a 1M-row backlog
    every stats interval cost about 11 us per row relayed at 5,000 rows/s. The oldest due
    row's age is one probe of the due index."""
    due_ids = sa.select(outbox.c.id).where(due_now())
    count = bounded_count(conn, due_ids, exact_upto)
    return BacklogStats(due=count, oldest_due_age=oldest_due_age(conn))


def oldest_due_age(conn: sa.Connection) -> float:
    """The oldest due row's age in seconds (0 when none is due): one probe of the due index."""
    oldest = sa.select(seconds_since(sa.func.min(outbox.c.next_attempt_at))).where(due_now())
    return max(0.0, conn.execute(oldest).scalar_one() or 0.0)


def _read_columns(dialect: sa.Dialect) -> list[sa.Label[Any]]:
    """``ROW_COLUMNS`` as the claim reads them: as the driver returns them, the payload as
    the bytes stored (``Dialect.stored_bytes``)."""
    read = {outbox.c.payload.name: of(dialect).stored_bytes(outbox.c.payload)}
    return [sa.type_coerce(read.get(c.name, c), _RAW).label(c.name) for c in ROW_COLUMNS]


def stored_sizes(dialect: sa.Dialect) -> tuple[sa.ColumnElement[int], sa.ColumnElement[int]]:
    """A row's payload, and its payload and headers, in bytes, as the database stores them,
    without reading them (PostgreSQL's ``octet_length`` of a TOASTed value reads its header
    only)."""
    length = of(dialect).stored_length
    payload = length(outbox.c.payload)
    return payload, payload + sa.func.coalesce(length(outbox.c.headers), 0)


def claim_statement(
    dialect: sa.Dialect,
    owner: str,
    margin: float,
    *,
    ordered: bool,
    keyset: bool,
    window: bool = False,
) -> sa.Select[Any]:
    """The claim: due rows of ``owner``'s buckets bound as ``buckets`` that are leased to it
    for at least ``margin`` seconds more, at most ``limit`` of them, the rows bound as
    ``held`` and the exchanges bound as ``skip`` left out, reading on after the position
    ``after_at``, ``after_id`` (with ``keyset``) or from the start; with ``ordered``, a row
    whose key has an earlier row pending is left out too. With ``window`` (and ``ordered``),
    only the first ``scan`` due rows not held (of every relay's buckets) are looked at
    (``relay.constants.ORDERED_LOOK_PER_ROW`` says why).

    Payloads add up to at most ``max_bytes`` (the first row whatever its size with
    ``first_always``): their sizes are the database's to tell (``stored_sizes``), so a claim
    never fetches more payload than it may hold (600 rows of 1.5 MiB in claims of 500 rows
    had the relay at 4.3 GB). A row larger than ``max_message`` is returned without its
    payload and headers, with its size, to be parked unread; it counts nothing against
    ``max_bytes``.

    On SQLite the statement does not cut the rows at ``max_bytes``: it returns every
    candidate in due order, with what each counts against the budget (``counted``), and
    the caller stops reading once they no longer fit (``within_budget``). SQLite reads a row
    only when it is asked for the next, so no more payload is read than with the cut in SQL;
    and the window functions that cut takes cost SQLite, in the relay's own process, more
    than the rest of the claim: 500-row claims took 11 to 13 us of CPU per row with them, 7
    to 8.6 us without.

    Columns: ``ROW_COLUMNS``, ``sent_before``, ``oversize``, ``due_at``, and on SQLite
    ``counted``."""
    mine = owned_now(owner, margin).where(
        of(dialect).in_list(outbox_buckets.c.bucket, "buckets", sa.SmallInteger())
    )
    size, message_size = stored_sizes(dialect)
    oversize = message_size > sa.bindparam("max_message", type_=sa.BigInteger())
    # MySQL: the candidates and their running sizes carry ids only, and the rows are read by
    # id at the end. Its derived tables are temporary tables, and one with a BLOB column is
    # an on-disk one: carrying the payloads through two of them cost MariaDB 13.7 us of CPU
    # per claimed row, ids only 7.7 us. Elsewhere the columns are carried, and an oversized
    # row's payload is dropped where it is first read, before any step could copy it.
    lean = of(dialect).claims_carry_ids
    row_columns = _read_columns(dialect)
    carried = [outbox.c.id] if lean else _unless_oversize(row_columns, oversize)
    ours = of(dialect).in_once(bucket_column(outbox.c.id), mine)
    takeable = [
        # No row while the sent log is incomplete (a crash emptied it, ``relay.db.sentlog``)
        # unless the runs bound the journal's tail the relay then looks ids up in.
        claimable(of(dialect).journals_sent_log),
        sa.not_(of(dialect).in_list(outbox.c.id, "held", sa.BigInteger())),
        sa.not_(of(dialect).in_list(outbox.c.exchange, "skip", sa.Text())),
    ]
    if keyset:
        takeable.append(_after_position(lean))
    candidates = sa.select(
        *carried,
        _DUE_AT,
        size.label("size"),
        message_size.label("message_size"),
        oversize.label("over"),
    )
    if ordered and window:
        # The front of the backlog, of every relay's buckets: a bound the planners walk the
        # due index for (with this relay's buckets in it, PostgreSQL misjudged how few rows
        # match, and read and sorted all of them).
        looked = (
            sa.select(outbox.c.id)
            .where(due_now(), *takeable)
            .order_by(outbox.c.next_attempt_at, outbox.c.id)
            .limit(sa.bindparam("scan", type_=sa.Integer()))
            .subquery("looked")
        )
        candidates = candidates.select_from(outbox.join(looked, outbox.c.id == looked.c.id)).where(
            ours
        )
    else:
        candidates = candidates.where(due_now(), ours, *takeable)
    candidates = candidates.order_by(outbox.c.next_attempt_at, outbox.c.id).limit(
        sa.bindparam("limit")
    )
    if ordered:
        earlier = outbox.alias("earlier")
        candidates = candidates.where(
            sa.or_(
                outbox.c.ordering_key.is_(None),
                ~sa.exists().where(
                    earlier.c.ordering_key == outbox.c.ordering_key,
                    earlier.c.status == PENDING,
                    earlier.c.id < outbox.c.id,
                ),
            )
        )
    if of(dialect).budget_cut_as_read:
        return candidates.with_only_columns(
            *carried,
            _sent_before(outbox.c.message_id, dialect),
            sa.case((oversize, message_size)).label("oversize"),
            _DUE_AT,
            sa.case((oversize, 0), else_=size).label("counted"),
        )
    c = candidates.subquery("candidate")
    order = (c.c.due_at, c.c.id)
    read = sa.case((c.c.over, 0), else_=c.c.size)
    sized = sa.select(
        *(c.c[col.name] for col in carried),
        c.c.due_at,
        c.c.message_size,
        c.c.over,
        sa.func.sum(read).over(order_by=order).label("upto"),
        sa.func.row_number().over(order_by=order).label("place"),
    ).subquery("sized")
    fits = sa.or_(
        sized.c.upto <= sa.bindparam("max_bytes", type_=sa.BigInteger()),
        sa.and_(sa.bindparam("first_always", type_=sa.Boolean()), sized.c.place == 1),
    )
    if lean:
        source: sa.FromClause = outbox.join(sized, outbox.c.id == sized.c.id)
        columns = _unless_oversize(row_columns, sized.c.over)
    else:
        source = sized
        columns = [sized.c[col.name] for col in ROW_COLUMNS]
    message_id = outbox.c.message_id if lean else sized.c.message_id
    too_large = sa.case((sized.c.over, sized.c.message_size)).label("oversize")
    return (
        sa.select(*columns, _sent_before(message_id, dialect), too_large, sized.c.due_at)
        .select_from(source)
        .where(fits)
        .order_by(sized.c.place)
    )


def within_budget(rows: Iterable[Sequence[Any]], max_bytes: int, first_always: bool) -> list[Any]:
    """The first of ``rows`` (a SQLite claim's, as they are read: ``claim_statement``) whose
    ``counted`` bytes, their last column, add up to at most ``max_bytes``, the first row
    whatever its size with ``first_always``: what the statement's cut returns elsewhere.
    Stops reading at the first row that does not fit (the sum only grows)."""
    taken: list[Any] = []
    upto = 0
    for row in rows:
        upto += row[-1]
        if upto > max_bytes and not (first_always and not taken):
            break
        taken.append(row)
    return taken


def _sent_before(message_id: sa.ColumnElement[str], dialect: sa.Dialect) -> sa.Label[bool]:
    """The dedupe: one probe of the sent log's primary key per row claimed, and one of the
    log of the releases before (``outbox_sent_legacy``), by the relay's own statement, so
    that no writer pays for it and no writer's snapshot decides it. Scalar subqueries, not
    EXISTS: PostgreSQL may plan EXISTS as a hash of the whole log. Where the log is
    journaled and recovering from a crash (it holds the journal's tail only), the runs
    answer for the rest (``relay.db.sentruns.looked_up``): looked up only then, the state
    row read once per statement. Where it is incomplete (the tail not copied back yet), a
    row not in the log is NULL, unknown: the relay looks its id up in the runs and the
    tail (``relay.db.sentruns.tail_sent``)."""
    key = sent_key(message_id)
    probes: list[sa.ColumnElement[bool]] = [
        sa.select(sa.true()).where(log.c.key == key).scalar_subquery().is_not(None)
        for log in (outbox_sent, outbox_sent_legacy)
    ]
    if of(dialect).journals_sent_log:
        probes.append(
            sa.case((complete(), sa.false()), (recovering(), looked_up(key)), else_=sa.null())
        )
    return sa.or_(*probes).label("sent_before")


def _unless_oversize(
    columns: list[sa.Label[Any]], over: sa.ColumnElement[bool]
) -> list[sa.ColumnElement[Any]]:
    """``columns``, with the payload and headers NULL where ``over``: never read."""
    return [
        sa.type_coerce(sa.case((over, sa.null()), else_=c.element), _RAW).label(c.name)
        if c.name in _NOT_READ_WHEN_OVERSIZE
        else c
        for c in columns
    ]


def _after_position(lean: bool) -> sa.ColumnElement[bool]:
    """The rows after the position bound as ``after_at``, ``after_id`` in the due order."""
    after_at = sa.bindparam("after_at", type_=_RAW)
    after_id = sa.bindparam("after_id", type_=sa.BigInteger())
    if lean:
        # The same test spelled out: MariaDB reads a row comparison as a filter, not as where
        # to start in the index (a claim read every row before the position).
        at = sa.type_coerce(outbox.c.next_attempt_at, _RAW)
        return sa.or_(at > after_at, sa.and_(at == after_at, outbox.c.id > after_id))
    return sa.tuple_(outbox.c.next_attempt_at, outbox.c.id) > sa.tuple_(after_at, after_id)
