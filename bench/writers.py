"""Benchmark: what the outbox costs its writers, beside a plain table of the same shape.

    .venv/bin/python -m bench.writers [--rows 100000] [--seconds 10] [--writers 8]
                                      [--rounds 3]

Starts a private PostgreSQL with default durability (fsync and synchronous_commit on), makes
the outbox with the project's migrations and beside it ``outbox_copy``: ``CREATE TABLE ...
(LIKE outbox INCLUDING ALL)``, the same columns, defaults, indexes, constraints and storage
settings, and none of whatever else the schema may add (triggers, rules). Then, in
interleaved rounds, for each table:
  (bulk)   ``--rows`` 200-byte rows in 500-row INSERT statements, one connection: the
           database's CPU (every PostgreSQL process, from /proc) and WAL per row;
  (writers) ``--writers`` connections each inserting one row per transaction, every commit
           durable, for ``--seconds``: transactions per second.
Reports medians and the outbox's ratio to the copy; the last line is one JSON object. By
hand only: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from devtools.procfs import tree_cpu_seconds
from devtools.servers import PostgresServer
from relay.db.migrate import migrate

STATEMENT_ROWS = 500
PAYLOAD = b"x" * 200
TABLES = ("outbox", "outbox_copy")


def _insert(table: str, rows: int) -> str:
    values = ", ".join(["(%s, 'ex', 'k', %s)"] * rows)
    return f"INSERT INTO {table} (message_id, exchange, routing_key, payload) VALUES {values}"


def bulk(conninfo: str, pg: PostgresServer, table: str, rows: int, run: int) -> tuple[float, float]:
    """Database CPU (us) and WAL (bytes) per row of ``rows`` rows in 500-row statements."""
    statement = _insert(table, STATEMENT_ROWS)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        wal = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"
        wal_before, cpu_before = conn.execute(wal).fetchone()[0], tree_cpu_seconds(pg.pid())  # type: ignore[index]
        for start in range(0, rows, STATEMENT_ROWS):
            params: list[object] = []
            for i in range(start, start + STATEMENT_ROWS):
                params += [f"{table}-{run}-{i}", PAYLOAD]
            conn.execute(statement, params)
        cpu = tree_cpu_seconds(pg.pid()) - cpu_before
        wal_after = conn.execute(wal).fetchone()[0]  # type: ignore[index]
    return cpu * 1e6 / rows, float(wal_after - wal_before) / rows


def writers(conninfo: str, table: str, count: int, seconds: float, run: int) -> float:
    """Transactions per second of ``count`` writers, one row per durable transaction."""
    statement = _insert(table, 1)
    done = [0] * count
    start = threading.Barrier(count + 1)
    deadline = [0.0]

    def write(n: int) -> None:
        with psycopg.connect(conninfo) as conn:
            start.wait()
            while time.monotonic() < deadline[0]:
                conn.execute(statement, (f"{table}-w{run}-{n}-{done[n]}", PAYLOAD))
                conn.commit()
                done[n] += 1

    threads = [threading.Thread(target=write, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + seconds
    began = time.monotonic()
    start.wait()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {t: [] for t in TABLES}
    wal: dict[str, list[float]] = {t: [] for t in TABLES}
    tps: dict[str, list[float]] = {t: [] for t in TABLES}
    with tempfile.TemporaryDirectory(prefix="relay-writers-") as tmp:
        pg = PostgresServer(Path(tmp) / "pg")
        pg.start()
        try:
            pg.psql("CREATE DATABASE bench")
            migrate(pg.url("bench"))
            pg.psql("CREATE TABLE outbox_copy (LIKE outbox INCLUDING ALL)", database="bench")
            conninfo = f"host=127.0.0.1 port={pg.port} user=postgres dbname=bench"
            for run in range(args.rounds):
                # Each round alternates which table goes first.
                for table in TABLES if run % 2 == 0 else TABLES[::-1]:
                    pg.psql(f"TRUNCATE {table}; CHECKPOINT", database="bench")
                    row_cpu, row_wal = bulk(conninfo, pg, table, args.rows, run)
                    cpu[table].append(row_cpu)
                    wal[table].append(row_wal)
                    tps[table].append(writers(conninfo, table, args.writers, args.seconds, run))
                    print(
                        f"round {run} {table}: {row_cpu:.1f} us and {row_wal:.0f} B of WAL a row;"
                        f" {tps[table][-1]:.0f} transactions/s with {args.writers} writers",
                        flush=True,
                    )
        finally:
            pg.stop()
    median = {
        t: {
            "insert_cpu_us": round(statistics.median(cpu[t]), 2),
            "insert_wal_bytes": round(statistics.median(wal[t]), 1),
            "writers_tps": round(statistics.median(tps[t]), 1),
        }
        for t in TABLES
    }
    ratios = {
        key: round(median["outbox"][key] / median["outbox_copy"][key], 3)
        for key in median["outbox"]
    }
    print(json.dumps({"rows": args.rows, "writers": args.writers, **median, "ratio": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
