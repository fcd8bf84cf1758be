"""Benchmark: the live regime. Writers at a steady rate well below the relays' capacity, the
relays keeping up, for minutes; what each relayed row costs the relays, the database and the
broker, sampled as it runs, beside a backlog drain and the writers' own INSERTs in the same run.

    .venv/bin/python -m bench.soak [--rate 2000] [--relays 2] [--minutes 4]
                                   [--sample-seconds 30] [--retention SECONDS]
                                   [--backlog-rows 100000] [--insert-seconds 30]
                                   [--multi-rows 50] [--multi-share 0.8]
                                   [--set RELAY_X=VALUE ...] [--summary-minutes 1]
                                   [--sent-log-entries N] [--sent-log-days 7] [--rounds 1]
                                   [--rewritten SHARE] [--pg-data DIR]
                                   [--checkout DIR] [--revision REV]

Starts a private RabbitMQ 3.10 node and a private PostgreSQL 15 (default durability:
``fsync``, full page writes, synchronous commits; ``pg_stat_statements`` loaded), and then:

1. **insert**: the writers alone, no relay, for ``--insert-seconds``: the database's CPU and
   WAL per row of the INSERTs (every server process; the rows stay, and are then removed
   with TRUNCATE, as a fresh outbox starts).
2. **backlog**: ``--relays`` relays started and sharing the buckets; ``--backlog-rows`` rows
   committed in one transaction and drained: the backlog regime's figures, in this run.
3. **live**: writers at ``--rate`` rows a second, ``--multi-share`` of them in transactions
   of ``--multi-rows`` rows and the rest one row a transaction, plain SQL through psycopg on
   connections of their own (in a process of their own), for ``--minutes``. A consumer acks
   everything and counts each message id.

Every ``--sample-seconds`` a sample is printed as one JSON line: rows written and relayed;
commit-to-ack p50 and p99 (``sent_at - created_at`` of the sent log's entries); CPU per
relayed row of the relays (their process trees), of the database (all of it, and split
into the writers' backends, the relays' backends and the rest: autovacuum, the checkpointer,
the WAL writer), and of the broker; WAL bytes and full-page images per relayed row; the
outbox's and the sent log's sizes with their indexes; dead tuples and autovacuum runs; and
pg_stat_statements' top statements of the interval (calls, rows, mean time, WAL). At the end
a summary compares the first ``--summary-minutes`` after the first sample with the last, and
sets the live regime's figures beside the backlog's and the INSERT's; nothing lost, no
duplicate beyond those the relays report republishing.

``--retention`` sets ``RELAY_RETENTION`` (and a purge every tenth of it) so that a soak
longer than the retention runs the purge at steady state. ``--sent-log-entries`` adds a second
database whose sent log holds that many entries (``aged-N`` ids, sent in time order over the
last ``--sent-log-days``, with their journal where the schema has one: the log as days of
relaying leave it), made once by plain SQL and kept with the cluster in ``--pg-data``; its
relays purge every minute with a retention of the log's age, so that it stays that large.
Each of ``--rounds`` runs the live phase (and the first the backlog) on a young log (a
database made again for it) and then on the aged one, each with relays of its own, and the
end prints each log's medians. ``--rewritten`` has that share of the writers' rows re-write
an id written 30 s before (a re-run), which the relays must drop: the claim's look-up of ids
sent before, and dedupe's exactness (the consumer must see each other id once). ``--set``
passes any other setting to every relay; ``--checkout`` runs the relays of another checkout
(a git worktree, or an exported commit: the code before a change), with ``--revision`` the
schema it runs on. By hand only: these machines are shared and noisy, so compare figures
within one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import pika
import psycopg
import sqlalchemy as sa

from devtools.broker import fresh_queue
from devtools.procfs import cpu_seconds, tree_cpu_seconds
from devtools.profiling import Profiler
from devtools.relayproc import RELAY, RelayProcess, relay_env, relay_from, wait_sharing
from devtools.scrape import http_get, metric
from devtools.servers import PostgresServer, RabbitNode, free_port, wait_until
from relay.db.engine import create_engine
from relay.db.migrate import migrate

QUEUE = "soak"
BODY = b"x" * 200
WRITER_APP = "soak-writer"
RELAY_APP = "outbox-relay"  # relay.db.dialects.postgresql.APPLICATION_NAME
YOUNG, AGED = "soak", "soak_aged"  # the databases
# Seconds of acks one settle carries at a stream (two lingers): the aged log's journal rows.
ACK_SECONDS = 0.05
DUPLICATES = 'relay_outcomes_total{outcome="duplicate"}'
# Single-row transactions one writer connection commits a second at most (each waits for
# its WAL flush): more are spread over more connections.
SINGLES_PER_WRITER = 150
# Entries an aging statement logs (``age_sent_log``): a line of progress each.
AGE_STEP_ENTRIES = 1_000_000
STATEMENTS_SHOWN = 6
# A re-written id (``--rewritten``) is one its stream wrote this many seconds before: sent by
# then, and so in the sent log (a row still in the outbox would fail the INSERT).
REWRITE_AGO_S = 30.0


# --- Writers (a process of their own) -------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One writer connection's transactions: ``rows`` rows each, ``per_s`` a second; one
    row in ``rewrite_every`` (0: none) writes again the id of the row written
    ``REWRITE_AGO_S`` before (a writer's re-run), which the relays must drop."""

    prefix: str
    rows: int
    per_s: float
    rewrite_every: int = 0

    def row_id(self, row: int) -> str:
        """The message id of the stream's ``row``-th row."""
        return f"{self.prefix}-{row // self.rows}-{row % self.rows}"


def _write(dsn: str, stream: Stream, stop: Any, written: Any, rewritten: Any) -> None:
    """Commit ``stream``'s transactions until ``stop``, paced on a schedule (a late one is
    caught up at once), counting rows in ``written`` (``rewritten``: those re-written)."""
    sql = "INSERT INTO outbox (message_id, routing_key, payload, content_type) VALUES " + ", ".join(
        ["(%s, %s, %s, 'application/octet-stream')"] * stream.rows
    )
    back = max(1, round(REWRITE_AGO_S * stream.per_s))  # transactions
    with psycopg.connect(dsn, application_name=WRITER_APP) as conn:
        start, n = time.monotonic(), 0
        while not stop.is_set():
            values: list[Any] = []
            body = stamped()
            again = 0
            for i in range(stream.rows):
                row = n * stream.rows + i
                if stream.rewrite_every and n > back and row % stream.rewrite_every == 0:
                    # A row ``back`` transactions before, not itself a re-write: its id was
                    # written, and sent.
                    earlier = row - back * stream.rows
                    earlier -= earlier % stream.rewrite_every == 0
                    values += [stream.row_id(earlier), QUEUE, body]
                    again += 1
                else:
                    values += [stream.row_id(row), QUEUE, body]
            with conn.transaction():
                conn.execute(sql, values)
            n += 1
            with written.get_lock():
                written.value += stream.rows
                rewritten.value += again
            wait = start + n / stream.per_s - time.monotonic()
            if wait > 0:
                stop.wait(wait)


def stamped() -> bytes:
    """A message body: this moment's wall clock, padded to the size of ``BODY``: the
    consumer's receipt less it is the message's insert-to-delivery time."""
    return f"{time.time():.6f} ".encode().ljust(len(BODY), b"x")


def streams(phase: str, args: argparse.Namespace, rewrite: bool) -> list[Stream]:
    """``--rate`` rows a second: ``--multi-share`` of them in transactions of
    ``--multi-rows`` on one connection, the rest one row a transaction, spread over enough
    connections (``SINGLES_PER_WRITER``); with ``rewrite``, ``--rewritten`` of them
    re-written ids."""
    multi = args.rate * args.multi_share
    singles = args.rate - multi
    every = round(1 / args.rewritten) if args.rewritten and rewrite else 0
    out = []
    if multi > 0:
        out.append(Stream(f"{phase}-m", args.multi_rows, multi / args.multi_rows, every))
    if singles > 0:
        connections = max(1, -(-int(singles) // SINGLES_PER_WRITER))
        out += [
            Stream(f"{phase}-s{k}", 1, singles / connections, every) for k in range(connections)
        ]
    return out


def _writers(dsn: str, plan: list[Stream], stop: Any, written: Any, rewritten: Any) -> None:
    threads = [
        threading.Thread(target=_write, args=(dsn, stream, stop, written, rewritten), daemon=True)
        for stream in plan
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass
class Writers:
    """The writer process: ``--rate`` rows a second, in two transaction sizes; re-writing
    ids (``--rewritten``) only with ``rewrite``: with no relay, the row an id re-writes is
    still in the outbox."""

    dsn: str
    phase: str
    args: argparse.Namespace
    rewrite: bool = True
    _ctx: Any = field(default_factory=lambda: multiprocessing.get_context("spawn"))

    def __post_init__(self) -> None:
        self.stop = self._ctx.Event()
        self.written: Synchronized[int] = self._ctx.Value("q", 0)
        self.rewritten: Synchronized[int] = self._ctx.Value("q", 0)
        plan = streams(self.phase, self.args, self.rewrite)
        self.proc = self._ctx.Process(
            target=_writers,
            args=(self.dsn, plan, self.stop, self.written, self.rewritten),
            daemon=True,
        )

    def __enter__(self) -> Writers:
        self.proc.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.proc.join(30)

    @property
    def rows(self) -> int:
        return int(self.written.value)


# --- The consumer ---------------------------------------------------------------------------


class Consumer(threading.Thread):
    """Acks every delivery of the queue, counting message ids (duplicates, lost)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seen: set[str] = set()
        self.deliveries = 0
        self._latencies: list[float] = []  # seconds, insert to delivery, of stamped bodies
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def latencies(self) -> list[float]:
        """Insert-to-delivery seconds of the stamped messages delivered since the last call."""
        with self._lock:
            out, self._latencies = self._latencies, []
        return out

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=2000)
        unacked, last_tag = 0, 0
        for method, props, body in channel.consume(QUEUE, inactivity_timeout=0.2):
            if method is not None:
                if not body.startswith(b"x"):
                    with self._lock:
                        self._latencies.append(time.time() - float(body.split(b" ", 1)[0]))
                self.deliveries += 1
                self.seen.add(props.message_id)
                unacked += 1
                last_tag = method.delivery_tag
            if unacked and (method is None or unacked >= 200):
                channel.basic_ack(last_tag, multiple=True)
                unacked = 0
            if self._stopping.is_set() and method is None:
                break
        channel.cancel()
        conn.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)


# --- What the database says -----------------------------------------------------------------

_SIZES = """
SELECT c.relname, pg_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i', 'p', 'I')
  AND (c.relname LIKE 'outbox%%') AND c.relname NOT LIKE 'outbox\\_relays%%'
  AND c.relname NOT LIKE 'outbox\\_buckets%%' AND c.relname NOT LIKE 'outbox\\_counters%%'
"""
_TABLES = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count
FROM pg_stat_user_tables WHERE relname LIKE 'outbox%%'
"""
_STATEMENTS = """
SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 70), calls, rows, total_exec_time,
       wal_bytes, wal_fpi
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC LIMIT %s
"""
_LATENCY = """
SELECT count(*), percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP
       (ORDER BY extract(epoch FROM sent_at - created_at))
FROM {entries} AS entry WHERE sent_at > %s AND sent_at <= %s
"""
# The sent log's entries by sent time: from the journal where the schema has one (migration
# 0015: the log has no time index there), else from the log (a --checkout before it).
_JOURNALED_ENTRIES = (
    "(SELECT j.sent_at, e.created_at FROM outbox_sent_journal j, "
    "unnest(j.created_at) AS e(created_at))"
)


class Postgres:
    """The readings of one PostgreSQL database, on a connection of the bench's own."""

    def __init__(self, server: PostgresServer, database: str) -> None:
        self.server = server
        self.name = database
        self.dsn = f"host=127.0.0.1 port={server.port} user=postgres dbname={database}"
        self.conn = psycopg.connect(self.dsn, autocommit=True, application_name="soak-bench")
        journaled = self.one("SELECT to_regclass('outbox_sent_journal') IS NOT NULL")[0]
        # The sent log's name: ``outbox_sent`` before migration 0015 (a --checkout's).
        self.log = "outbox_sent_log" if journaled else "outbox_sent"
        self.entries = _JOURNALED_ENTRIES if journaled else self.log
        # A table of the entries' sent times with an index on them (the oldest, at once).
        self.sent_times = "outbox_sent_journal" if journaled else self.log

    def one(self, sql: str, *params: Any) -> Any:
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, *params: Any) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    def now(self) -> Any:
        return self.one("SELECT now()")[0]

    def wal(self) -> tuple[int, int]:
        """WAL bytes written so far, and full-page images."""
        lsn = self.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")[0]
        fpi = self.one("SELECT wal_fpi FROM pg_stat_wal")[0]
        return int(lsn), int(fpi)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: every server process (``db``); and the living backends' by who
        connected them (``db_writers``, ``db_relays``). What a backend that ended used is in
        ``db`` only."""
        split = {"db_writers": 0.0, "db_relays": 0.0}
        for pid, app in self.all("SELECT pid, application_name FROM pg_stat_activity"):
            who = {WRITER_APP: "db_writers", RELAY_APP: "db_relays"}.get(app)
            if who:
                split[who] += cpu_seconds(pid)
        return {"db": tree_cpu_seconds(self.server.pid()), **split}

    def sizes(self) -> dict[str, int]:
        return {name: int(size) for name, size in self.all(_SIZES)}

    def tables(self) -> dict[str, dict[str, int]]:
        return {
            name: {"live": live, "dead": dead, "autovacuums": vac, "autoanalyzes": an}
            for name, live, dead, vac, an in self.all(_TABLES)
        }

    def statements(self) -> list[dict[str, Any]]:
        out = []
        for query, calls, rows, total_ms, wal_bytes, fpi in self.all(_STATEMENTS, STATEMENTS_SHOWN):
            out.append(
                {
                    "query": query,
                    "calls": calls,
                    "rows_per_call": round(rows / calls, 1) if calls else 0,
                    "mean_ms": round(total_ms / calls, 3) if calls else 0,
                    "total_ms": round(total_ms),
                    "wal_bytes": int(wal_bytes),
                    "wal_fpi": int(fpi),
                }
            )
        self.one("SELECT pg_stat_statements_reset()")
        return out

    def latency(self, since: Any, until: Any) -> tuple[int, float, float]:
        count, quantiles = self.one(_LATENCY.format(entries=self.entries), since, until)
        p50, p99 = quantiles or (0.0, 0.0)
        return int(count), 1000 * (p50 or 0.0), 1000 * (p99 or 0.0)

    def sent(self) -> int:
        return int(self.one(f"SELECT count(*) FROM {self.log}")[0])


# --- Readings and samples -------------------------------------------------------------------


@dataclass
class Reading:
    at: float  # monotonic seconds
    db_time: Any  # the database's now(): the sent log's entries between two readings
    written: int  # rows the writers committed so far
    cpu: dict[str, float]  # CPU seconds so far, by process (``Postgres.cpu``, relays, broker)
    wal: tuple[int, int]  # WAL bytes and full-page images so far
    republished: float  # rows the relays published more than once so far


@dataclass
class Bench:
    db: Postgres
    node: RabbitNode
    relays: list[RelayProcess] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    consumer: Consumer | None = None

    def reading(self, written: int = 0) -> Reading:
        cpu = self.db.cpu()
        cpu["relays"] = sum(tree_cpu_seconds(r.pid) for r in self.relays)
        cpu["broker"] = tree_cpu_seconds(self.node.beam_pid())
        republished = 0.0
        for port in self.ports:
            status, text = http_get(f"http://127.0.0.1:{port}/metrics")
            if status == 200:
                republished += metric(text, "relay_republished_total")
        return Reading(time.monotonic(), self.db.now(), written, cpu, self.db.wal(), republished)


def used(before: Reading, after: Reading, rows: int) -> dict[str, float]:
    """What was used between two readings: CPU seconds by process, WAL bytes and full-page
    images, and the ``rows`` relayed (or written) meanwhile."""
    out = {k: after.cpu[k] - before.cpu[k] for k in after.cpu}
    out.update(wal=after.wal[0] - before.wal[0], fpi=after.wal[1] - before.wal[1], rows=rows)
    return out


def per_row(totals: dict[str, float]) -> dict[str, float]:
    """``used``'s totals (or their sums) per row: CPU microseconds, WAL bytes."""
    rows = max(totals["rows"], 1)
    cpu = ("relays", "db", "db_writers", "db_relays", "broker")
    out = {f"{k}_us": round(totals[k] * 1e6 / rows, 1) for k in cpu}
    out["db_other_us"] = round(out["db_us"] - out["db_writers_us"] - out["db_relays_us"], 1)
    out["wal_bytes"] = round(totals["wal"] / rows, 1)
    out["wal_fpi_per_1k"] = round(totals["fpi"] * 1000 / rows, 2)
    return out


def sample(bench: Bench, before: Reading, after: Reading) -> dict[str, Any]:
    db = bench.db
    relayed, p50, p99 = db.latency(before.db_time, after.db_time)
    seconds = after.at - before.at
    delivered = sorted(bench.consumer.latencies()) if bench.consumer else []
    d50, d99 = (
        (1000 * delivered[len(delivered) // 2], 1000 * delivered[len(delivered) * 99 // 100])
        if delivered
        else (0.0, 0.0)
    )
    return {
        "t": None,
        "seconds": round(seconds, 1),
        "written_per_s": round((after.written - before.written) / seconds, 1),
        "relayed_per_s": round(relayed / seconds, 1),
        # Insert to delivery at the consumer (the broker has it: acked, or about to be).
        "p50_ms": round(d50, 1),
        "p99_ms": round(d99, 1),
        # Insert to the settle that recorded the ack (the sent log's times).
        "settled_p50_ms": round(p50, 1),
        "settled_p99_ms": round(p99, 1),
        "used": (totals := used(before, after, relayed)),
        "per_row": per_row(totals),
        "republished": after.republished - before.republished,
        "sizes_mb": {k: round(v / 2**20, 2) for k, v in sorted(db.sizes().items())},
        "tables": db.tables(),
        "statements": db.statements(),
    }


# --- Phases ---------------------------------------------------------------------------------


def insert_phase(bench: Bench, dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """The writers alone: what their INSERTs cost the database, per row. Their rows are then
    removed (TRUNCATE), as a fresh outbox starts."""
    bench.db.statements()  # reset
    before = bench.reading()
    with Writers(dsn, f"insert-{args.run}", args, rewrite=False) as writers:
        time.sleep(args.insert_seconds)
    after = bench.reading(writers.rows)
    result = {
        "rows_per_s": round(writers.rows / (after.at - before.at), 1),
        "per_row": per_row(used(before, after, writers.rows)),
        "statements": bench.db.statements(),
    }
    bench.db.conn.execute("TRUNCATE outbox")
    return result


def age_sent_log(
    db: Postgres, entries: int, days: float, per_ack: int, *, build_indexes: bool
) -> None:
    """``entries`` sent log entries of other message ids (``aged-N``, keys in no order), sent
    in time order over the last ``days`` days, ``per_ack`` entries an ack: the log as the
    relays leave it after that many days (its key index that large), without waiting days;
    and its journal (one row an ack), where the schema has one. With ``build_indexes`` the
    log's indexes are dropped first and built again after (the same definitions; hours less
    for a log of a hundred million, but its key index's pages fuller than acks leave them).
    A checkpoint follows, as one would have since."""
    journal = db.one("SELECT to_regclass('outbox_sent_journal') IS NOT NULL")[0]
    indexes = [
        (row[0], row[1])
        for row in db.all(
            "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = %s::regclass",
            db.log,
        )
    ]
    if build_indexes:
        db.conn.execute(f"ALTER TABLE {db.log} DROP CONSTRAINT {db.log}_pkey")
        for name, _ in indexes:
            db.conn.execute(f"DROP INDEX IF EXISTS {name}")
    acks = -(-entries // per_ack)
    at = db.now()
    times = (
        "SELECT g, %(at)s::timestamptz - make_interval(secs => %(span)s * (1 - g::float8 / "
        "%(acks)s)) AS t FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g"
    )
    log = (
        f"INSERT INTO {db.log} (key, id, created_at, sent_at) "
        "SELECT md5('aged-' || i)::uuid, -i, t, t FROM (" + times + ") AS ack, "
        "generate_series(g * %(per)s + 1, g * %(per)s + %(per)s) AS i"
    )
    rows = (
        "INSERT INTO outbox_sent_journal (sent_at, id, message_keys, ids, created_at) "
        "SELECT t, -(g * %(per)s + %(per)s), "
        "ARRAY(SELECT md5('aged-' || i)::uuid FROM generate_series(g * %(per)s + 1, "
        "g * %(per)s + %(per)s) AS i ORDER BY i), "
        "ARRAY(SELECT -i FROM generate_series(g * %(per)s + 1, g * %(per)s + %(per)s) AS i "
        "ORDER BY i), array_fill(t, ARRAY[%(per)s]) FROM (" + times + ") AS ack"
    )
    step = max(1, AGE_STEP_ENTRIES // per_ack)
    started = time.monotonic()
    for first in range(0, acks, step):
        params = {
            "at": at,
            "span": days * 86_400,
            "acks": acks,
            "first": first,
            "last": min(acks, first + step) - 1,
            "per": per_ack,
        }
        db.conn.execute(log, params)
        if journal:
            db.conn.execute(rows, params)
        done = min(acks, first + step) * per_ack
        print(f"  {done} entries, {time.monotonic() - started:.0f} s", flush=True)
    if build_indexes:
        db.conn.execute("SET maintenance_work_mem = '1GB'")
        for name, definition in indexes:
            if name == f"{db.log}_pkey":
                db.conn.execute(f"ALTER TABLE {db.log} ADD CONSTRAINT {name} PRIMARY KEY (key)")
            else:
                db.conn.execute(definition)
        print(f"  indexes built, {time.monotonic() - started:.0f} s", flush=True)
    db.conn.execute(f"VACUUM ANALYZE {db.log}")
    if journal:
        db.conn.execute("VACUUM ANALYZE outbox_sent_journal")
    db.conn.execute("CREATE TABLE soak_aged (entries bigint)")
    db.conn.execute("INSERT INTO soak_aged VALUES (%s)", (acks * per_ack,))
    db.conn.execute("CHECKPOINT")


def backlog_phase(bench: Bench, url: str, rows: int, run: str) -> dict[str, Any]:
    """``rows`` rows committed at once, due a moment later (so that the reading is taken
    between the commit and the first claim), drained by the relays."""
    engine = create_engine(url)
    due_in = 2.0
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO outbox (message_id, routing_key, payload, content_type, "
                    "next_attempt_at) SELECT :run || '-backlog-' || i, :queue, :body, "
                    "'application/octet-stream', now() + make_interval(secs => :due) "
                    "FROM generate_series(1, :rows) AS i"
                ),
                {"queue": QUEUE, "body": BODY, "due": due_in, "rows": rows, "run": run},
            )
        before = bench.reading()
        start = bench.db.sent()
        wait_until(lambda: bench.db.sent() - start >= rows, 600, "the backlog drained")
        after = bench.reading()
        # From the moment the rows were due to the last one's ack.
        seconds = bench.db.one(
            "SELECT extract(epoch FROM max(sent_at) - min(created_at)) - %s "
            f"FROM {bench.db.entries} AS entry WHERE sent_at > %s",
            due_in,
            before.db_time,
        )[0]
    finally:
        engine.dispose()
    return {
        "rows": rows,
        "rows_per_s": round(rows / float(seconds), 1),
        "per_row": per_row(used(before, after, rows)),
        "statements": bench.db.statements(),
    }


def live_phase(
    bench: Bench, dsn: str, args: argparse.Namespace, log: Any, phase: str
) -> tuple[list[dict[str, Any]], int, int]:
    """The writers at ``--rate`` for ``--minutes``, a sample every ``--sample-seconds``;
    the samples, the rows written and those of them re-written."""
    samples = []
    started = time.monotonic()
    bench.db.statements()  # reset
    with Writers(dsn, phase, args) as writers:
        before = bench.reading(0)
        end = started + args.minutes * 60
        while (now := time.monotonic()) < end:
            time.sleep(min(args.sample_seconds, end - now))
            after = bench.reading(writers.rows)
            s = sample(bench, before, after)
            s["t"] = round(after.at - started)
            samples.append(s)
            print(json.dumps(s), file=log, flush=True)
            brief = s["per_row"]
            print(
                f"  t={s['t']:>5}s written {s['written_per_s']:>7.0f}/s relayed "
                f"{s['relayed_per_s']:>7.0f}/s p50 {s['p50_ms']:>5.1f} p99 {s['p99_ms']:>5.1f} ms"
                f" (settled p99 {s['settled_p99_ms']:.0f})"
                f" | us/row relays {brief['relays_us']:>6.1f} db {brief['db_us']:>6.1f}"
                f" (writers {brief['db_writers_us']:.1f}, relays {brief['db_relays_us']:.1f},"
                f" other {brief['db_other_us']:.1f}) broker {brief['broker_us']:.1f}"
                f" | WAL {brief['wal_bytes']:.0f} B, FPI {brief['wal_fpi_per_1k']:.1f}/1k"
                f" | sent log {sum(v for k, v in s['sizes_mb'].items() if 'sent' in k):.1f} MB",
                flush=True,
            )
            before = after
    return samples, writers.rows, int(writers.rewritten.value)


def window(samples: list[dict[str, Any]], minutes: float, last: bool) -> dict[str, float]:
    """The first (after the first sample: warm-up) or last ``minutes``: per row, what was
    used over the whole window (a checkpoint's full-page images fall in one sample);
    latencies, the samples' medians."""
    body = samples[1:] or samples
    seconds = 0.0
    chosen = []
    for s in reversed(body) if last else body:
        if seconds >= minutes * 60:
            break
        chosen.append(s)
        seconds += s["seconds"]
    totals = {k: sum(s["used"][k] for s in chosen) for k in chosen[0]["used"]}
    out: dict[str, float] = per_row(totals)
    for k in ("relayed_per_s", "p50_ms", "p99_ms", "settled_p99_ms"):
        out[k] = statistics.median(s[k] for s in chosen)
    out["p99_ms_max"] = max(s["p99_ms"] for s in chosen)
    latest = chosen[0 if last else -1]["sizes_mb"]
    out["sent_log_mb"] = sum(v for k, v in latest.items() if "sent" in k)
    out["minutes"] = round(seconds / 60, 1)
    return out


def summary(
    insert: dict[str, Any],
    backlog: dict[str, Any] | None,
    samples: list[dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    first = window(samples, args.summary_minutes, last=False)
    last = window(samples, args.summary_minutes, last=True)
    ins = insert["per_row"]
    out: dict[str, Any] = {"first": first, "last": last, "insert": ins}
    live = last
    # The database's work for the relays: all of it less what the INSERTs cost alone.
    relay_db = live["db_us"] - ins["db_us"]
    relay_wal = live["wal_bytes"] - ins["wal_bytes"]
    out["ratios"] = {
        "db_cpu_for_relaying / insert": round(relay_db / ins["db_us"], 2),
        "wal_for_relaying / insert": round(relay_wal / ins["wal_bytes"], 2),
        "last / first: wal": round(last["wal_bytes"] / first["wal_bytes"], 2),
        "last / first: db cpu": round(last["db_us"] / first["db_us"], 2),
    }
    if backlog:
        b = backlog["per_row"]
        out["backlog"] = b
        out["ratios"]["relays_cpu live / backlog"] = round(live["relays_us"] / b["relays_us"], 2)
        out["ratios"]["db_cpu_for_relaying backlog / insert"] = round(
            (b["db_us"]) / ins["db_us"], 2
        )
    return out


@dataclass
class Cluster:
    """The servers of a soak: RabbitMQ, and PostgreSQL in ``--pg-data`` (kept) or a temporary
    directory, its young database made again for every round and its aged one kept."""

    node: RabbitNode
    pg: PostgresServer
    tmp: Path
    log: Any
    settings: dict[str, str]


def database(pg: PostgresServer, name: str, revision: str, fresh: bool) -> str:
    """The database ``name``, migrated to ``revision`` (made again if ``fresh``); its URL."""
    if fresh:
        pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    if not pg.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'").strip():
        pg.create_database(name)
        pg.psql("CREATE EXTENSION pg_stat_statements", database=name)
    url = pg.url(name)
    migrate(url, revision)
    return url


def aged_database(cluster: Cluster, args: argparse.Namespace) -> str:
    """The database of ``--sent-log-entries`` aged entries, made once per cluster."""
    url = database(cluster.pg, AGED, args.revision, fresh=False)
    db = Postgres(cluster.pg, AGED)
    try:
        have = db.one("SELECT to_regclass('soak_aged') IS NOT NULL")[0]
        if have and db.one("SELECT entries FROM soak_aged")[0] >= args.sent_log_entries:
            return url
        print(f"an aged sent log: {args.sent_log_entries} entries", flush=True)
        per_ack = max(1, round(args.rate * ACK_SECONDS))
        age_sent_log(
            db,
            args.sent_log_entries,
            args.sent_log_days,
            per_ack,
            build_indexes=args.age_by_index_build,
        )
    finally:
        db.conn.close()
    return url


def run_phase(
    cluster: Cluster,
    name: str,
    url: str,
    args: argparse.Namespace,
    insert: dict[str, Any],
    *,
    round_: int,
    backlog_rows: int,
) -> dict[str, Any]:
    """Relays on ``url``: a backlog of ``backlog_rows`` drained, then the live stream; its
    summary. The relays of an aged log keep it at its size: their retention is its age, and
    they purge every minute."""
    bench = Bench(Postgres(cluster.pg, sa.make_url(url).database or ""), cluster.node)
    settings = dict(cluster.settings)
    if name == "aged" and not args.retention:
        oldest = f"SELECT extract(epoch FROM now() - min(sent_at)) FROM {bench.db.sent_times}"
        age = bench.db.one(oldest)[0]
        settings.update(RELAY_RETENTION=str(max(60, int(age) - 60)), RELAY_PURGE_INTERVAL="60")
    with ExitStack() as stack:
        stack.callback(bench.db.conn.close)
        consumer = bench.consumer = Consumer(cluster.node.url)
        consumer.start()
        bench.ports = [free_port() for _ in range(args.relays)]
        for i, port in enumerate(bench.ports):
            env = relay_env(
                RELAY_DATABASE_URL=url,
                RELAY_AMQP_URL=cluster.node.url,
                RELAY_METRICS_PORT=str(port),
                RELAY_METRICS_HOST="127.0.0.1",
                RELAY_NAME=f"soak-{name}-{i}",
                RELAY_LOG_LEVEL="warning",
                **settings,
            )
            command = relay_from(args.checkout) if args.checkout else (*RELAY, "run")
            log_path = cluster.tmp / f"relay-{name}-{args.run}-{i}.log"
            proc = RelayProcess(env, log_path, command).start()
            stack.callback(proc.stop)
            bench.relays.append(proc)
        wait_sharing(url, bench.ports)
        backlog = None
        if backlog_rows:
            print(f"backlog: {backlog_rows} rows drained by {args.relays} relays", flush=True)
            backlog = backlog_phase(bench, url, backlog_rows, f"{args.run}-{name}")
            print(json.dumps({"backlog": backlog}), file=cluster.log, flush=True)
        print(f"live, {name} log: {args.rate:g} rows/s for {args.minutes:g} min", flush=True)
        profiler = None
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            profiler = Profiler(bench.relays[0].pid, args.profile / f"relay-live-{name}.txt")
        phase = f"live-{args.run}-{name}-{round_}"
        samples, written, rewritten = live_phase(bench, bench.db.dsn, args, cluster.log, phase)
        if profiler is not None:
            print("\nfirst relay (py-spy): % of samples on top / anywhere")
            for function, top, anywhere in profiler.stop():
                print(f"  {top:5.1f} {anywhere:5.1f}  {function}")
        expected = written - rewritten + backlog_rows
        wait_until(lambda: len(consumer.seen) >= expected, 120, "every message consumed")
        consumer.stop()
        dropped = sum(
            metric(http_get(f"http://127.0.0.1:{port}/metrics")[1], DUPLICATES)
            for port in bench.ports
        )
    result = summary(insert, backlog, samples, args)
    result.update(
        log=name,
        rate=args.rate,
        relays=args.relays,
        minutes=args.minutes,
        settings=settings,
        written=written,
        rewritten=rewritten,
        dropped=dropped,
        lost=expected - len(consumer.seen),
        duplicates=consumer.deliveries - len(consumer.seen),
        republished=sum(s["republished"] for s in samples),
    )
    print_summary(result)
    print(json.dumps({"summary": result}), file=cluster.log, flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=4)
    parser.add_argument("--sample-seconds", type=float, default=30)
    parser.add_argument("--summary-minutes", type=float, default=1)
    parser.add_argument("--retention", type=float, default=0)
    parser.add_argument("--backlog-rows", type=int, default=100_000)
    parser.add_argument("--insert-seconds", type=float, default=30)
    parser.add_argument("--multi-rows", type=int, default=50)
    parser.add_argument("--multi-share", type=float, default=0.8)
    parser.add_argument(
        "--checkout", type=Path, help="run the relays of that checkout (a git worktree)"
    )
    parser.add_argument(
        "--revision", default="head", help="migrate to this revision (for --checkout's relays)"
    )
    parser.add_argument(
        "--sent-log-entries",
        type=int,
        default=0,
        help="also run each round on a sent log this large (as after days of relaying)",
    )
    parser.add_argument(
        "--sent-log-days", type=float, default=7, help="the aged log's entries span this long"
    )
    parser.add_argument(
        "--age-by-index-build",
        action="store_true",
        help="build the aged log's indexes after its entries (faster; fuller index pages)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds, young and aged in turn")
    parser.add_argument(
        "--rewritten", type=float, default=0, help="share of rows re-writing a sent id"
    )
    parser.add_argument(
        "--pg-data", type=Path, help="PostgreSQL's directory, kept with its aged log"
    )
    parser.add_argument("--set", action="append", default=[], metavar="RELAY_X=VALUE")
    parser.add_argument("--log", type=Path, help="where the JSON samples go (default: stdout)")
    parser.add_argument(
        "--profile", type=Path, help="record the first relay with py-spy through the live phase"
    )
    args = parser.parse_args()
    args.run = uuid.uuid4().hex[:6]  # in every message id: a kept log has the runs' before
    # A SIGTERM (a timeout's) stops the bench as Ctrl-C does: the servers and relays stop.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    settings = dict(item.split("=", 1) for item in args.set)
    if args.retention:
        settings.update(
            RELAY_RETENTION=str(args.retention),
            RELAY_PURGE_INTERVAL=str(max(1.0, args.retention / 10)),
        )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relay-soak-")))
        node = RabbitNode(tmp / "rabbit", name="relay-soak")
        pg = PostgresServer(
            args.pg_data or tmp / "pg",
            settings=["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.max=1000"],
        )
        node.start()
        stack.callback(node.stop)
        pg.start()
        stack.callback(pg.stop)
        fresh_queue(node.url, QUEUE)
        log = args.log.open("w") if args.log else sys.stdout
        cluster = Cluster(node, pg, tmp, log, settings)
        aged = aged_database(cluster, args) if args.sent_log_entries else None
        young = database(pg, YOUNG, args.revision, fresh=True)
        print(f"insert: the writers alone for {args.insert_seconds:g} s", flush=True)
        young_db = Postgres(pg, YOUNG)
        insert = insert_phase(Bench(young_db, node), young_db.dsn, args)
        young_db.conn.close()
        print(json.dumps({"insert": insert}), file=log, flush=True)
        results: dict[str, list[dict[str, Any]]] = {"young": [], "aged": []}
        for round_ in range(args.rounds):
            if round_:
                young = database(pg, YOUNG, args.revision, fresh=True)
            logs = [("young", young)] + ([("aged", aged)] if aged else [])
            for name, url in logs:
                backlog = args.backlog_rows if round_ == 0 and name == "young" else 0
                result = run_phase(
                    cluster, name, url, args, insert, round_=round_, backlog_rows=backlog
                )
                results[name].append(result)
        if aged or args.rounds > 1:
            print_rounds(results, insert["per_row"])
    return 0


def print_rounds(results: dict[str, list[dict[str, Any]]], insert: dict[str, float]) -> None:
    """Each log's medians over the rounds (their last minutes), beside the INSERT's."""
    keys = (
        "db_relays_us",
        "db_us",
        "relays_us",
        "wal_bytes",
        "wal_fpi_per_1k",
        "p99_ms",
        "sent_log_mb",
    )
    print(f"\n{'medians of the rounds':<28}" + "".join(f"{k:>14}" for k in keys))
    print(f"{'insert alone':<28}" + "".join(f"{insert.get(k, 0):>14.1f}" for k in keys))
    for name, rounds in results.items():
        if rounds:
            cells = [statistics.median(r["last"][k] for r in rounds) for k in keys]
            print(f"{name + ' log':<28}" + "".join(f"{v:>14.1f}" for v in cells))
    for name, rounds in results.items():
        for ratio in ("db_cpu_for_relaying / insert", "wal_for_relaying / insert"):
            if rounds:
                values = [r["ratios"][ratio] for r in rounds]
                print(f"{name} log, {ratio:<34} {statistics.median(values):.2f} ({values})")


def print_summary(result: dict[str, Any]) -> None:
    print()
    keys = (
        "relayed_per_s",
        "p50_ms",
        "p99_ms",
        "settled_p99_ms",
        "relays_us",
        "db_us",
        "db_writers_us",
        "db_relays_us",
        "db_other_us",
        "broker_us",
        "wal_bytes",
        "wal_fpi_per_1k",
        "sent_log_mb",
    )
    columns = [
        ("insert alone", result["insert"]),
        ("backlog", result.get("backlog", {})),
        ("live, first", result["first"]),
        ("live, last", result["last"]),
    ]
    print(f"{'per row':<16}" + "".join(f"{name:>14}" for name, _ in columns))
    for k in keys:
        cells = "".join(
            f"{values[k]:>14.1f}" if isinstance(values.get(k), (int, float)) else f"{'':>14}"
            for _, values in columns
        )
        print(f"{k:<16}{cells}")
    print()
    for name, value in result["ratios"].items():
        print(f"{name:<44} {value}")
    print(
        f"written {result['written']} ({result['rewritten']} of them re-written, "
        f"{result['dropped']:g} dropped), lost {result['lost']}, duplicates "
        f"{result['duplicates']} (republished {result['republished']:g})"
    )


if __name__ == "__main__":
    sys.exit(main())
