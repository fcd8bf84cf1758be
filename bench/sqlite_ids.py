"""Benchmark: what ids that are never reused (``AUTOINCREMENT``, migration 0008) cost SQLite's
writers.

    .venv/bin/python -m bench.sqlite_ids [--rows 100000] [--rounds 5]

Two outbox files, one at migration 0007 (the id a plain rowid: the highest id is handed out
again once its row is deleted) and one at the head (``AUTOINCREMENT``: SQLite keeps the
highest id ever given in ``sqlite_sequence`` and writes it with every insert). In
interleaved rounds, for each: ``--rows`` 200-byte rows in 500-row INSERT statements, then
the same rows one per transaction (``relay enqueue``'s durable sessions: WAL, synchronous
FULL, as a writer's), measuring this process's CPU per row (SQLite runs in it). Medians and
the head's ratio to 0007; the last line is one JSON object. By hand only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from relay.db.engine import create_engine
from relay.db.migrate import migrate

STATEMENT_ROWS = 500
PAYLOAD = b"x" * 200
SINGLE_ROWS = 2000  # rows written one per transaction, per round
REVISIONS = {"0007 (rowid)": "0007", "0008 (AUTOINCREMENT)": "head"}
INSERT = sa.text("INSERT INTO outbox (message_id, exchange, payload) VALUES (:m, 'ex', :p)")


def cpu_per_row(engine: sa.Engine, rows: int, run: str) -> tuple[float, float]:
    """(CPU us per row in 500-row statements, CPU us per row one per transaction)."""
    started = time.process_time()
    for first in range(0, rows, STATEMENT_ROWS):
        batch = [{"m": f"{run}-{i}", "p": PAYLOAD} for i in range(first, first + STATEMENT_ROWS)]
        with engine.begin() as conn:
            conn.execute(INSERT, batch)
    bulk = (time.process_time() - started) / rows * 1e6
    started = time.process_time()
    for i in range(SINGLE_ROWS):
        with engine.begin() as conn:
            conn.execute(INSERT, {"m": f"{run}-single-{i}", "p": PAYLOAD})
    single = (time.process_time() - started) / SINGLE_ROWS * 1e6
    with engine.begin() as conn:  # as acks do: the rows leave the outbox
        conn.execute(sa.text("DELETE FROM outbox"))
    return bulk, single


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in REVISIONS}
    with tempfile.TemporaryDirectory() as base:
        engines = {}
        for name, revision in REVISIONS.items():
            url = f"sqlite:///{Path(base) / (revision + '.db')}"
            migrate(url, revision)
            engines[name] = create_engine(url)
        for round_ in range(args.rounds):
            for name, engine in engines.items():
                figures[name].append(cpu_per_row(engine, args.rows, f"r{round_}"))
        for engine in engines.values():
            engine.dispose()
    medians = {
        name: [statistics.median(f[i] for f in rounds) for i in (0, 1)]
        for name, rounds in figures.items()
    }
    old, new = medians.values()
    print(f"writer CPU per row (us), medians of {args.rounds} interleaved rounds")
    print("| outbox | 500-row statements | one row per transaction |")
    print("|---|---:|---:|")
    for name, (bulk, single) in medians.items():
        print(f"| {name} | {bulk:.1f} | {single:.1f} |")
    print(f"| ratio | {new[0] / old[0]:.2f} | {new[1] / old[1]:.2f} |")
    print(json.dumps({"rows": args.rows, "rounds": args.rounds, "medians_us": medians}))


if __name__ == "__main__":
    main()
