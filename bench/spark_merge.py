"""Benchmark: where an atomic Spark write's merge spends its time, on PostgreSQL.

    .venv/bin/python -m bench.spark_merge [--rows 1000000] [--rounds 3]

Stages --rows rows shaped as bench/spark_write.py's (a 64-hex message id, a 200-byte
payload) in an unlogged staging table, then times, in interleaved rounds (medians), each
after TRUNCATE + CHECKPOINT of the outbox, the ways of moving them into the outbox in one
statement:
  merge         ``OutboxSink.merge``, the writer's own (INSERT ... SELECT ... ORDER BY
                message_id, work_mem MERGE_WORK_MEM),
  unordered     the same statement without ORDER BY (index inserts in random places),
  work_mem_1gb  the same with work_mem = 1GB (the sort in memory).
By hand only: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from devtools.servers import PostgresServer
from relay.constants import MERGE_WORK_MEM
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.db.schema import WRITTEN_COLUMNS
from relay.db.sink import OutboxSink

COLUMNS = ", ".join(WRITTEN_COLUMNS)
FILL = (
    "INSERT INTO {stage} SELECT encode(sha256(i::text::bytea), 'hex'), 'orders', "
    "'order.created', convert_to(repeat('x', 190) || lpad(i::text, 10, '0'), 'UTF8'), "
    "'text/plain; charset=utf-8', NULL, NULL, i FROM generate_series(1, {rows}) i"
)
INSERT = f"INSERT INTO outbox ({COLUMNS}) SELECT {COLUMNS} FROM {{stage}}"
VARIANTS = ("merge", "unordered", "work_mem_1gb")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"settings: rows={args.rows} rounds={args.rounds} work_mem={MERGE_WORK_MEM}")
    with tempfile.TemporaryDirectory(prefix="relay-merge-bench-") as tmp:
        pg = PostgresServer(Path(tmp) / "pg")
        pg.start()
        try:
            seconds = run(pg.url(), args)
        finally:
            pg.stop()
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    for name, median in medians.items():
        print(f"{name:<14} {median:6.2f} s  {median / medians['merge']:5.2f} of merge")
    print(json.dumps({"rows": args.rows, **{f"{k}_s": round(v, 3) for k, v in medians.items()}}))
    return 0


def run(url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    migrate(url)
    engine = create_engine(url)
    sink = OutboxSink(url)
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for round_ in range(args.rounds):
            for name in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                stage = sink.create_stage()
                with engine.begin() as conn:
                    conn.execute(sa.text(FILL.format(stage=stage, rows=args.rows)))
                    conn.execute(sa.text(f"ANALYZE {stage}"))
                    conn.execute(sa.text("TRUNCATE outbox, outbox_sent_log"))
                with engine.connect() as conn:
                    conn.execute(sa.text("CHECKPOINT"))
                    conn.commit()
                start = time.perf_counter()
                if name == "merge":
                    inserted = sink.merge(stage, keep_order=False)
                else:
                    inserted = statement(engine, name, stage)
                seconds[name].append(time.perf_counter() - start)
                assert inserted == args.rows, (name, inserted)
                sink.drop_stage(stage)
                print(f"  round {round_ + 1} {name}: {seconds[name][-1]:.2f} s", flush=True)
    finally:
        sink.close()
        engine.dispose()
    return seconds


def statement(engine: sa.Engine, name: str, stage: str) -> int:
    order = "" if name == "unordered" else " ORDER BY message_id"
    work_mem = "1GB" if name == "work_mem_1gb" else MERGE_WORK_MEM
    with engine.begin() as conn:
        conn.execute(sa.text(f"SET LOCAL work_mem = '{work_mem}'"))
        result = conn.execute(sa.text(INSERT.format(stage=stage) + order))
        return int(result.rowcount)


if __name__ == "__main__":
    raise SystemExit(main())
