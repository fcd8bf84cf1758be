"""Benchmark: the operator console on PostgreSQL at scale.

    .venv/bin/python -m bench.console [--parked 1000000] [--tenants 600] [--repeats 9]
                                      [--rows 100000] [--rounds 3] [--replay 100000]
                                      [--writers 4] [--letters 10000]
                                      [--parts reads,indexes,replay,letters]

Starts a private PostgreSQL with default durability and the project's migrations, then:
  (reads)   ``--parked`` parked rows (five causes, one of them naming one of ``--tenants``
            tenants' exchanges: as many distinct texts, three exchanges, parked a second
            apart), analysed; each console read
            ``--repeats`` times, its median and worst wall time: the overview (counts, causes,
            relays), the first page, a page filtered by exchange, by cause, by a part of the
            reason, and the 200th page (keyset); and the overview's counts beside the true
            ones (a GROUP BY of every parked row): how many causes it shows exact, how many
            as a lower bound, and the least share of a true count a bound showed;
  (indexes) what the console's indexes (migration 0014) cost the writers' INSERT, measured
            as bench.writers does: ``outbox`` beside ``outbox_copy`` (the outbox's columns,
            defaults and indexes, the console's three left out), ``--rows`` 200-byte rows in
            500-row INSERTs (database CPU from /proc, WAL) and ``--writers`` connections each
            committing one row per transaction for ``--seconds``, in interleaved rounds;
  (replay)  ``--writers`` writers committing one row per transaction, their INSERT latency
            while nothing else runs and while the console replays ``--replay`` parked rows
            (one filter, in chunks), in interleaved rounds: p50 and p99; and each replay's
            rows changed and left, against the rows the filter matched;
  (letters) ``--letters`` dead letters of an inbox queue on a private RabbitMQ: page times,
            counts and bulk changes accounted for (``bench.console_letters``).
Medians of rounds, ratios within one run; the last line is one JSON object. By hand only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.console_letters import letters_cost
from bench.writers import bulk, writers
from devtools.servers import PostgresServer
from relay.causes import stored_cause
from relay.console_records import Actor, ParkedFilter
from relay.db.console import ConsoleReads
from relay.db.console_actions import ConsoleActions
from relay.db.migrate import migrate
from relay.db.schema import CONSOLE_INDEXES

OTTO = Actor("bench", "operator")
# The exchange of the rows the replay rounds replay, and of the writers' rows.
REPLAYED = "replay-me"
WRITTEN = "written"
FILL = """
INSERT INTO outbox (message_id, exchange, routing_key, payload, status, attempts, last_error,
                    cause, next_attempt_at, created_at)
SELECT 'p-' || g, (ARRAY['orders', 'billing', 'audit'])[g % 3 + 1], 'rk.' || (g % 10),
       convert_to(repeat('x', 200), 'UTF8'), 'parked', 10, error,
       CASE WHEN g % 5 = 4 THEN 'failed: 404 NOT_FOUND - no exchange ''…'' in vhost ''…'''
            ELSE error END,
       now() - ({n} - g) * interval '1 second', now() - ({n} - g) * interval '1 second'
FROM generate_series(1, {n}) g, LATERAL (SELECT
       CASE g % 5 WHEN 0 THEN 'returned: 312 NO_ROUTE'
                  WHEN 1 THEN 'rejected: headers are not a JSON object'
                  WHEN 2 THEN 'nacked'
                  WHEN 3 THEN 'timed_out'
                  ELSE 'failed: 404 NOT_FOUND - no exchange ''orders-' || (g / 5 % {tenants})
                       || ''' in vhost ''/'''
       END AS error) AS written
"""


def timed(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median and worst wall milliseconds of ``call``."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), max(times)


def reads(url: str, repeats: int) -> dict[str, tuple[float, float]]:
    console = ConsoleReads(url)
    try:
        listed = console.overview().causes.listed
        missing = next(g.cause for g in listed if g.cause.startswith("failed"))
        deep = None
        for _ in range(200):
            _rows, deep = console.page(ParkedFilter(), deep, 50)
        cases: dict[str, Callable[[], Any]] = {
            "overview": console.overview,
            "rows_page_causes": console.cause_names,
            "first_page": lambda: console.page(ParkedFilter(), None, 50),
            "page_by_exchange": lambda: console.page(ParkedFilter(exchange="billing"), None, 50),
            "page_by_cause": lambda: console.page(ParkedFilter(cause=missing), None, 50),
            "page_by_reason_text": lambda: console.page(ParkedFilter(reason="JSON"), None, 50),
            "page_200": lambda: console.page(ParkedFilter(), deep, 50),
        }
        found = {}
        for name, call in cases.items():
            call()  # warm: the plan cache and the buffers
            found[name] = timed(call, repeats)
            print(
                f"{name}: median {found[name][0]:.1f} ms, worst {found[name][1]:.1f} ms", flush=True
            )
        return found
    finally:
        console.close()


def accuracy(url: str, conninfo: str) -> dict[str, Any]:
    """The overview's count of each cause beside the true count (every parked row read)."""
    true: dict[str, int] = {}
    with psycopg.connect(conninfo) as conn:
        for error, rows in conn.execute(
            "SELECT last_error, count(*) FROM outbox WHERE status = 'parked' GROUP BY 1"
        ):
            true[stored_cause(error)] = true.get(stored_cause(error), 0) + rows
    console = ConsoleReads(url)
    try:
        began = time.perf_counter()
        causes = console.overview().causes
        took = (time.perf_counter() - began) * 1000
    finally:
        console.close()
    shown = {g.cause: g.rows for g in causes.listed}
    bounds = [c.rows / true[name] for name, c in shown.items() if not c.exact]
    found = {
        "overview_ms": round(took, 1),
        "causes": len(true),
        "listed": len(shown),
        "other_causes": str(causes.other_causes),
        "exact": sum(c.exact and c.rows == true[name] for name, c in shown.items()),
        "lower_bounds": len(bounds),
        "wrong": sum(
            c.rows > true[name] or (c.exact and c.rows != true[name]) for name, c in shown.items()
        ),
        "least_bound_share": round(min(bounds), 3) if bounds else None,
        "parked": str(causes.parked),
    }
    print(f"count accuracy: {found}", flush=True)
    return found


def index_cost(pg: PostgresServer, conninfo: str, args: argparse.Namespace) -> dict[str, float]:
    pg.psql("CREATE TABLE outbox_copy (LIKE outbox INCLUDING ALL)", database="bench")
    # The copy's indexes of parked rows by time, cause and exchange: the console's three (the
    # relay's own index of parked rows is by id alone).
    console = pg.psql(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'outbox_copy' "
        "AND indexdef LIKE '%next_attempt_at, id) WHERE%parked%'",
        database="bench",
    ).split()
    assert len(console) == len(CONSOLE_INDEXES), console
    for index in console:
        pg.psql(f"DROP INDEX {index}", database="bench")
    cpu: dict[str, list[float]] = {"outbox": [], "outbox_copy": []}
    wal: dict[str, list[float]] = {"outbox": [], "outbox_copy": []}
    tps: dict[str, list[float]] = {"outbox": [], "outbox_copy": []}
    for run in range(args.rounds):
        for table in ("outbox", "outbox_copy") if run % 2 == 0 else ("outbox_copy", "outbox"):
            pg.psql(f"TRUNCATE {table}; CHECKPOINT", database="bench")
            row_cpu, row_wal = bulk(conninfo, pg, table, args.rows, 100 + run)
            cpu[table].append(row_cpu)
            wal[table].append(row_wal)
            tps[table].append(writers(conninfo, table, args.writers, args.seconds, 100 + run))
            print(
                f"round {run} {table}: {row_cpu:.1f} us, {row_wal:.0f} B WAL a row; "
                f"{tps[table][-1]:.0f} tx/s",
                flush=True,
            )
    return {
        "insert_cpu_ratio": round(
            statistics.median(cpu["outbox"]) / statistics.median(cpu["outbox_copy"]), 3
        ),
        "insert_wal_ratio": round(
            statistics.median(wal["outbox"]) / statistics.median(wal["outbox_copy"]), 3
        ),
        "writers_tps_ratio": round(
            statistics.median(tps["outbox"]) / statistics.median(tps["outbox_copy"]), 3
        ),
    }


def latencies(conninfo: str, count: int, stop: threading.Event, run: str) -> list[float]:
    """Seconds per INSERT of ``count`` writers, one durable row per transaction, until
    ``stop``."""
    found: list[list[float]] = [[] for _ in range(count)]

    def write(n: int) -> None:
        with psycopg.connect(conninfo) as conn:
            i = 0
            while not stop.is_set():
                began = time.perf_counter()
                conn.execute(
                    "INSERT INTO outbox (message_id, exchange, routing_key, payload) "
                    f"VALUES (%s, '{WRITTEN}', 'k', %s)",
                    (f"w-{run}-{n}-{i}", b"x" * 200),
                )
                conn.commit()
                found[n].append(time.perf_counter() - began)
                i += 1

    threads = [threading.Thread(target=write, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for per in found for x in per]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000


def _round(
    url: str, conninfo: str, args: argparse.Namespace, name: str, replay: bool
) -> list[float]:
    """The writers' INSERT latencies while the console replays ``--replay`` rows (or, quiet,
    for ``--quiet`` seconds)."""
    stop = threading.Event()
    found: list[float] = []
    writing = threading.Thread(
        target=lambda: found.extend(latencies(conninfo, args.writers, stop, name))
    )
    writing.start()
    if replay:
        actions, reads_ = ConsoleActions(url), ConsoleReads(url)
        try:
            began = time.perf_counter()
            done = actions.replay(OTTO, None, ParkedFilter(exchange=REPLAYED), reads_.now())
            took = time.perf_counter() - began
        finally:
            actions.close()
            reads_.close()
        print(f"replayed {done.changed} rows in {took:.1f} s, left {done.left}", flush=True)
        if done.changed + done.left != args.replay:
            print(f"replay: {args.replay - done.changed - done.left} rows unaccounted for")
    else:
        time.sleep(args.quiet)
    stop.set()
    writing.join()
    return found


def replay_cost(
    pg: PostgresServer, url: str, conninfo: str, args: argparse.Namespace
) -> dict[str, float]:
    p99: dict[str, list[float]] = {"quiet": [], "replay": []}
    p50: dict[str, list[float]] = {"quiet": [], "replay": []}
    pg.psql(
        f"UPDATE outbox SET exchange = '{REPLAYED}' WHERE id IN "
        f"(SELECT id FROM outbox WHERE exchange = 'billing' LIMIT {args.replay})",
        database="bench",
    )
    for run in range(args.rounds):
        for case in ("quiet", "replay") if run % 2 == 0 else ("replay", "quiet"):
            pg.psql(f"DELETE FROM outbox WHERE exchange = '{WRITTEN}'", database="bench")
            pg.psql(
                "UPDATE outbox SET status = 'parked', next_attempt_at = now() - interval '1 day' "
                f"WHERE exchange = '{REPLAYED}'",
                database="bench",
            )
            pg.psql("VACUUM ANALYZE outbox", database="bench")
            pg.psql("CHECKPOINT", database="bench")
            found = _round(url, conninfo, args, f"{case}{run}", replay=case == "replay")
            p50[case].append(percentile(found, 0.5))
            p99[case].append(percentile(found, 0.99))
            print(
                f"round {run} {case}: {len(found)} inserts, p50 {p50[case][-1]:.2f} ms, "
                f"p99 {p99[case][-1]:.2f} ms",
                flush=True,
            )
    quiet, busy = statistics.median(p99["quiet"]), statistics.median(p99["replay"])
    return {
        "p50_quiet_ms": round(statistics.median(p50["quiet"]), 2),
        "p50_replay_ms": round(statistics.median(p50["replay"]), 2),
        "p99_quiet_ms": round(quiet, 2),
        "p99_replay_ms": round(busy, 2),
        "p99_ratio": round(busy / quiet, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parked", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=600, help="distinct texts of one cause")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replay", type=int, default=100_000)
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds of a quiet round")
    parser.add_argument("--letters", type=int, default=10_000, help="an inbox's dead letters")
    parser.add_argument(
        "--parts",
        default="reads,indexes,replay,letters",
        help="which measurements, comma-separated",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relay-console-") as tmp:
        pg = PostgresServer(Path(tmp) / "pg")
        pg.start()
        try:
            pg.psql("CREATE DATABASE bench")
            url = pg.url("bench")
            migrate(url)
            conninfo = f"host=127.0.0.1 port={pg.port} user=postgres dbname=bench"
            parts = args.parts.split(",")
            # The indexes' cost on empty tables, as bench.writers measures.
            costs = index_cost(pg, conninfo, args) if "indexes" in parts else {}
            pg.psql("TRUNCATE outbox", database="bench")
            pg.psql(FILL.format(n=args.parked, tenants=args.tenants), database="bench")
            pg.psql("VACUUM ANALYZE outbox", database="bench")
            read_ms = reads(url, args.repeats) if "reads" in parts else {}
            counts = accuracy(url, conninfo) if "reads" in parts else {}
            replay = replay_cost(pg, url, conninfo, args) if "replay" in parts else {}
            letters = letters_cost(url, args) if "letters" in parts else {}
        finally:
            pg.stop()
    summary = {
        "parked": args.parked,
        "tenants": args.tenants,
        "reads_ms": {
            k: {"median": round(m, 1), "worst": round(w, 1)} for k, (m, w) in read_ms.items()
        },
        "counts": counts,
        "indexes": costs,
        "replay": {"rows": args.replay, "writers": args.writers, **replay},
        "letters": letters,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
