"""The relay's side of the outbox: claim due rows of its own buckets, settle them, backlog.

Synchronous on purpose: the relay calls it from a worker thread (``asyncio.to_thread``) so
that pika's I/O loop on the event-loop thread keeps turning while a query runs, and
PostgreSQL (psycopg), MariaDB and MySQL (mysqlclient) and SQLite (sqlite3) work through one
tested code path instead of several async drivers.

What costs the database most is writing, so a claim writes nothing. Each relay owns
buckets of the outbox under a lease (``relay.buckets``, ``relay.db.buckets``; ``turn``
renews it), and claims, with a plain SELECT, due rows of its own buckets only: two relays
never hold the same row, and no row is written to say which relay holds it. The relay
remembers the rows it holds (claimed, not yet settled) and claims none of them again. The
ack, with ``keep_sent = ids``, deletes the row and logs its message id's 16-byte key in the
sent log (in one statement on PostgreSQL). A claim that leased each row cost 142 B of WAL
per row (its HOT update and its row lock, ``pg_waldump``), a fifth of the INSERT's.

No transaction stays open while the broker is asked; a relay that dies keeps its buckets
until their lease runs out, and its rows are then another relay's. Every time that decides
is the database's (``relay.db.clock``): relays whose clocks disagree by more than a lease
still agree on every lease.

Claiming never uses a "last published id" cursor: ids are assigned at insert and committed
in another order, so a cursor skips rows that commit late. A claim reads on from where the
last one stopped in the due order (a keyset position, in memory) only while claims come
back full; the first claim that comes back short resets it, and the next one reads the due
rows from the start again, leaving out the rows this relay holds. A row that committed late
behind the position, or was left out (an earlier row of its key pending, its exchange
skipped), is so claimed once the relay has caught up. Reading every claim from the start
read the rows in flight again each time: 8.9 us of database CPU per row against 2.2 us
(``bench/claim_designs.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from relay.constants import (
    BACKLOG_EXACT_ROWS,
    IDS_PER_STATEMENT,
    LAST_ERROR_MAX_CHARS,
)
from relay.db.buckets import owned_by, owned_now, refresh
from relay.db.clock import database_time, seconds_since
from relay.db.engine import (
    BINARY_RESULTS,
    bounded_count,
    changes_parameters,
    changes_table,
    create_engine,
    db_errors,
    id_in,
    in_list,
)
from relay.db.schema import (
    DUPLICATES,
    ROW_COLUMNS,
    bucket_column,
    outbox,
    outbox_buckets,
    outbox_counters,
    outbox_sent,
    sent_key,
)
from relay.errors import StoreError
from relay.records import (
    KEEP_IDS,
    KEEP_MESSAGES,
    PARKED,
    PENDING,
    SENT,
    BacklogStats,
    OutboxRow,
    SettleBatch,
)
from relay.redact import redact_url

log = logging.getLogger(__name__)

# The claimed columns as the driver returns them, without SQLAlchemy's result processing:
# SQLite stores any value in any column, and one row's INTEGER payload or epoch created_at
# must not fail the claim of the whole batch; ``decode_row`` reads each row on its own.
_RAW_COLUMNS = [sa.type_coerce(c, sa.types.NullType()).label(c.name) for c in ROW_COLUMNS]
_TEXT = ("message_id", "exchange", "routing_key", "content_type")
# "The row is still pending" for the settle, which finds its rows by primary key: said so that
# the planner cannot prove ``status = 'pending'`` and so cannot pick the partial due index for
# it. Right after a bulk load, with statistics saying "few pending rows", it scanned every
# pending row in outbox_due_idx instead of looking up 500 ids (EXPLAIN ANALYZE in bench.run:
# 523 ms per settle, 96,500 index entries read and dropped). The check constraint allows
# these three statuses only, so the meaning is the same.
_STILL_PENDING = sa.and_(outbox.c.status != SENT, outbox.c.status != PARKED)
# A claimed row's place in the due order, as the driver returns it (``_RAW_COLUMNS``'s reason):
# bound back unchanged, it compares with the stored values as they compare among themselves.
_DUE_AT = sa.type_coerce(outbox.c.next_attempt_at, sa.types.NullType()).label("due_at")


def due_now() -> sa.ColumnElement[bool]:
    """A pending row that is due (rows a relay holds among them)."""
    return sa.and_(outbox.c.status == PENDING, outbox.c.next_attempt_at <= database_time())


def due_backlog(conn: sa.Connection) -> BacklogStats:
    """The due rows (those in flight among them), counted up to ``BACKLOG_EXACT_ROWS`` and
    estimated beyond (``relay.db.engine.bounded_count``): a ``count(*)`` of a 1M-row backlog
    every stats interval cost about 11 us per row relayed at 5,000 rows/s. The oldest due
    row's age is one probe of the due index."""
    due_ids = sa.select(outbox.c.id).where(due_now())
    oldest = sa.select(seconds_since(sa.func.min(outbox.c.next_attempt_at))).where(due_now())
    count = bounded_count(conn, due_ids, BACKLOG_EXACT_ROWS)
    age = conn.execute(oldest).scalar_one()
    return BacklogStats(due=count, oldest_due_age=max(0.0, age or 0.0))


# The types of a row's values, in ``ROW_COLUMNS`` order, in a well-formed row; created_at is
# any of the forms ``_time`` reads.
_OR_NULL = (str, type(None))
_PLAIN: tuple[type | tuple[type, ...], ...]
_PLAIN = (int, str, str, str, bytes, str, _OR_NULL, object, int, _OR_NULL, int, object)
_NAMES = (*(c.name for c in ROW_COLUMNS), "sent_before")


def decode_row(values: Sequence[Any]) -> OutboxRow:
    """A claimed row from the driver's values, in ``ROW_COLUMNS`` order, then whether its
    message id is in the sent log (``sent_before``; a bool, or 0/1). A row that cannot be
    read comes back with ``unreadable`` saying which column holds what, and is parked
    (``relay.message``).

    A row whose values all have their column's type is taken as it is, its time read:
    checking and converting each value one by one cost 3.3 us per row (``bench.run
    --profile``), a quarter of what the bare publisher spends on a whole message."""
    try:
        if all(map(isinstance, values, _PLAIN)):
            (
                rid,
                message_id,
                exchange,
                key,
                payload,
                content,
                headers,
                at,
                tries,
                error,
                sus,
                again,
            ) = values
            created = _time(at)
            return OutboxRow(
                rid,
                message_id,
                exchange,
                key,
                payload,
                content,
                headers,
                created,
                tries,
                error,
                bool(sus),
                None,
                bool(again),
            )
        raw = dict(zip(_NAMES, values, strict=True))
        return OutboxRow(
            id=raw["id"],
            message_id=_text(raw, "message_id"),
            exchange=_text(raw, "exchange"),
            routing_key=_text(raw, "routing_key"),
            payload=_payload(raw["payload"]),
            content_type=_text(raw, "content_type"),
            headers=None if raw["headers"] is None else _text(raw, "headers"),
            created_at=_time(raw["created_at"]),
            attempts=_attempts(raw["attempts"]),
            last_error=None if raw["last_error"] is None else str(raw["last_error"]),
            suspect=bool(raw["suspect"]),
            sent_before=bool(raw["sent_before"]),
        )
    except _Unreadable as exc:
        raw = dict(zip(_NAMES, values, strict=True))
        message_id = raw["message_id"] if isinstance(raw["message_id"], str) else ""
        attempts = raw["attempts"] if isinstance(raw["attempts"], int) else 0
        return OutboxRow(
            id=raw["id"],
            message_id=message_id,
            exchange="",
            routing_key="",
            payload=b"",
            content_type="",
            headers=None,
            created_at=datetime.fromtimestamp(0, UTC),
            attempts=attempts,
            unreadable=f"unreadable row: {exc}",
            sent_before=bool(raw["sent_before"]),
        )


class _Unreadable(ValueError):
    pass


def _stored(value: Any) -> str:
    kinds = {int: "an INTEGER", float: "a REAL", bytes: "a BLOB", memoryview: "a BLOB"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _text(raw: Mapping[Any, Any], column: str) -> str:
    value = raw[column]
    if not isinstance(value, str):
        raise _Unreadable(f"{column} is {_stored(value)}, not text")
    return value


def _payload(value: Any) -> bytes:
    if isinstance(value, bytes | memoryview):
        return bytes(value)
    if isinstance(value, str):  # written as text by plain SQL on SQLite: its UTF-8 bytes
        return value.encode("utf-8", "surrogatepass")
    raise _Unreadable(f"payload is {_stored(value)}, not bytes or text")


def _time(value: Any) -> datetime:
    """created_at: a timestamp (PostgreSQL), ISO-8601 text or Unix seconds (SQLite). An aware
    timestamp keeps its zone (only its instant is used): converting it cost 0.6 us a row."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return value
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise _Unreadable(f"created_at {value[:40]!r} is not an ISO-8601 time") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            moment = datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            raise _Unreadable(f"created_at {value!r} is not a time in Unix seconds") from None
    else:
        raise _Unreadable(f"created_at is {_stored(value)}, not a time")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _attempts(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Unreadable(f"attempts is {_stored(value)}, not a whole number")
    return value


class ClaimStore:
    """The ``Store`` the loop sees (see ``relay.ports``), on a SQL database."""

    def __init__(
        self,
        url: str,
        owner: str,
        lease: float,
        *,
        ordered: bool = False,
        keep_sent: str = KEEP_IDS,
    ) -> None:
        """``ordered``: claim a row with an ordering key only when no earlier row with the
        same key is pending (claimed or not), so that each key's rows are published and
        confirmed in id order, across retries, restarts and relays. Parked rows do not
        block their key: a row that cannot be sent must not stop the ones after it.
        ``keep_sent``: what stays of an acked row (``relay.records.KEEP_*``)."""
        if keep_sent not in (KEEP_IDS, KEEP_MESSAGES):
            raise ValueError(f"keep_sent must be {KEEP_IDS!r} or {KEEP_MESSAGES!r}")
        self.engine = create_engine(url, relay_session=True)
        # One statement is atomic by itself: run alone it needs no BEGIN and no COMMIT, two
        # round trips of the three a claim took (see ``_session``). Not on MySQL: its driver
        # sends no BEGIN anyway, and switching autocommit is a round trip at each checkout
        # and again at each return, outside SQLAlchemy's error handling (a connection the
        # server dropped raised the driver's own error there, which no retry caught).
        self._autocommit = (
            self.engine
            if self.engine.dialect.name == "mysql"
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        self.owner = owner
        self.lease = lease
        self.ordered = ordered
        self.keep_sent = keep_sent
        self._where = redact_url(url)
        # The rows bound as ``ids`` that are still pending: what an ack and a duplicate's drop
        # may change.
        self._pending_ids = sa.and_(id_in(outbox.c.id, self.engine.dialect), _STILL_PENDING)
        self._acked = self._ack_statements()
        self._drop = sa.delete(outbox).where(self._pending_ids)
        self._count_dropped = (
            sa.update(outbox_counters)
            .where(outbox_counters.c.name == DUPLICATES)
            .values(value=outbox_counters.c.value + sa.bindparam("dropped", type_=sa.BigInteger()))
        )
        # Held rows (claimed, not settled) and their place in the due order; the position
        # the next claim reads on from (None: from the start); the buckets to claim from.
        # Claims and turns take ``_owning`` (a bucket is never given up while a claim that
        # saw it as ours runs); ``_lock`` guards ``_held`` between the claim and settle
        # threads.
        self._held: dict[int, Any] = {}
        self._after: tuple[Any, int] | None = None
        # The held rows that lay beyond the position when a claim from the start set it:
        # the only held rows a claim reading on can meet, since every row claimed after it
        # lies behind the position. Scanning every held row (two windows' worth) for each
        # claim instead was 7% of the relay's CPU (py-spy, bench.run --profile).
        self._beyond: dict[int, Any] = {}
        self._claim_from: frozenset[int] = frozenset()
        self._owning = threading.Lock()
        self._lock = threading.Lock()
        # SQLite has one writer at a time and makes others wait by sleeping in growing steps;
        # the relay's own claim and settle threads queue on a lock instead, at once.
        sqlite = self.engine.dialect.name == "sqlite"
        self._writing: AbstractContextManager[Any] = threading.Lock() if sqlite else nullcontext()
        # SQLite 3.40 (Debian 12) has no octet_length; its length() of a BLOB is its bytes
        # (of a payload written as TEXT, its characters: at most 4 times fewer).
        self._size = (
            sa.func.length(outbox.c.payload) if sqlite else sa.func.octet_length(outbox.c.payload)
        )
        self._claims = {keyset: self._claim_statement(keyset) for keyset in (False, True)}

    def turn(self, active: bool = True) -> None:
        """Renew this relay's share of the outbox (``relay.db.buckets.refresh``): at least
        every third of a lease, and whenever the relay's ability to publish (``active``)
        changed. Until its first turn a relay owns nothing and claims nothing."""
        with self._owning:
            with self._lock:
                held = list(self._held)
            with self._session("turn", statements=2) as conn:
                claim_from = refresh(conn, self.owner, self.lease, held, active)
            if claim_from - self._claim_from:
                self._after = None  # the new buckets' due rows may lie behind the position
            self._claim_from = claim_from

    def claim(
        self,
        limit: int,
        max_bytes: int,
        first_always: bool = False,
        skip: Collection[str] = (),
    ) -> list[OutboxRow]:
        """Up to ``limit`` due rows of this relay's buckets whose payloads add up to at most
        ``max_bytes``, held by this relay, in id order. With ``first_always``, the first due
        row is taken even when it alone is larger (the caller holds nothing else: it goes out
        alone). Rows for the exchanges in ``skip`` are left (they are due for a claim without
        it).

        The payloads' sizes are the database's to tell (``octet_length`` reads a stored
        value's length, not the value): a claim never fetches more payload than it may
        hold. 600 rows of 1.5 MiB in claims of 500 rows had the relay at 4.3 GB."""
        with self._owning:
            after = self._after
            with self._lock:
                # Taken before the query's snapshot: a row settled (and so no longer held)
                # after this is gone from the outbox, or due again, in that snapshot.
                if after is None:
                    held = list(self._held)
                else:
                    self._beyond = {
                        i: at
                        for i, at in self._beyond.items()
                        if i in self._held and (at, i) > after
                    }
                    held = list(self._beyond)
            params: dict[str, Any] = {
                "skip": list(skip),
                "held": held,
                "buckets": sorted(self._claim_from),
                "limit": limit,
                "max_bytes": max_bytes,
                "first_always": first_always,
            }
            if after is not None:
                params["after_at"], params["after_id"] = after
            statement = self._claims[after is not None]
            with self._session("claim", statements=1) as conn:
                result = conn.execute(statement, params, execution_options={BINARY_RESULTS: True})
                found = result.all()
            position = (found[-1][-1], found[-1][0]) if len(found) == limit else None
            with self._lock:
                for r in found:
                    self._held[r[0]] = r[-1]
                if position is not None and after is None:
                    self._beyond = {i: at for i, at in self._held.items() if (at, i) > position}
            self._after = position
        rows = [decode_row(r[:-1]) for r in found]
        rows.sort(key=lambda r: r.id)
        return rows

    def _claim_statement(self, keyset: bool) -> sa.Select[Any]:
        """The claim's query, reading on after the position ``after_at``, ``after_id`` (with
        ``keyset``) or from the start; ``held``: the held rows it could meet, left out."""
        dialect = self.engine.dialect
        mine = owned_now(self.owner).where(
            in_list(outbox_buckets.c.bucket, "buckets", sa.SmallInteger(), dialect)
        )
        # MySQL: the candidates and their running sizes carry ids only, and the rows are read
        # by id at the end. Its derived tables are temporary tables, and one with a BLOB
        # column is an on-disk one: carrying the payloads through two of them cost MariaDB
        # 13.7 us of CPU per claimed row, ids only 7.7 us.
        lean = dialect.name == "mysql"
        carried = [outbox.c.id] if lean else _RAW_COLUMNS
        candidates = (
            sa.select(*carried, _DUE_AT, self._size.label("size"))
            .where(
                due_now(),
                self._one_of(bucket_column(outbox.c.id), mine),
                sa.not_(in_list(outbox.c.id, "held", sa.BigInteger(), dialect)),
                sa.not_(in_list(outbox.c.exchange, "skip", sa.Text(), dialect)),
            )
            .order_by(outbox.c.next_attempt_at, outbox.c.id)
            .limit(sa.bindparam("limit"))
        )
        if keyset:
            after_at = sa.bindparam("after_at", type_=sa.types.NullType())
            after_id = sa.bindparam("after_id", type_=sa.BigInteger())
            if lean:
                # The same test spelled out: MariaDB reads a row comparison as a filter, not
                # as where to start in the index (a claim read every row before the position).
                at = sa.type_coerce(outbox.c.next_attempt_at, sa.types.NullType())
                beyond = sa.or_(at > after_at, sa.and_(at == after_at, outbox.c.id > after_id))
            else:
                beyond = sa.tuple_(outbox.c.next_attempt_at, outbox.c.id) > sa.tuple_(
                    after_at, after_id
                )
            candidates = candidates.where(beyond)
        if self.ordered:
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
        c = candidates.subquery("candidate")
        order = (c.c.due_at, c.c.id)
        sized = sa.select(
            *(c.c[col.name] for col in carried),
            c.c.due_at,
            sa.func.sum(c.c.size).over(order_by=order).label("upto"),
            sa.func.row_number().over(order_by=order).label("place"),
        ).subquery("sized")
        fits = sa.or_(
            sized.c.upto <= sa.bindparam("max_bytes"),
            sa.and_(sa.bindparam("first_always", type_=sa.Boolean()), sized.c.place == 1),
        )
        if lean:
            source: sa.FromClause = outbox.join(sized, outbox.c.id == sized.c.id)
            columns: list[sa.ColumnElement[Any]] = [*_RAW_COLUMNS]
        else:
            source = sized
            columns = [sized.c[col.name] for col in ROW_COLUMNS]
        # The dedupe (see the module docstring): one probe of the sent log's primary key per
        # row claimed, by the relay's own statement, so that no writer pays for it and no
        # writer's snapshot decides it. A scalar subquery, not EXISTS: PostgreSQL may plan
        # EXISTS as a hash of the whole log.
        message_id = outbox.c.message_id if lean else sized.c.message_id
        logged = sa.select(sa.true()).where(outbox_sent.c.key == sent_key(message_id))
        sent_before = logged.scalar_subquery().is_not(None).label("sent_before")
        return (
            sa.select(*columns, sent_before, sized.c.due_at)
            .select_from(source)
            .where(fits)
            .order_by(sized.c.place)
        )

    def _one_of(
        self, value: sa.ColumnElement[Any], choices: sa.Select[Any]
    ) -> sa.ColumnElement[bool]:
        """``value IN (choices)``, with ``choices`` run exactly once.

        On PostgreSQL, ``IN (subquery)`` is a join the planner may turn around; with
        statistics taken while a table was empty and rows loaded since, it chose a nested
        loop that ran the subquery for every row (tests/integration/test_claim_plan.py).
        ``= ANY(ARRAY(subquery))`` is an InitPlan, run once, whatever the statistics say."""
        if self.engine.dialect.name == "postgresql":
            return value == sa.any_(sa.func.array(choices.scalar_subquery()))
        return value.in_(choices.scalar_subquery())

    def settle(self, batch: SettleBatch) -> None:
        if not batch:
            return
        # A failure is written only while the row's bucket is still ours: if another relay
        # took it, that relay may hold the row now, and its outcome decides. A lease that
        # ran out with the bucket taken by no one still leaves the row ours: dropping the
        # failure would hand a poison row its attempt back after every slow turn. An ack
        # is written regardless: it proves delivery whoever holds the row.
        change = changes_table(self.engine.dialect)
        changed = (
            sa.update(outbox)
            .where(
                outbox.c.id == change.c.id,
                _STILL_PENDING,
                self._one_of(bucket_column(outbox.c.id), owned_by(self.owner)),
            )
            .values(
                status=change.c.status,
                attempts=change.c.attempts,
                next_attempt_at=database_time(change.c.delay),
                last_error=change.c.last_error,
                suspect=change.c.suspect,
            )
        )
        chunks = range(0, len(batch.sent), IDS_PER_STATEMENT)
        duplicates = range(0, len(batch.duplicates), IDS_PER_STATEMENT)
        statements = (
            len(chunks) * len(self._acked)
            + bool(batch.changes)
            + (len(duplicates) + 1 if batch.duplicates else 0)
        )
        with self._session("settle", statements=statements) as conn:
            for i in chunks:
                ids = {"ids": list(batch.sent[i : i + IDS_PER_STATEMENT])}
                for statement in self._acked:
                    conn.execute(statement, ids)
            # A duplicate leaves whoever holds it: its message was delivered (the sent log
            # says so), and its first entry there stays. Counted as dropped, for ``relay
            # status``, only where this statement deleted it (two relays, one count).
            dropped = 0
            for i in duplicates:
                ids = {"ids": list(batch.duplicates[i : i + IDS_PER_STATEMENT])}
                dropped += conn.execute(self._drop, ids).rowcount
            if dropped:
                conn.execute(self._count_dropped, {"dropped": dropped})
            if batch.changes:
                changes = [
                    (
                        c.id,
                        c.status,
                        c.attempts,
                        c.delay,
                        c.last_error[:LAST_ERROR_MAX_CHARS],
                        c.suspect,
                    )
                    for c in batch.changes
                ]
                conn.execute(changed, changes_parameters(self.engine.dialect, changes))
        # Only once committed: a claim that left these rows out saw them still held.
        with self._lock:
            for row_id in batch.sent:
                self._held.pop(row_id, None)
            for c in batch.changes:
                self._held.pop(c.id, None)
            for row_id in batch.duplicates:
                self._held.pop(row_id, None)

    def _ack_statements(self) -> list[sa.Executable]:
        """What an ack writes, for the ids bound as ``ids``, in order.

        ``keep_sent = messages``: the row is marked sent. ``ids``: the row is deleted and its
        message id's key, id and times go to the sent log; on PostgreSQL in one statement
        (a data-modifying CTE), on SQLite and MySQL in two of one transaction. A key already
        logged (a message sent again) keeps its first entry.

        On PostgreSQL that test is a probe of the log's key, not ``ON CONFLICT DO NOTHING``:
        the latter is a speculative insertion, which writes a confirmation record per row,
        48 of the 552 bytes of WAL an acked row cost (``pg_waldump --stats``). Nothing else
        can insert the same key meanwhile: the key's row is unique in the outbox, and this
        statement is deleting it. The probe is a scalar subquery, run once per row on the
        primary key: as ``NOT EXISTS`` the planner made it a hash anti join that read the
        whole log every settle (``bench.dbcost``: 19 us of database CPU per row, not 13)."""
        pending = self._pending_ids
        if self.keep_sent == KEEP_MESSAGES:
            mark = sa.update(outbox).where(pending)
            return [mark.values(status=SENT, sent_at=database_time())]
        columns = ["key", "id", "created_at", "sent_at"]
        if self.engine.dialect.name == "postgresql":
            gone = (
                sa.delete(outbox)
                .where(pending)
                .returning(outbox.c.message_id, outbox.c.id, outbox.c.created_at)
                .cte("gone")
            )
            key = sent_key(gone.c.message_id)
            known = sa.select(outbox_sent.c.key).where(outbox_sent.c.key == key)
            logged = sa.select(key, gone.c.id, gone.c.created_at, database_time()).where(
                known.scalar_subquery().is_(None)
            )
            return [sa.insert(outbox_sent).from_select(columns, logged)]
        logged = sa.select(
            sent_key(outbox.c.message_id), outbox.c.id, outbox.c.created_at, database_time()
        ).where(pending)
        log_once: sa.Insert
        if self.engine.dialect.name == "mysql":
            # IGNORE, not ON DUPLICATE KEY UPDATE, which needs UPDATE on the log (the relay
            # role has none): IGNORE also lets a value too long for its column in truncated,
            # and none of these can be (a 16-byte key, an id, two times).
            log_once = sa.insert(outbox_sent).from_select(columns, logged).prefix_with("IGNORE")
        else:
            log_once = sqlite_insert(outbox_sent).from_select(columns, logged)
            log_once = log_once.on_conflict_do_nothing()
        return [log_once, sa.delete(outbox).where(pending)]

    def hasten(self, exchanges: Sequence[str]) -> int:
        """Only rows settled with a back-off move: rows a relay holds were due when claimed,
        and rows no attempt was made for keep their time (a writer's own
        ``next_attempt_at``)."""
        if not exchanges:
            return 0
        stmt = (
            sa.update(outbox)
            .where(
                outbox.c.status == PENDING,
                outbox.c.exchange.in_(exchanges),
                outbox.c.attempts > 0,
                outbox.c.next_attempt_at > database_time(),
            )
            .values(next_attempt_at=database_time())
        )
        with self._session("hasten", statements=1) as conn:
            return conn.execute(stmt).rowcount

    @contextmanager
    def _session(self, what: str, *, statements: int) -> Iterator[sa.Connection]:
        """A connection for ``statements`` writes: in autocommit mode for one, in a
        transaction for more (a settle's sent ids and its other outcomes commit together).
        On PostgreSQL a claim in a transaction was BEGIN, UPDATE and COMMIT: three round
        trips, each a wake-up of the database backend and of the relay's worker thread on a
        busy machine; alone it is one."""
        engine = self._autocommit if statements == 1 else self.engine
        with db_errors(what, self._where), self._writing, engine.begin() as conn:
            yield conn

    def backlog(self) -> BacklogStats:
        with db_errors("backlog", self._where), self._autocommit.connect() as conn:
            return due_backlog(conn)

    def close(self) -> None:
        """Give up every bucket this relay holds no row of, and leave the relays alive: the
        others take its share at their next turn, not a lease later. Buckets of rows still
        held (outcomes that could not be recorded) run out with their lease."""
        try:
            self.turn(active=False)
        except StoreError as exc:
            log.warning("buckets left to run out: %s", exc, extra={"action": "leave_failed"})
        finally:
            self.engine.dispose()
