"""Study: candidate claim and settle designs for the outbox, in plain SQL, by database cost.

    .venv/bin/python -m bench.claim_designs [--rows 100000] [--rounds 3]

Not the relay: each design is a table shaped as the design needs and the SQL its claim and
settle would run, driven from here through psycopg. On a private PostgreSQL (default
durability settings), for each design in turn each round: ``--rows`` 200-byte rows
inserted 500 a statement, then "relayed" (claims of 500, three ahead of the settles, every
row acked) and the table vacuumed. Measured per row: PostgreSQL's CPU (every server
process, /proc), its WAL (``pg_current_wal_insert_lsn``), for the INSERT and for relaying
(claim, settle and VACUUM; the claim and settle part also alone). Autovacuum is off for the
tables. Medians over the rounds, one JSON line last. By hand only: the machine is shared.

The designs (issue 23's question: what costs the database less than the INSERT did):
  keyset        one index (next_attempt_at, id); the claim a plain SELECT after the last
                row claimed (an in-memory position, no write); settle = DELETE
  hash_buckets  64 buckets by a hash of the ordering key, else of the id; one bucket per
                claim in rotation (so that several relays could own disjoint buckets)
  chunk_buckets the same, but a row without an ordering key goes to bucket
                (id / 1024) % 64: consecutive rows share a bucket, and so heap pages
  chunk_sentlog chunk_buckets, and the settle moves the message id's 64-bit hash and the
                sent time to a sent log (a dedupe horizon) in the DELETE's statement
  chunk_dedupe  chunk_sentlog, and the INSERT checks the sent log (an AFTER INSERT trigger
                that drops a row whose message id was sent: the check runs after the unique
                index has waited out a concurrent move, so a re-insert cannot slip through)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from devtools.procfs import tree_cpu_seconds
from devtools.servers import PostgresServer

CLAIM = 500  # rows per claim and per INSERT statement
AHEAD = 3  # claims in flight before the first is settled
BUCKETS = 64
PAYLOAD = b"x" * 200
COLUMNS = "id, message_id, exchange, routing_key, payload, content_type, headers, created_at"
BEGINNING = (datetime(1970, 1, 1, tzinfo=UTC), 0)

HASHED = f"hashtext(coalesce(ordering_key, id::text)) & {BUCKETS - 1}"
CHUNKED = (
    f"CASE WHEN ordering_key IS NULL THEN (id / 1024) % {BUCKETS} "
    f"ELSE hashtext(ordering_key) & {BUCKETS - 1} END"
)
SENT_LOG = "CREATE TABLE {t}_sent (key bigint PRIMARY KEY, sent_at timestamptz NOT NULL)"
DEDUPE = """
CREATE FUNCTION {t}_dedupe() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM {t}_sent WHERE key = hashtextextended(NEW.message_id, 0)) THEN
    DELETE FROM {t} WHERE id = NEW.id;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER {t}_dedupe AFTER INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_dedupe();
"""


@dataclass(frozen=True)
class Design:
    bucket: str | None  # the bucket column's expression, or no buckets
    sent_log: bool = False
    dedupe: bool = False


DESIGNS = {
    "keyset": Design(None),
    "hash_buckets": Design(HASHED),
    "chunk_buckets": Design(CHUNKED),
    "chunk_sentlog": Design(CHUNKED, sent_log=True),
    "chunk_dedupe": Design(CHUNKED, sent_log=True, dedupe=True),
}


def create(conn: psycopg.Connection[Any], t: str, design: Design) -> None:
    bucket = ""
    if design.bucket is not None:
        bucket = f", bucket smallint NOT NULL GENERATED ALWAYS AS ({design.bucket}) STORED"
    conn.execute(f"DROP TABLE IF EXISTS {t}, {t}_sent CASCADE")
    conn.execute(f"DROP FUNCTION IF EXISTS {t}_dedupe() CASCADE")
    conn.execute(
        f"""CREATE TABLE {t} (
        id bigserial PRIMARY KEY,
        message_id text COLLATE "C" NOT NULL UNIQUE,
        exchange text NOT NULL DEFAULT '',
        routing_key text NOT NULL DEFAULT '',
        payload bytea NOT NULL,
        content_type text NOT NULL DEFAULT 'application/octet-stream',
        headers text,
        ordering_key text,
        created_at timestamptz NOT NULL DEFAULT now(),
        next_attempt_at timestamptz NOT NULL DEFAULT now(),
        attempts int NOT NULL DEFAULT 0,
        last_error text{bucket})"""
    )
    key = "bucket, " if design.bucket is not None else ""
    conn.execute(f"CREATE INDEX {t}_due ON {t} ({key}next_attempt_at, id)")
    conn.execute(f"ALTER TABLE {t} SET (autovacuum_enabled = off)")
    if design.sent_log:
        conn.execute(SENT_LOG.format(t=t))
        conn.execute(f"ALTER TABLE {t}_sent SET (autovacuum_enabled = off)")
    if design.dedupe:
        conn.execute(DEDUPE.format(t=t))


def insert(conn: psycopg.Connection[Any], t: str, rows: int, tag: str) -> None:
    values = ", ".join(["(%s, %s, %s, %s, %s)"] * CLAIM)
    sql = f"INSERT INTO {t} (message_id, exchange, routing_key, payload, content_type) "
    for start in range(0, rows, CLAIM):
        params: list[Any] = []
        for i in range(start, start + CLAIM):
            params += [f"{tag}-{i}", "ex", "k", PAYLOAD, "text/plain"]
        conn.execute(f"{sql}VALUES {values}", params)


class Claimer:
    """Claims in due order after a keyset position (per bucket, one bucket per claim in
    rotation, when the design has buckets)."""

    def __init__(self, conn: psycopg.Connection[Any], t: str, design: Design) -> None:
        self.conn, self.t, self.design = conn, t, design
        self.positions: dict[int, tuple[datetime, int]] = {}
        self.turn = 0

    def _after(self, bucket: int | None) -> list[Any]:
        where = "bucket = %s AND " if bucket is not None else ""
        position = self.positions.get(bucket or 0, BEGINNING)
        sql = (
            f"SELECT {COLUMNS}, next_attempt_at FROM {self.t} WHERE {where}"
            "next_attempt_at <= statement_timestamp() AND (next_attempt_at, id) > (%s, %s) "
            f"ORDER BY next_attempt_at, id LIMIT {CLAIM}"
        )
        params = ([bucket] if bucket is not None else []) + list(position)
        rows = self.conn.execute(sql, params, binary=True).fetchall()
        if rows:
            self.positions[bucket or 0] = (rows[-1][-1], rows[-1][0])
        return rows

    def claim(self) -> list[int]:
        if self.design.bucket is None:
            return [r[0] for r in self._after(None)]
        for _ in range(BUCKETS):
            rows = self._after(self.turn % BUCKETS)
            if len(rows) < CLAIM:
                self.turn += 1  # this bucket is drained for now: the next claim, the next one
            if rows:
                return [r[0] for r in rows]
        return []

    def settle(self, ids: list[int]) -> None:
        if not self.design.sent_log:
            self.conn.execute(f"DELETE FROM {self.t} WHERE id = ANY(%s)", [ids])
            return
        self.conn.execute(
            f"WITH gone AS (DELETE FROM {self.t} WHERE id = ANY(%s) RETURNING message_id) "
            f"INSERT INTO {self.t}_sent "
            "SELECT hashtextextended(message_id, 0), statement_timestamp() FROM gone",
            [ids],
        )


def relay(claimer: Claimer) -> None:
    in_flight: deque[list[int]] = deque()
    while True:
        ids = claimer.claim()
        if ids:
            in_flight.append(ids)
        if len(in_flight) >= AHEAD or (not ids and in_flight):
            claimer.settle(in_flight.popleft())
        if not ids and not in_flight:
            return


def measured(
    pg: PostgresServer, admin: psycopg.Connection[Any], work: Callable[[], object]
) -> tuple[float, float]:
    """(CPU seconds, WAL bytes) of the database while ``work`` runs."""

    def wal() -> float:
        lsn = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"
        return float(admin.execute(lsn).fetchone()[0])  # type: ignore[index]

    cpu, written = tree_cpu_seconds(pg.pid()), wal()
    work()
    return tree_cpu_seconds(pg.pid()) - cpu, wal() - written


def round_of(
    pg: PostgresServer, url: str, name: str, design: Design, rows: int
) -> dict[str, float]:
    with (
        psycopg.connect(url, autocommit=True) as admin,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        create(admin, name, design)
        ins_cpu, ins_wal = measured(
            pg, admin, lambda: insert(conn, name, rows, str(time.time_ns()))
        )
        rel_cpu, rel_wal = measured(pg, admin, lambda: relay(Claimer(conn, name, design)))
        vac_cpu, vac_wal = measured(pg, admin, lambda: admin.execute(f"VACUUM {name}"))
    per_row = 1e6 / rows
    return {
        "insert_us": ins_cpu * per_row,
        "insert_wal": ins_wal / rows,
        "relay_us": (rel_cpu + vac_cpu) * per_row,
        "relay_wal": (rel_wal + vac_wal) / rows,
        "claim_settle_us": rel_cpu * per_row,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in DESIGNS}
    with tempfile.TemporaryDirectory(prefix="relay-designs-") as tmp:
        pg = PostgresServer(Path(tmp) / "pg")
        pg.start()
        try:
            pg.psql("CREATE DATABASE designs")
            url = pg.url("designs").replace("postgresql+psycopg://", "postgresql://")
            for _ in range(args.rounds):
                for name, design in DESIGNS.items():
                    results[name].append(round_of(pg, url, name, design, args.rows))
                    figures = {k: round(v, 2) for k, v in results[name][-1].items()}
                    print(name, figures, flush=True)
        finally:
            pg.stop()
    medians: dict[str, dict[str, float]] = {}
    for name, rounds in results.items():
        median = {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]}
        median["cpu_over_insert"] = round(median["relay_us"] / median["insert_us"], 2)
        median["wal_over_insert"] = round(median["relay_wal"] / median["insert_wal"], 2)
        medians[name] = median
    print(json.dumps({"rows": args.rows, "rounds": args.rounds, "designs": medians}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
