"""The relay's side of the outbox: the ``Store`` the loop calls (``relay.ports``), on SQL.

Synchronous on purpose: the relay calls it from a worker thread (``asyncio.to_thread``) so
that pika's I/O loop on the event-loop thread keeps turning while a query runs, and
PostgreSQL (psycopg), MariaDB and MySQL (mysqlclient) and SQLite (sqlite3) work through one
tested code path instead of several async drivers.

What costs the database most is writing, so a claim writes nothing. Each relay owns
buckets of the outbox under a lease (``relay.buckets``, ``relay.db.buckets``; ``turn``
renews it), and claims, with a plain SELECT (``relay.db.due``), due rows of its own buckets
only: two relays never hold the same row, and no row is written to say which relay holds it.
The relay remembers the rows it holds (``relay.held``) and claims none of them again. The
ack, with ``keep_sent = ids``, deletes the row and logs its message id's 16-byte key in the
sent log (``relay.db.settles``). A claim that leased each row cost 142 B of WAL per row (its
HOT update and its row lock, ``pg_waldump``), a fifth of the INSERT's.

No transaction stays open while the broker is asked; a relay that dies keeps its buckets
until their lease runs out, and its rows are then another relay's. Every time that decides
is the database's (``relay.db.clock``): relays whose clocks disagree by more than a lease
still agree on every lease.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import sqlalchemy as sa

from relay.buckets import Fence, any_in, retired
from relay.constants import (
    BACKLOG_EXACT_ROWS,
    MAX_MESSAGE_SIZE,
    ORDERED_LOOK_ALL_S,
    ORDERED_LOOK_ALL_SHARE,
    ORDERED_LOOK_PER_ROW,
    PROTOCOL,
    READ_ON_MAX_S,
)
from relay.db.buckets import refresh
from relay.db.clock import database_time
from relay.db.decode import decode_row
from relay.db.dialects import BINARY_RESULTS, of
from relay.db.due import claim_statement, due_backlog, within_budget
from relay.db.engine import create_engine, db_errors
from relay.db.schema import ROW_COLUMNS, outbox
from relay.db.sentruns import tail_sent
from relay.db.settles import Settles
from relay.errors import StoreError
from relay.held import HeldRows
from relay.records import KEEP_IDS, KEEP_MESSAGES, PENDING, BacklogStats, OutboxRow, SettleBatch
from relay.redact import redact_url

log = logging.getLogger(__name__)

# A claimed row's columns (``relay.db.due.claim_statement``): those ``decode_row`` reads (the
# row's, whether it was sent before, its size if oversized), then its due time.
_DECODED = len(ROW_COLUMNS) + 2
_MESSAGE_ID = [c.name for c in ROW_COLUMNS].index("message_id")
_SENT_BEFORE = len(ROW_COLUMNS)  # after the row's columns: True, False, or None (unknown)
_ID = operator.attrgetter("id")


class ClaimStore:
    """The ``Store`` the loop sees (see ``relay.ports``), on a SQL database."""

    def __init__(
        self,
        url: str,
        owner: str,
        lease: float,
        *,
        margin: float = 0.0,
        max_message_size: int = MAX_MESSAGE_SIZE,
        ordered: bool = False,
        keep_sent: str = KEEP_IDS,
        protocol: int | None = PROTOCOL,
    ) -> None:
        """``lease``: seconds each turn leases this relay's buckets for; ``margin``: seconds of
        lease a bucket must have left for a claim to take its rows (``relay.lease``).
        ``max_message_size``: bytes of payload and headers beyond which a row is returned
        unread, to be parked. ``ordered``: claim a row with an ordering key only when no
        earlier row with the same key is pending (claimed or not), so that each key's rows
        are published and confirmed in id order, across retries, restarts and relays. Parked
        rows do not block their key: a row that cannot be sent must not stop the ones after
        it. ``keep_sent``: what stays of an acked row (``relay.records.KEEP_*``)."""
        if keep_sent not in (KEEP_IDS, KEEP_MESSAGES):
            raise ValueError(f"keep_sent must be {KEEP_IDS!r} or {KEEP_MESSAGES!r}")
        self.engine = create_engine(url, relay_session=True)
        dialect = self.engine.dialect
        # One statement is atomic by itself: run alone it needs no BEGIN and no COMMIT, two
        # round trips of the three a claim took (see ``_session``). Not on MySQL (its
        # dialect's ``autocommit``): switching autocommit there was a round trip at each
        # checkout and again at each return, outside SQLAlchemy's error handling (a
        # connection the server dropped raised the driver's own error there, which no retry
        # caught).
        self._autocommit = of(dialect).autocommit(self.engine)
        self.owner = owner
        self.lease = lease
        # ``relay.buckets.fence``: this relay's protocol (another only in tests standing in for
        # a relay of a release before: None for one before protocols), and why it stands
        # aside now, if it does.
        self.protocol = protocol
        self.fenced: Fence | None = None
        self.keep_sent = keep_sent
        self.max_message_size = max_message_size
        self._where = redact_url(url)
        self._settles = Settles(dialect, owner, keep_sent)
        # SQLite's claims are cut to the byte budget as their rows are read (``claim_statement``),
        # and its text values are read leniently, to be checked row by row (``decode_row``).
        self._cut_here = of(dialect).budget_cut_as_read
        self._unchecked_text = of(dialect).lenient_text
        self._claims = {
            (keyset, window): claim_statement(
                dialect, owner, margin, ordered=ordered, keyset=keyset, window=window
            )
            for keyset in (False, True)
            for window in (False, True)
        }
        self._tail_sent_statement = tail_sent(dialect)
        # With ordering, most claims look at the front of the backlog only; one looks at all
        # of it once this time has come (``ORDERED_LOOK_PER_ROW``).
        self._ordered = ordered
        self._look_all_at = time.monotonic()
        # With ordering, a claim reading on would pass the rows of keys with an earlier row
        # pending, which lie behind it once that row is settled (``relay.held``).
        self.held = HeldRows(read_on=not ordered)
        self._message_ids: dict[int, Any] = {}  # each held row's, as claimed
        self._from_start_at = time.monotonic()
        # The claims and the settles of one statement each keep a connection of their own
        # (``_Lane``); turns, hastes and the rest take one from the pool.
        self._claiming = _Lane(self._autocommit)
        self._settling = _Lane(self._autocommit)
        # The buckets to claim from. Claims and turns take ``_owning``: a bucket is never
        # given up while a claim that saw it as ours runs.
        self._claim_from: frozenset[int] = frozenset()
        self._owning = threading.Lock()
        # SQLite has one writer at a time and makes others wait by sleeping in growing steps;
        # the relay's own claim and settle threads queue on a lock instead, at once.
        one_writer = of(dialect).one_writer
        self._writing: AbstractContextManager[Any] = (
            threading.Lock() if one_writer else nullcontext()
        )

    def turn(self, active: bool = True) -> float:
        """Renew this relay's share of the outbox (``relay.db.buckets.refresh``): at least
        every third of a lease, and whenever the relay's ability to publish (``active``)
        changed. Until its first turn a relay owns nothing and claims nothing. Returns the
        seconds its buckets are leased for, from the turn's statement on."""
        with self._owning:
            held = self.held.ids()
            with self._session("turn", statements=2) as conn:
                claim_from, fenced, admits = refresh(
                    conn, self.owner, self.lease, held, active, protocol=self.protocol
                )
            # Retired is for good: the leaving turn of a retired relay (inactive, so it decides
            # no fence) does not end it, nor say that nothing stands in the way.
            if fenced is not self.fenced and self.fenced is not Fence.RETIRED:
                self._say_fenced(fenced)
            if fenced is Fence.RETIRED:
                self._claim_from = frozenset()
                raise retired(self.protocol, *admits)
            if claim_from - self._claim_from:
                self.held.restart()  # the new buckets' due rows may lie behind the position
            self._claim_from = claim_from
        return self.lease

    def _say_fenced(self, fenced: Fence | None) -> None:
        self.fenced = fenced
        if fenced is Fence.WAIT_FOR_OLDER:
            log.warning(
                "claiming nothing: relays of an older protocol (the release before) hold "
                "buckets; taking over once they have stopped and their leases run out",
                extra={"action": "fenced", "fence": fenced.value, "protocol": self.protocol},
            )
        elif fenced is Fence.YIELD_TO_NEWER:
            log.warning(
                "claiming nothing: a relay of a newer protocol is here; this relay's buckets "
                "go to it (stop this relay: its release is older)",
                extra={"action": "fenced", "fence": fenced.value, "protocol": self.protocol},
            )
        elif fenced is Fence.RETIRED:
            log.error(
                "claiming nothing: the schema admits relays of a newer protocol only; this "
                "relay's buckets are given up, and it stops",
                extra={"action": "fenced", "fence": fenced.value, "protocol": self.protocol},
            )
        else:
            log.info(
                "no relay of another protocol stands in the way any more",
                extra={"action": "unfenced", "protocol": self.protocol},
            )

    def claim(
        self,
        limit: int,
        max_bytes: int,
        first_always: bool = False,
        skip: Collection[str] = (),
    ) -> list[OutboxRow]:
        """Up to ``limit`` due rows of this relay's buckets whose payloads add up to at most
        ``max_bytes``, held by this relay, in id order (``relay.db.due.claim_statement``).
        With ``first_always``, the first due row is taken even when it alone is larger (the
        caller holds nothing else: it goes out alone). Rows for the exchanges in ``skip``
        are left (they are due for a claim without it)."""
        with self._owning:
            if time.monotonic() - self._from_start_at >= READ_ON_MAX_S:
                self.held.restart()
            after = self.held.after
            if after is None:
                self._from_start_at = time.monotonic()
            params: dict[str, Any] = {
                "skip": list(skip),
                "held": self.held.left_out(),
                "buckets": sorted(self._claim_from),
                "limit": limit,
                "max_bytes": max_bytes,
                "first_always": first_always,
                "max_message": self.max_message_size,
            }
            if after is not None:
                params["after_at"], params["after_id"] = after
            began = time.monotonic()
            window = self._ordered and began < self._look_all_at
            if window:
                params["scan"] = limit * ORDERED_LOOK_PER_ROW
            statement = self._claims[after is not None, window]
            options = {BINARY_RESULTS: True}
            # Closed when read: a SQLite statement left unread holds its snapshot open.
            with (
                self._session("claim", statements=1, lane=self._claiming) as conn,
                conn.execute(statement, params, execution_options=options) as result,
            ):
                found: Sequence[Any] = (
                    within_budget(result, max_bytes, first_always)
                    if self._cut_here
                    else result.all()
                )
            if self._ordered and not window:
                took = time.monotonic() - began
                self._look_all_at = began + max(ORDERED_LOOK_ALL_S, took / ORDERED_LOOK_ALL_SHARE)
            due = _DECODED  # each row's due time follows the columns decoded
            # Read on from the last row only if its due time can be bound back: on SQLite a
            # writer's garbage time comes as text that is not UTF-8 (relay.db.dialects.sqlite).
            last_at = found[-1][due] if found else None
            full = len(found) == limit and not (isinstance(last_at, str) and not last_at.isascii())
            # Before the rows are held: a lookup that fails leaves none held (held, no
            # claim of this relay would take them again, nor another's: an outside review).
            sent = self._tail_sent([r[0] for r in found if r[_SENT_BEFORE] is None])
            taken = self.held.claimed([(r[due], r[0]) for r in found], full)
        unchecked = self._unchecked_text
        kept = [r for r in found if r[0] in taken]
        rows = [decode_row(r[:due], self.max_message_size, unchecked) for r in kept]
        if sent:
            rows = [row._replace(sent_before=True) if row.id in sent else row for row in rows]
        # As claimed, for the settle to find the very rows (``relay.db.settles``).
        self._message_ids.update((r[0], r[_MESSAGE_ID]) for r in kept)
        rows.sort(key=_ID)
        return rows

    def _tail_sent(self, unknown: list[int]) -> set[int]:
        """Of the rows claimed while the sent log is incomplete (their dedupe unknown),
        those sent before, looked up in the runs and the journal's tail
        (``relay.db.sentruns.tail_sent``)."""
        if not unknown:
            return set()
        with self._session("claim", statements=1) as conn:
            return {int(i) for i in conn.scalars(self._tail_sent_statement, {"ids": unknown})}

    def may_hold(self, first: int, last: int) -> bool:
        return any_in(first, last, self._claim_from)

    def settle(self, batch: SettleBatch) -> None:
        if not batch:
            return
        statements = self._settles.statements(batch)
        lane = self._settling if statements == 1 else None
        with self._session("settle", statements=statements, lane=lane) as conn:
            self._settles.write(conn, batch, self._message_ids)
        # Only once committed: a claim that left these rows out saw them still held.
        settled = (*batch.sent, *(c.id for c in batch.changes), *batch.duplicates)
        self.held.settled(settled)
        for row_id in settled:
            self._message_ids.pop(row_id, None)

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
    def _session(
        self, what: str, *, statements: int, lane: _Lane | None = None
    ) -> Iterator[sa.Connection]:
        """A connection for ``statements`` writes: in autocommit mode for one, in a
        transaction for more (a settle's sent ids and its other outcomes commit together);
        ``lane``'s own if given (for one statement only). On PostgreSQL a claim in a
        transaction was BEGIN, UPDATE and COMMIT: three round trips, each a wake-up of the
        database backend and of the relay's worker thread on a busy machine; alone it is
        one."""
        with db_errors(what, self._where), self._writing:
            if lane is not None:
                with lane.connection() as conn:
                    yield conn
                return
            engine = self._autocommit if statements == 1 else self.engine
            with engine.begin() as conn:
                yield conn

    def backlog(self) -> BacklogStats:
        with db_errors("backlog", self._where), self._autocommit.connect() as conn:
            return due_backlog(conn, BACKLOG_EXACT_ROWS)

    def close(self) -> None:
        """Give up every bucket this relay holds no row of, and leave the relays alive: the
        others take its share at their next turn, not a lease later. Buckets of rows still
        held (outcomes that could not be recorded) run out with their lease."""
        try:
            self.turn(active=False)
        except StoreError as exc:
            log.warning("buckets left to run out: %s", exc, extra={"action": "leave_failed"})
        finally:
            self._claiming.close()
            self._settling.close()
            self.engine.dispose()


class _Lane:
    """A connection kept for one kind of call that the relay makes one at a time (its claims,
    its settles): each call then skips the pool's checkout and return. At a live stream,
    where a relay calls a few times a second and each call runs with cold caches, those were
    about a third of a small claim's CPU in the relay (a 50-row claim: 1.0 against 0.76 ms).
    A call that fails leaves its connection behind: the next one takes a new one."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._conn: sa.Connection | None = None
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[sa.Connection]:
        """The lane's connection, in a transaction of its own (in autocommit mode, none)."""
        with self._lock:
            if self._conn is None:
                self._conn = self._engine.connect()
            try:
                with self._conn.begin():
                    yield self._conn
            except BaseException:
                self._drop()
                raise

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        # Closed without the pool's reset: a kept connection may have been killed while it
        # waited (a server restart, KILL CONNECTION), and the reset's ROLLBACK on it would log
        # a traceback for nothing. The server rolls back whatever it had open.
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                conn.invalidate()
                conn.close()
