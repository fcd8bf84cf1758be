"""Benchmark: what an ack costs the sent log once the log is old, for each design of it.

    .venv/bin/python -m bench.sentlog_age [--entries 12000000] [--rate 100]
                                          [--checkpoint-seconds 300] [--batch 5]
                                          [--cycles 3] [--designs logged,unlogged,...]
                                          [--data DIR] [--purge] [--rewritten 0.01]

The sent log's write cost per ack depends on how many acks arrive between two checkpoints
(``full_page_writes``: the first change to a page after a checkpoint writes the whole page),
not on the time they take, so this bench plays a checkpoint interval of ``--rate`` acks a
second (``--rate x --checkpoint-seconds`` acks) as fast as the database takes them and then
runs CHECKPOINT itself (the server's own checkpoints are spaced past any cycle). Each design
has a schema of its own in one private PostgreSQL 15 (default settings otherwise), aged once to
``--entries`` entries by plain SQL (their keys are MD5s, their sent times spread over the last
7 days) and kept in ``--data`` for the next run. Then, per cycle: CHECKPOINT; the cycle's acks
in statements of ``--batch`` new message ids each, every one preceded by a claim's probe of
``--batch`` ids (``--rewritten`` of them sent before); with ``--purge``, the oldest
entries of as many acks deleted as the design deletes them, and VACUUM. Measured per ack: WAL
bytes and full-page images (``pg_stat_wal``), the CPU of the backends that acked and that
probed (from /proc), and the purge's WAL. The first cycle warms up; the others' medians are
printed, one JSON line per design.

Designs (``DESIGNS``): ``logged`` (the sent log before migration 0015: a table with the key's
B-tree and the time's), the same with ``wal_compression`` lz4 or zstd, ``ordered`` (keys that
arrive in time order, as UUIDv7 message ids would give), ``generations`` (a current generation
of one checkpoint interval, compacted once into sorted key arrays per generation, probed
generation by generation), ``unlogged`` (no WAL, nothing after a crash) and ``journal`` (the
log unlogged, each ack's entries also written, as one row, to a logged journal it is rebuilt
from after a crash: migration 0015). By hand only: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

from devtools.procfs import cpu_seconds, tree_cpu_seconds
from devtools.servers import MariaDBServer, PostgresServer, wait_until
from relay.db.migrate import migrate

HORIZON_S = 7 * 86_400
AGE_STEP = 1_000_000  # entries per aging statement
PURGE_CHUNK = 5000
# Keys per row of a closed generation (``generations``): 64 uuids are 1 KB, under TOAST's
# threshold, so a row is read with its page.
PACKED_KEYS = 64


@dataclass(frozen=True)
class Design:
    """A sent log's layout: ``schema`` holds its tables (designs that differ only by a session
    setting share one); ``session``: settings of the acking connection."""

    schema: str
    tables: tuple[str, ...]
    age: str  # SQL aging entries %(first)s to %(last)s of %(total)s
    aged: tuple[str, ...]  # SQL run once aged (%(batch)s: entries an ack logs)
    ack: str  # SQL logging the ids %(ids)s (text[]) as rows %(nums)s (bigint[])
    probe: str  # SQL probing the ids %(ids)s
    purge: tuple[str, ...]  # SQL deleting (at most) %(count)s of the oldest entries, in chunks
    vacuum: tuple[str, ...]
    session: tuple[str, ...] = ()


def _log_table(schema: str, unlogged: bool) -> tuple[str, ...]:
    """The log; unlogged, with its journal (``journal``: the design ``unlogged`` leaves it
    unwritten)."""
    kind = "UNLOGGED TABLE" if unlogged else "TABLE"
    journal = (
        f"CREATE TABLE {schema}.journal (sent_at timestamptz NOT NULL, keys uuid[] NOT NULL, "
        "ids bigint[] NOT NULL, created_at timestamptz[] NOT NULL)",
        f"CREATE INDEX ON {schema}.journal (sent_at)",
    )
    return (
        f"CREATE {kind} {schema}.log (key uuid PRIMARY KEY, id bigint NOT NULL, "
        "created_at timestamptz NOT NULL, sent_at timestamptz NOT NULL)",
        f"CREATE INDEX ON {schema}.log (sent_at)",
        *(journal if unlogged else ()),
    )


# The journal of the aged log: its entries in rows of an ack's, as acks wrote them.
_JOURNAL_AGED = (
    "INSERT INTO unlogged.journal SELECT max(sent_at), array_agg(key), array_agg(id), "
    "array_agg(created_at) FROM unlogged.log GROUP BY (-id - 1) / %(batch)s "
    "ORDER BY (-id - 1) / %(batch)s",
)


def _aged(key: str) -> str:
    """Entries ``first`` to ``last`` of ``total``, sent in order over the last 7 days."""
    return (
        f"SELECT {key} AS key, -i AS id, t AS created_at, t AS sent_at FROM ("
        f"SELECT i, now() - make_interval(secs => {HORIZON_S} * (1 - i::float8 / %(total)s)) AS t "
        "FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) AS aged"
    )


_RANDOM_KEY = "md5('aged-' || i)::uuid"
_NEW = "unnest(%(ids)s::text[], %(nums)s::bigint[]) AS new(m, n)"
_PROBE_ONE = "(SELECT true FROM {schema}.log WHERE key = {key}) IS NOT NULL"


def _plain(schema: str, unlogged: bool, session: tuple[str, ...] = ()) -> Design:
    log = f"{schema}.log"
    return Design(
        schema=schema,
        tables=_log_table(schema, unlogged),
        age=f"INSERT INTO {log} {_aged(_RANDOM_KEY)}",
        aged=_JOURNAL_AGED if unlogged else (),
        ack=(
            f"INSERT INTO {log} (key, id, created_at, sent_at) "
            f"SELECT md5(m)::uuid, n, now(), statement_timestamp() FROM {_NEW} "
            f"WHERE (SELECT key FROM {log} WHERE key = md5(m)::uuid) IS NULL"
        ),
        probe=f"SELECT {_PROBE_ONE.format(schema=schema, key='md5(m)::uuid')} "
        "FROM unnest(%(ids)s::text[]) AS m",
        purge=(
            f"DELETE FROM {log} WHERE key IN "
            f"(SELECT key FROM {log} ORDER BY sent_at LIMIT %(count)s)",
        ),
        vacuum=(f"VACUUM {log}",),
        session=session,
    )


def _journal() -> Design:
    plain = _plain("unlogged", unlogged=True)
    log, journal = "unlogged.log", "unlogged.journal"
    return Design(
        schema="unlogged",
        tables=plain.tables,
        age=plain.age,
        aged=plain.aged,
        ack=(
            f"WITH logged AS (INSERT INTO {log} (key, id, created_at, sent_at) "
            f"SELECT md5(m)::uuid, n, now(), statement_timestamp() FROM {_NEW} "
            "ON CONFLICT DO NOTHING RETURNING key, id, created_at) "
            f"INSERT INTO {journal} SELECT statement_timestamp(), array_agg(key), array_agg(id), "
            "array_agg(created_at) FROM logged HAVING count(*) > 0"
        ),
        probe=plain.probe,
        purge=(
            *plain.purge,
            f"DELETE FROM {journal} WHERE ctid IN (SELECT ctid FROM {journal} ORDER BY sent_at "
            "LIMIT greatest(1, %(count)s / %(batch)s))",
        ),
        vacuum=(*plain.vacuum, f"VACUUM {journal}"),
    )


# A time-ordered key (``ordered``): a UUIDv7's layout, the milliseconds of its time, then
# random bits; the message ids are such UUIDs (``uuid7``), and the key is the id itself.
_ORDERED_AGED = (
    "(lpad(to_hex((extract(epoch FROM now() - make_interval(secs => "
    f"{HORIZON_S} * (1 - i::float8 / %(total)s))) * 1000)::bigint), 12, '0') "
    "|| substr(md5('aged-' || i), 13))::uuid"
)


def uuid7(serial: int) -> str:
    """A UUIDv7-like id: this millisecond, then ``serial``'s bits and random ones."""
    ms = int(time.time() * 1000)
    return str(uuid.UUID(int=(ms << 80) | ((serial & 0xFFFF) << 64) | uuid.uuid4().int >> 64))


def _ordered() -> Design:
    plain = _plain("ordered", unlogged=False)
    log = "ordered.log"
    return Design(
        schema="ordered",
        tables=plain.tables,
        age=f"INSERT INTO {log} {_aged(_ORDERED_AGED)}",
        aged=(),
        ack=(
            f"INSERT INTO {log} (key, id, created_at, sent_at) "
            f"SELECT m::uuid, n, now(), statement_timestamp() FROM {_NEW} "
            f"WHERE (SELECT key FROM {log} WHERE key = m::uuid) IS NULL"
        ),
        probe=f"SELECT {_PROBE_ONE.format(schema='ordered', key='m::uuid')} "
        "FROM unnest(%(ids)s::text[]) AS m",
        purge=plain.purge,
        vacuum=plain.vacuum,
    )


def _block(key: str, blocks: str) -> str:
    """A key's block of its generation: its first 31 bits modulo the generation's blocks."""
    return f"((('x' || substr({key}::text, 1, 8))::bit(32)::int & 2147483647) %% {blocks})"


def _generations(per_generation: int) -> Design:
    """``per_generation`` entries a generation (a checkpoint interval's acks)."""
    blocks = max(1, per_generation // PACKED_KEYS)
    key = "md5(m)::uuid"
    return Design(
        schema="generations",
        tables=(
            "CREATE TABLE generations.log (key uuid PRIMARY KEY, id bigint NOT NULL, "
            "created_at timestamptz NOT NULL, sent_at timestamptz NOT NULL)",
            "CREATE TABLE generations.packed (gen int, block int, keys uuid[] NOT NULL, "
            "PRIMARY KEY (gen, block))",
        ),
        age=(
            "INSERT INTO generations.packed SELECT gen, block, array_agg(key ORDER BY key) FROM "
            f"(SELECT {_RANDOM_KEY} AS key, (i - 1) / {per_generation} AS gen FROM "
            "generate_series(%(first)s::bigint, %(last)s::bigint) AS i) AS aged, "
            f"LATERAL (SELECT {_block('key', str(blocks))} AS block) AS b GROUP BY gen, block"
        ),
        aged=(),
        ack=(
            "INSERT INTO generations.log (key, id, created_at, sent_at) "
            f"SELECT {key}, n, now(), statement_timestamp() FROM {_NEW} "
            f"WHERE (SELECT key FROM generations.log WHERE key = {key}) IS NULL"
        ),
        probe=(
            f"SELECT {_PROBE_ONE.format(schema='generations', key=key)} OR EXISTS (SELECT 1 FROM "
            "generations.packed WHERE gen = ANY(%(generations)s::int[]) AND block = "
            f"{_block(key, str(blocks))} AND {key} = ANY(keys)) FROM unnest(%(ids)s::text[]) AS m"
        ),
        # The oldest generation goes whole; the current one is compacted at each cycle's end.
        purge=(
            "DELETE FROM generations.packed WHERE gen = (SELECT min(gen) FROM generations.packed)",
        ),
        vacuum=("VACUUM generations.packed",),
    )


def _compact_generation(conn: psycopg.Connection[Any], per_generation: int) -> bool:
    """The current generation, once it holds ``per_generation`` entries, sorted into arrays
    of its keys by block, under the next generation number; its table emptied (TRUNCATE:
    nothing per entry). Whether it was full."""
    current = conn.execute("SELECT count(*) FROM generations.log").fetchone()
    if current is None or current[0] < per_generation:
        return False
    blocks = max(1, per_generation // PACKED_KEYS)
    conn.execute(
        "INSERT INTO generations.packed SELECT (SELECT max(gen) + 1 FROM generations.packed), "
        f"block, array_agg(key ORDER BY key) FROM generations.log, LATERAL (SELECT "
        f"{_block('key', str(blocks))} AS block) AS b GROUP BY block",
        {},
    )
    conn.execute("TRUNCATE generations.log")
    return True


def designs(per_generation: int) -> dict[str, Design]:
    return {
        "logged": _plain("logged", unlogged=False),
        "logged-lz4": _plain("logged", unlogged=False, session=("SET wal_compression = lz4",)),
        "logged-zstd": _plain("logged", unlogged=False, session=("SET wal_compression = zstd",)),
        "ordered": _ordered(),
        "generations": _generations(per_generation),
        "unlogged": _plain("unlogged", unlogged=True),
        "journal": _journal(),
    }


class Database:
    def __init__(self, pg: PostgresServer) -> None:
        self.pg = pg
        self.conninfo = f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres"
        self.control = psycopg.connect(self.conninfo, autocommit=True)

    def one(self, sql: str, params: Any = None) -> Any:
        row = self.control.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def worker(self, session: tuple[str, ...] = ()) -> tuple[psycopg.Connection[Any], int]:
        conn = psycopg.connect(self.conninfo, autocommit=True)
        for statement in session:
            conn.execute(statement)
        return conn, int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]

    def wal(self, *workers: psycopg.Connection[Any]) -> tuple[int, int, str]:
        """WAL bytes and full-page images so far, the workers' statistics flushed first, and
        the position in the WAL."""
        for conn in workers:
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT 1")
        time.sleep(0.2)
        self.one("SELECT pg_stat_force_next_flush()")
        at = str(self.one("SELECT pg_current_wal_insert_lsn()"))
        lsn = int(self.one("SELECT pg_wal_lsn_diff(%s::pg_lsn, '0/0')", (at,)))
        fpi = int(self.one("SELECT wal_fpi FROM pg_stat_wal"))
        return lsn, fpi, at

    def waldump(self, name: str, what: str, start: str, end: str) -> None:
        """``pg_waldump --stats=record`` of the WAL from ``start`` to ``end``: its records'
        largest kinds, printed."""
        wait_until(
            lambda: bool(self.one("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (end,))),
            10,
            "the WAL flushed",
        )
        found = subprocess.run(
            [
                str(self.pg.bin / "pg_waldump"),
                "--stats=record",
                "-p",
                str(self.pg.data / "pg_wal"),
                "-s",
                start,
                "-e",
                end,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if found.returncode:
            print(f"    waldump {name} {what}: {found.stderr.strip()}")
        # Type, N, record size, FPI size, combined size: the percentages left out.
        rows = [
            re.sub(r"[(\[][^)\]]*[)\]]", " ", line).split() for line in found.stdout.splitlines()
        ]
        rows = [r for r in rows if len(r) == 5 and "/" in r[0] and r[4].isdigit()]
        rows.sort(key=lambda r: -int(r[4]))
        shown = ", ".join(f"{r[0]} {r[1]}x {r[4]} B (FPI {r[3]})" for r in rows[:6])
        print(f"    waldump {name} {what}: {shown}")


def prepare(
    db: Database, name: str, design: Design, *, entries: int, batch: int, per_generation: int
) -> None:
    """Make the design's tables and age them to ``entries``, unless a run before did."""
    if db.one("SELECT to_regclass(%s)", (f"{design.schema}.aged",)) is not None:
        return
    print(f"  aging {name} to {entries} entries", flush=True)
    started = time.monotonic()
    db.control.execute(f"DROP SCHEMA IF EXISTS {design.schema} CASCADE")
    db.control.execute(f"CREATE SCHEMA {design.schema}")
    for statement in design.tables:
        db.control.execute(statement)
    # A step of whole generations (``generations``: a generation's rows in one statement).
    step = max(1, AGE_STEP // per_generation) * per_generation
    for first in range(1, entries + 1, step):
        last = min(entries, first + step - 1)
        db.control.execute(design.age, {"first": first, "last": last, "total": entries})
        print(f"    {last} entries, {time.monotonic() - started:.0f} s", flush=True)
    for statement in design.aged:
        db.control.execute(statement, {"batch": batch})
    for table in ("log", "packed", "journal"):
        if db.one("SELECT to_regclass(%s)", (f"{design.schema}.{table}",)) is not None:
            db.control.execute(f"VACUUM ANALYZE {design.schema}.{table}")
    db.control.execute(f"CREATE TABLE {design.schema}.aged (entries bigint)")
    db.control.execute(f"INSERT INTO {design.schema}.aged VALUES (%s)", (entries,))
    db.control.execute("CHECKPOINT")
    print(f"  aged in {time.monotonic() - started:.0f} s", flush=True)


def cycle(
    db: Database,
    name: str,
    design: Design,
    *,
    args: argparse.Namespace,
    serial: Callable[[], int],
    sent: list[str],
) -> dict[str, float]:
    """One checkpoint interval's acks and probes (and purge): what each cost."""
    acks = int(args.rate * args.checkpoint_seconds)
    acker, acker_pid = db.worker(design.session)
    prober, prober_pid = db.worker()
    try:
        generations: list[int] = []
        if name == "generations":
            generations = [
                r[0] for r in db.control.execute("SELECT DISTINCT gen FROM generations.packed")
            ]
        db.control.execute("CHECKPOINT")
        wal0 = db.wal(acker, prober)
        cpu0 = (cpu_seconds(acker_pid), cpu_seconds(prober_pid), tree_cpu_seconds(db.pg.pid()))
        # Ids sent before, for the probes' share of re-written ones: this run's.
        rewritten = max(0, round(args.batch * args.rewritten))
        done = 0
        while done < acks:
            first = serial()
            if name == "ordered":
                ids = [uuid7(first * args.batch + i) for i in range(args.batch)]
            else:
                ids = [f"m-{first}-{i}" for i in range(args.batch)]
            again = [sent[(first * 7919 + i) % len(sent)] for i in range(rewritten) if sent]
            prober.execute(
                design.probe,
                {"ids": ids[: args.batch - rewritten] + again, "generations": generations},
            )
            acker.execute(
                design.ack,
                {"ids": ids, "nums": [first * args.batch + i for i in range(args.batch)]},
            )
            done += args.batch
            sent.extend(ids[:1])
        wal1 = db.wal(acker, prober)
        if args.waldump:
            db.waldump(name, "acks", wal0[2], wal1[2])
        cpu1 = (cpu_seconds(acker_pid), cpu_seconds(prober_pid), tree_cpu_seconds(db.pg.pid()))
        purge_wal = purge_fpi = 0
        if args.purge:
            per_generation = int(args.rate * (args.generation_seconds or args.checkpoint_seconds))
            left = acks
            if name == "generations":  # the oldest generation goes when one is compacted
                left = int(_compact_generation(acker, per_generation))
            while left > 0:
                count = min(left, PURGE_CHUNK)
                for statement in design.purge:
                    acker.execute(statement, {"batch": args.batch, "count": count})
                left -= count
            for statement in design.vacuum:
                acker.execute(statement)
            wal2 = db.wal(acker, prober)
            if args.waldump:
                db.waldump(name, "purge", wal1[2], wal2[2])
            purge_wal, purge_fpi = wal2[0] - wal1[0], wal2[1] - wal1[1]
    finally:
        acker.close()
        prober.close()
    return {
        "wal_per_ack": (wal1[0] - wal0[0]) / acks,
        "fpi_per_1k_acks": 1000 * (wal1[1] - wal0[1]) / acks,
        "ack_cpu_us": 1e6 * (cpu1[0] - cpu0[0]) / acks,
        "probe_cpu_us": 1e6 * (cpu1[1] - cpu0[1]) / acks,
        "db_cpu_us": 1e6 * (cpu1[2] - cpu0[2]) / acks,
        "purge_wal_per_entry": purge_wal / acks,
        "purge_fpi_per_1k": 1000 * purge_fpi / acks,
    }


# --- MariaDB -----------------------------------------------------------------------------------
# InnoDB's redo log holds no page images (a page torn by a crash is restored from the
# doublewrite buffer), so its log's age shows, if at all, as data pages written.
_MARIADB_STATUS = (
    "Innodb_lsn_current",
    "Innodb_pages_written",
    "Innodb_dblwr_pages_written",
    "Innodb_buffer_pool_reads",
)


def mariadb(args: argparse.Namespace) -> None:
    """The relay's own sent log (its migrations) on MariaDB with its defaults (a 128 MB
    buffer pool, the doublewrite buffer, a flush per commit): a young one and one aged to
    ``--entries``, in databases of one server (kept in ``--data``; aged once by a server with
    a larger buffer pool, for speed), each cycle of acks and probes paced at ``--rate`` for
    ``--checkpoint-seconds``: per ack, the redo log's bytes, the data pages written (and the
    doublewrite buffer's), buffer pool misses, and the server's CPU."""
    base = args.data or Path(f"/tmp/sentlog-age-{uuid.uuid4().hex[:8]}")
    ager = MariaDBServer(base, more=["--innodb-buffer-pool-size=2G"])
    ager.start()
    try:
        for name, entries in (("young", 0), ("aged", args.entries)):
            _mariadb_prepare(ager, name, entries)
    finally:
        ager.stop()
    server = MariaDBServer(base)
    server.start()
    try:
        results: dict[str, list[dict[str, float]]] = {"young": [], "aged": []}
        serial = int(time.time() * 1000)
        for i in range(args.cycles + 1):
            for name, rounds in results.items():
                measured = _mariadb_cycle(server, name, args, serial)
                serial += 1_000_000
                print(f"  cycle {i} {name}: {json.dumps(measured)}", flush=True)
                if i:
                    rounds.append(measured)
        for name, rounds in results.items():
            medians = {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]}
            entries = args.entries if name == "aged" else 0
            print(json.dumps({"database": "mariadb", "log": name, "entries": entries, **medians}))
    finally:
        server.stop()


def _mariadb_prepare(server: MariaDBServer, name: str, entries: int) -> None:
    database = f"sentlog_{name}"
    there = server.sql(f"SHOW DATABASES LIKE '{database}'").strip()
    if there and server.sql("SHOW TABLES LIKE 'aged'", database).strip():
        return
    server.sql(f"DROP DATABASE IF EXISTS {database}")
    server.create_database(database)
    migrate(server.url(database))
    engine = sa.create_engine(server.url(database), isolation_level="AUTOCOMMIT")
    started = time.monotonic()
    try:
        with engine.connect() as conn:
            for first in range(1, entries + 1, AGE_STEP):
                last = min(entries, first + AGE_STEP - 1)
                conn.exec_driver_sql(
                    "INSERT INTO outbox_sent_log (`key`, id, created_at, sent_at) "
                    "SELECT unhex(md5(concat('aged-', seq))), -seq, t, t FROM (SELECT seq, "
                    f"utc_timestamp(6) - INTERVAL ({HORIZON_S} * (1 - seq / {entries})) SECOND "
                    f"AS t FROM seq_{first}_to_{last}) AS aged"
                )
                print(f"    {name}: {last} entries, {time.monotonic() - started:.0f} s", flush=True)
            conn.exec_driver_sql("CREATE TABLE aged (entries bigint)")
            conn.exec_driver_sql(f"INSERT INTO aged VALUES ({entries})")
    finally:
        engine.dispose()


def _mariadb_cycle(
    server: MariaDBServer, name: str, args: argparse.Namespace, serial: int
) -> dict[str, float]:
    acks = int(args.rate * args.checkpoint_seconds)
    engine = sa.create_engine(server.url(f"sentlog_{name}"), isolation_level="AUTOCOMMIT")
    conn = engine.connect()

    def status() -> dict[str, float]:
        rows = conn.exec_driver_sql("SHOW GLOBAL STATUS").all()
        found = {k: float(v) for k, v in rows if k in _MARIADB_STATUS}
        return {**found, "cpu": tree_cpu_seconds(server.pid())}

    values = ", ".join(["(unhex(md5(%s)), %s, utc_timestamp(6), utc_timestamp(6))"] * args.batch)
    ack = f"INSERT IGNORE INTO outbox_sent_log (`key`, id, created_at, sent_at) VALUES {values}"
    probe = (
        "SELECT count(*) FROM outbox_sent_log WHERE `key` IN ("
        + ", ".join(["unhex(md5(%s))"] * args.batch)
        + ")"
    )
    before = status()
    started = time.monotonic()
    done = 0
    while done < acks:
        ids = [f"m-{serial + done + i}" for i in range(args.batch)]
        conn.exec_driver_sql(probe, tuple(ids)).all()
        conn.exec_driver_sql(
            ack, tuple(x for i, m in enumerate(ids) for x in (m, serial + done + i))
        )
        done += args.batch
        wait = started + done / args.rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    after = status()
    conn.close()
    engine.dispose()
    per = {k: (after[k] - before[k]) / acks for k in before}
    return {
        "redo_per_ack": round(per["Innodb_lsn_current"], 1),
        "pages_written_per_1k": round(1000 * per["Innodb_pages_written"], 1),
        "doublewrite_pages_per_1k": round(1000 * per["Innodb_dblwr_pages_written"], 1),
        "pool_misses_per_1k": round(1000 * per["Innodb_buffer_pool_reads"], 1),
        "server_cpu_us": round(1e6 * per["cpu"], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=12_000_000)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--checkpoint-seconds", type=float, default=300)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--rewritten", type=float, default=0.0)
    parser.add_argument("--purge", action="store_true")
    parser.add_argument(
        "--generation-seconds",
        type=float,
        default=0,
        help="a generation's length (generations; default: a checkpoint interval)",
    )
    parser.add_argument("--waldump", action="store_true", help="the WAL's records by kind")
    parser.add_argument("--designs", default="logged,unlogged,journal")
    parser.add_argument("--data", type=Path, help="the cluster's directory, kept for the next run")
    parser.add_argument("--database", choices=("postgresql", "mariadb"), default="postgresql")
    args = parser.parse_args()
    if args.database == "mariadb":
        mariadb(args)
        return 0
    per_generation = int(args.rate * (args.generation_seconds or args.checkpoint_seconds))
    chosen = designs(per_generation)
    names = args.designs.split(",")
    unknown = [n for n in names if n not in chosen]
    if unknown:
        parser.error(f"unknown designs {unknown}; known: {', '.join(chosen)}")
    base = args.data or Path(f"/tmp/sentlog-age-{uuid.uuid4().hex[:8]}")
    pg = PostgresServer(
        base,
        settings=[
            "checkpoint_timeout=1d",
            "max_wal_size=8GB",
            "autovacuum=off",  # the purge's VACUUM runs in the cycle, measured
        ],
    )
    pg.start()
    counter = [int(time.time() * 1000)]

    def serial() -> int:
        counter[0] += 1
        return counter[0]

    try:
        db = Database(pg)
        for name in names:
            prepare(
                db,
                name,
                chosen[name],
                entries=args.entries,
                batch=args.batch,
                per_generation=per_generation,
            )
        results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        sent: dict[str, list[str]] = {n: [] for n in names}
        for i in range(args.cycles + 1):
            for name in names:  # interleaved, the first cycle a warm-up
                measured = cycle(db, name, chosen[name], args=args, serial=serial, sent=sent[name])
                print(
                    f"  cycle {i} {name}: "
                    + json.dumps({k: round(v, 1) for k, v in measured.items()}),
                    flush=True,
                )
                if i:
                    results[name].append(measured)
        for name in names:
            medians = {
                k: round(statistics.median(r[k] for r in results[name]), 1)
                for k in results[name][0]
            }
            print(
                json.dumps(
                    {
                        "design": name,
                        "entries": args.entries,
                        "acks_per_checkpoint": int(args.rate * args.checkpoint_seconds),
                        "batch": args.batch,
                        **medians,
                    }
                ),
                flush=True,
            )
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
