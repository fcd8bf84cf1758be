"""Benchmark: what spreading consecutive ids over the buckets costs PostgreSQL.

    .venv/bin/python -m bench.bucket_spread [--rows 100000] [--rounds 3]

How ids map to buckets decides which relay gets a live stream's rows (``relay.buckets``):
runs of 1,024 ids to consecutive buckets kept a whole stream in one relay's contiguous
buckets; runs of 128 ids, 39 buckets apart, spread it over every relay. Shorter runs put a
claim's rows on more heap pages. On a private PostgreSQL (default durability), each round,
for each mapping in turn: ``--rows`` 200-byte pending rows inserted 500 a statement, then
drained by two "relays" owning the lower and the upper half of the buckets in turn, each
step the due-order claim of 500 rows of its buckets (the relay's claim's shape: the due
index, the bucket filter) and the DELETE of those rows (an ack); then VACUUM. Measured per
row drained: PostgreSQL's CPU (every server process, /proc), its WAL, and the shared
buffers a claim touched (EXPLAIN ANALYZE of one claim mid-drain). Medians, the ratio of
the spread mapping to the old, and one JSON line last. By hand only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from devtools.procfs import tree_cpu_seconds
from devtools.servers import PostgresServer
from relay.constants import OUTBOX_BUCKETS

# (span, stride): the mapping before issue 44 and the one after.
MAPPINGS = {"runs of 1024, consecutive": (1024, 1), "runs of 128, 39 apart": (128, 39)}
CLAIM_ROWS = 500
PAYLOAD = b"x" * 200
HALVES = (list(range(OUTBOX_BUCKETS // 2)), list(range(OUTBOX_BUCKETS // 2, OUTBOX_BUCKETS)))


def claim_sql(span: int, stride: int) -> str:
    return (
        "SELECT id FROM outbox_b WHERE status = 'pending' AND next_attempt_at <= now() "
        f"AND (id / {span} * {stride}) %% {OUTBOX_BUCKETS} = ANY(%s) "
        f"ORDER BY next_attempt_at, id LIMIT {CLAIM_ROWS}"
    )


def setup(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP TABLE IF EXISTS outbox_b")
    conn.execute(
        "CREATE TABLE outbox_b (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT "
        "'pending', next_attempt_at timestamptz NOT NULL DEFAULT now(), payload bytea NOT NULL)"
        " WITH (autovacuum_enabled = off)"
    )
    conn.execute(
        "CREATE INDEX outbox_b_due ON outbox_b (next_attempt_at, id) WHERE status = 'pending'"
    )


def fill(conn: psycopg.Connection[Any], rows: int) -> None:
    with conn.cursor() as cur:
        for _ in range(0, rows, 500):
            cur.executemany("INSERT INTO outbox_b (payload) VALUES (%s)", [(PAYLOAD,)] * 500)


def drain(conn: psycopg.Connection[Any], span: int, stride: int) -> int:
    """Both halves claim and ack in turn until nothing is left; the shared buffers of one
    claim from the middle of the drain."""
    sql, buffers, turn = claim_sql(span, stride), 0, 0
    while True:
        drained = 0
        for half in HALVES:
            ids = [r[0] for r in conn.execute(sql, (half,)).fetchall()]
            if ids:
                conn.execute("DELETE FROM outbox_b WHERE id = ANY(%s)", (ids,))
                drained += len(ids)
            turn += 1
            if turn == 20:
                plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, (half,))
                found = plan.fetchone()
                assert found is not None
                top = found[0][0]["Plan"]
                buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        if not drained:
            return buffers


def lsn(conn: psycopg.Connection[Any]) -> str:
    found = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert found is not None
    return str(found[0])


def wal_since(conn: psycopg.Connection[Any], start: str) -> float:
    found = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (start,)).fetchone()
    assert found is not None
    return float(found[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in MAPPINGS}
    with tempfile.TemporaryDirectory() as tmp:
        server = PostgresServer(Path(tmp) / "pg")
        server.start()
        try:
            url = server.url().replace("postgresql+psycopg", "postgresql")
            with psycopg.connect(url, autocommit=True) as conn:
                for round_ in range(args.rounds):
                    for name, (span, stride) in MAPPINGS.items():
                        setup(conn)
                        fill(conn, args.rows)
                        conn.execute("CHECKPOINT")
                        cpu = tree_cpu_seconds(server.pid())
                        start = lsn(conn)
                        buffers = drain(conn, span, stride)
                        conn.execute("VACUUM outbox_b")
                        used = (tree_cpu_seconds(server.pid()) - cpu) / args.rows * 1e6
                        per_row = wal_since(conn, start) / args.rows
                        figures[name].append((used, per_row, buffers))
                        print(
                            f"round {round_ + 1} {name}: {used:5.1f} us CPU/row, "
                            f"{per_row:5.0f} B WAL/row, {buffers} buffers a claim",
                            flush=True,
                        )
        finally:
            server.stop()
    medians = {
        name: [statistics.median(f[i] for f in rows) for i in range(3)]
        for name, rows in figures.items()
    }
    old, new = (medians[name] for name in MAPPINGS)
    for name, (cpu, wal, touched) in medians.items():
        print(f"median {name}: {cpu:5.1f} us CPU/row, {wal:5.0f} B WAL/row, {touched:.0f} buffers")
    ratio = new[0] / old[0]
    print(f"spread / old, database CPU per row: {ratio:.2f}")
    print(json.dumps({"medians": medians, "cpu_ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
