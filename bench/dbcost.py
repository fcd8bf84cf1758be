"""Benchmark: what relaying a row costs the database, beside what writing it cost.

    .venv/bin/python -m bench.dbcost [--rows 100000 1000000] [--relays 1 3] [--rounds 3]
                                     [--keep-sent ids] [--setting NAME=VALUE ...]

Starts a private PostgreSQL (default durability settings) with the project's migrations and
measures, per row, the database's CPU (every PostgreSQL process, from /proc), its WAL (from
``pg_current_wal_insert_lsn()``) and the dead tuples left in the outbox (before cleanup):
  (insert) the writer's INSERT, 500 rows a statement (``OutboxWriter.enqueue``), of
           ``--rows`` 200-byte rows (a plain INSERT: the outbox has no triggers since 0007;
           ``bench.writers`` compares it with a copy of the table);
  (relay)  relaying the same rows through the relay's store, no broker: claims of 500 rows,
           three claims ahead of the settles (as the relay keeps a window in flight), every
           row acked, with ``--relays`` stores claiming side by side, keeping what
           ``--keep-sent`` says of the acked rows; then the cleanup the relay's retention
           does (deleting sent rows or the sent log's entries) and a VACUUM of both tables.
Autovacuum is off for the outbox while measuring (the cleanup's VACUUM is counted instead).
``--rows`` and ``--relays`` take several values: each round measures every backlog size
(a fresh INSERT before each relay case) with every number of relays, in turn, so that the
cases' ratios come from one run. ``--rounds`` repeats them and reports medians; the last line
is one JSON object with every figure. ``--setting`` passes server settings (for example
``wal_compression=lz4``, to price full-page images). By hand only: the machine is shared and
noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from devtools.procfs import tree_cpu_seconds
from devtools.servers import PostgresServer
from relay.db.claims import ClaimStore
from relay.db.migrate import migrate
from relay.db.outbox import OutboxAdmin, OutboxWriter
from relay.records import KEEP_IDS, KEEP_MESSAGES, NewMessage, SettleBatch

CLAIM = 500  # rows per claim and per INSERT statement
AHEAD = 3  # claims in flight before the first is settled
PAYLOAD = b"x" * 200


@dataclass(frozen=True)
class Cost:
    cpu_us: float  # database CPU per row
    wal_bytes: float  # WAL per row
    dead: float  # dead outbox tuples per row, before cleanup


class Meter:
    def __init__(self, pg: PostgresServer, url: str) -> None:
        self.pg = pg
        self.engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")

    def _wal(self) -> int:
        with self.engine.connect() as conn:
            lsn = "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"
            return int(conn.execute(sa.text(f"SELECT {lsn}")).scalar_one())

    def dead(self) -> int:
        # Backends report their counts when idle for a second or when they end.
        time.sleep(1.5)
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            query = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'"
            return int(conn.execute(sa.text(query)).scalar_one())

    @contextmanager
    def measured(self, rows: int, into: list[Cost]) -> Iterator[Callable[[], None]]:
        """Measure the block; call the yielded function to take the dead tuples (before a
        cleanup that is part of the block)."""
        dead_before = self.dead()
        taken: list[int] = []
        cpu, wal = tree_cpu_seconds(self.pg.pid()), self._wal()
        yield lambda: taken.append(self.dead())
        cpu, wal = tree_cpu_seconds(self.pg.pid()) - cpu, self._wal() - wal
        dead = (taken[0] if taken else self.dead()) - dead_before
        into.append(Cost(cpu * 1e6 / rows, wal / rows, dead / rows))


def write(url: str, rows: int) -> None:
    writer = OutboxWriter(url)
    for start in range(0, rows, CLAIM):
        writer.enqueue([NewMessage(PAYLOAD, "ex", "k") for _ in range(min(CLAIM, rows - start))])
    writer.close()


def relay(store: ClaimStore) -> None:
    """Claim and settle until nothing is due, AHEAD claims in flight."""
    in_flight: deque[list[int]] = deque()
    while True:
        ids = [r.id for r in store.claim(CLAIM, 2**62)]
        if ids:
            in_flight.append(ids)
        if len(in_flight) >= AHEAD or (not ids and in_flight):
            store.settle(SettleBatch(sent=tuple(in_flight.popleft())))
        if not ids and not in_flight:
            break


def clean(url: str, engine: sa.Engine) -> None:
    admin = OutboxAdmin(url)
    admin.purge(0.0)
    admin.close()
    with engine.connect() as conn:
        conn.execute(sa.text("VACUUM outbox, outbox_sent_log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000])
    parser.add_argument("--relays", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep-sent", choices=(KEEP_IDS, KEEP_MESSAGES), default=KEEP_IDS)
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    # Per backlog size: the INSERT (once per relay case), and per number of relays the
    # relaying (the sent log's probe by the claim, the dedupe, included).
    inserts: dict[int, list[Cost]] = {rows: [] for rows in args.rows}
    relays: dict[tuple[int, int], list[Cost]] = {
        (rows, n): [] for rows in args.rows for n in args.relays
    }
    with tempfile.TemporaryDirectory(prefix="relay-dbcost-") as tmp:
        pg = PostgresServer(Path(tmp) / "pg", settings=args.setting)
        pg.start()
        try:
            pg.psql("CREATE DATABASE bench")
            url = pg.url("bench")
            migrate(url)
            meter = Meter(pg, url)

            def sql(*statements: str) -> None:
                with meter.engine.connect() as conn:
                    for statement in statements:
                        conn.execute(sa.text(statement))

            sql("ALTER TABLE outbox SET (autovacuum_enabled = off)")
            for n in range(args.rounds):
                for rows in args.rows:
                    for count in args.relays:
                        with meter.measured(rows, inserts[rows]):
                            write(url, rows)
                        with meter.measured(rows, relays[rows, count]) as take_dead:
                            relay_all(url, count, args.keep_sent)
                            take_dead()
                            clean(url, meter.engine)
                        print(
                            f"round {n}, {rows} rows, {count} relays: insert "
                            f"{inserts[rows][-1]}, relay {relays[rows, count][-1]}",
                            flush=True,
                        )
            meter.engine.dispose()
        finally:
            pg.stop()

    def median(costs: list[Cost]) -> dict[str, float]:
        return {
            field: round(statistics.median(getattr(c, field) for c in costs), 2)
            for field in ("cpu_us", "wal_bytes", "dead")
        }

    def over(part: dict[str, float], whole: dict[str, float]) -> dict[str, float]:
        return {f: round(part[f] / whole[f], 2) for f in ("cpu_us", "wal_bytes")}

    report: dict[str, object] = {
        "keep_sent": args.keep_sent,
        "rounds": args.rounds,
        "settings": args.setting,
    }
    for rows in args.rows:
        insert = median(inserts[rows])
        case: dict[str, object] = {"insert": insert}
        for count in args.relays:
            relayed = median(relays[rows, count])
            case[f"relays_{count}"] = {**relayed, "over_insert": over(relayed, insert)}
        if len(args.relays) > 1:
            one, most = median(relays[rows, args.relays[0]]), median(relays[rows, args.relays[-1]])
            case["most_relays_over_first"] = over(most, one)
        report[f"rows_{rows}"] = case
    print(json.dumps(report))
    return 0


def relay_all(url: str, count: int, keep_sent: str) -> None:
    stores = [ClaimStore(url, f"relay-{i}", 60.0, keep_sent=keep_sent) for i in range(count)]
    # Two rounds of turns share the buckets out, as relays that start together do.
    for _ in range(2):
        for store in stores:
            store.turn()
    threads = [threading.Thread(target=relay, args=(store,)) for store in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in stores:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
