"""Benchmark: the Spark outbox writer against Spark's own JDBC append, same database, same run.

    .venv/bin/python -m bench.spark_write [--rows 1000000] [--rounds 3]
        [--database postgresql|sqlite] [--stream-seconds 60] [--stream-rate 60000]

Builds one cached DataFrame (200-byte payloads) and times, in every round, in alternating
order (round 2 runs them backwards), each after TRUNCATE + CHECKPOINT of every table:
  plain_append   ``df.write.jdbc(mode="append")`` into a table with the outbox's columns and
                 no index (a ceiling: what Spark's JDBC append costs with nothing to check),
  unique_append  the same into a table whose message_id is unique (what the index that makes
                 writes idempotent costs by itself; such an append fails on a duplicate),
  jdbc_outbox    the same into the migrated outbox itself, with its indexes and triggers: the
                 fair anchor (as fast as a writer into this table can be without idempotency),
  outbox         ``format("outbox")``, default mode (each partition commits by itself),
  outbox_atomic  the same with ``atomic=True`` (staged, merged in one transaction).
The JDBC appends use the writer's batch size (JDBC ``batchsize`` = Arrow's
maxRecordsPerBatch). Then a one-row write of each kind (JDBC into the outbox, a Python data
source that writes nothing, and the outbox writer) --one-row-rounds times, interleaved, each
the first write of a new SparkSession: the fixed cost of a write, and of the Python Data
Source API itself (the floor any Python writer pays). Then, unless
--stream-seconds 0 (and only on PostgreSQL), ``writeStream.format("outbox")`` from a rate
source (--stream-rate rows/s, 10 s micro-batches) for that long while ``relay run`` drains
the same outbox into a private RabbitMQ node: Spark's own processedRowsPerSecond of each
micro-batch after the first (median), whether every batch finished within its trigger
interval, and the relay's rate over the same time.

Prints the settings, a table of medians, and last one JSON line with every rate and
``outbox_over_jdbc_outbox``, ``atomic_over_jdbc_outbox`` and ``streaming_rows_per_s``. By hand
only: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from devtools.broker import fresh_queue
from devtools.procfs import tree_cpu_seconds
from devtools.relayproc import RelayProcess, relay_env
from devtools.scrape import answers_ok
from devtools.servers import PostgresServer, RabbitNode, free_port, wait_until
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.db.schema import outbox, outbox_sent
from relay.spark import LOCAL_MODE_ENV, register, write_outbox

# The JDBC drivers Debian ships (libpostgresql-jdbc-java, libxerial-sqlite-jdbc-java): only
# the JDBC appends use them, the outbox writer does not.
DEBIAN_JARS = "/usr/share/java/postgresql.jar,/usr/share/java/sqlite-jdbc.jar"
# Rows per Arrow batch handed to the writer, and per JDBC batch for the appends.
BATCH_ROWS = 10_000
MASTER = "local[2]"
PARTITIONS = 2
STREAM_TRIGGER = "10 seconds"
STREAM_TRIGGER_S = 10.0
QUEUE = "bench"
PLAIN_TABLES = {"plain_append": "", "unique_append": "UNIQUE"}
MEASURES = ("plain_append", "unique_append", "jdbc_outbox", "outbox", "outbox_atomic")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only", nargs="+", choices=MEASURES, default=MEASURES, help="measure only these writes"
    )
    parser.add_argument("--database", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--one-row-rounds", type=int, default=3, help="0: no one-row writes")
    parser.add_argument("--stream-seconds", type=float, default=60.0, help="0: no stream")
    parser.add_argument("--stream-rate", type=int, default=60_000)
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a PostgreSQL setting (repeat), e.g. shared_buffers=2GB",
    )
    args = parser.parse_args()
    print(
        f"settings: rows={args.rows} rounds={args.rounds} database={args.database} "
        f"master={MASTER} partitions={PARTITIONS} batch_rows={BATCH_ROWS} "
        f"pg_settings={args.pg_setting or 'defaults'} stream_seconds={args.stream_seconds} "
        f"stream_rate={args.stream_rate} trigger={STREAM_TRIGGER!r}"
    )
    with tempfile.TemporaryDirectory(prefix="relay-spark-bench-") as tmp:
        pg = None
        if args.database == "postgresql":
            pg = PostgresServer(Path(tmp) / "pg", settings=args.pg_setting)
            pg.start()
            pg.psql("CREATE DATABASE bench")
            url = pg.url("bench")
        else:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        try:
            results = run(url, args, Path(tmp), pg)
        finally:
            if pg is not None:
                pg.stop()
    report(results, args)
    return 0


def run(
    url: str, args: argparse.Namespace, tmp: Path, pg: PostgresServer | None
) -> dict[str, float]:
    """Every measure's median: rows/s for the writes and their CPU microseconds per row (this
    process's tree: the driver, Spark's JVM and its Python workers; and PostgreSQL's),
    seconds for the one-row writes."""
    migrate(url)
    engine = create_engine(url)
    binary, collate = (
        ("BYTEA", 'COLLATE "C"') if engine.dialect.name == "postgresql" else ("BLOB", "")
    )
    with engine.begin() as conn:
        for table, unique in PLAIN_TABLES.items():
            conn.execute(
                sa.text(
                    f"CREATE TABLE {table} (message_id TEXT {collate} {unique}, "
                    "exchange TEXT, routing_key TEXT, payload "
                    f"{binary}, content_type TEXT, headers TEXT, ordering_key TEXT)"
                )
            )
    for name, value in LOCAL_MODE_ENV.items():
        os.environ.setdefault(name, value)
    spark = session()
    try:
        df = frame(spark, args.rows)
        writes = writers(df, url, args.rows)
        measured: dict[str, list[tuple[float, float, float]]] = {name: [] for name in writes}
        for round_ in range(args.rounds):
            order = args.only if round_ % 2 == 0 else args.only[::-1]
            for name in order:
                clean(engine)
                before = cpu(pg)
                start = time.perf_counter()
                writes[name]()
                seconds = time.perf_counter() - start
                spark_cpu, pg_cpu = (
                    (b - a) * 1e6 / args.rows for a, b in zip(before, cpu(pg), strict=True)
                )
                measured[name].append((args.rows / seconds, spark_cpu, pg_cpu))
                print(
                    f"  round {round_ + 1} {name}: {args.rows / seconds:.0f} rows/s, CPU "
                    f"{spark_cpu:.1f} us/row Spark, {pg_cpu:.1f} us/row database"
                )
        results = {}
        for name, runs in measured.items():
            for i, unit in enumerate(("rows_per_s", "spark_cpu_us_per_row", "db_cpu_us_per_row")):
                results[f"{name}_{unit}"] = statistics.median(r[i] for r in runs)
    finally:
        spark.stop()
    try:
        if args.one_row_rounds:
            results.update(one_row(url, engine, args.one_row_rounds))
        if args.stream_seconds > 0 and engine.dialect.name == "postgresql":
            spark = session()
            try:
                results.update(streaming(spark, url, engine, args, tmp))
            finally:
                spark.stop()
    finally:
        engine.dispose()
    return results


def session() -> SparkSession:
    """A new SparkSession (a new SparkContext, with new Python workers)."""
    spark = (
        SparkSession.builder.master(MASTER)
        .config("spark.jars", DEBIAN_JARS)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH_ROWS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def cpu(pg: PostgresServer | None) -> tuple[float, float]:
    """CPU seconds so far of this process's tree and of PostgreSQL's (0 for SQLite: it runs
    inside the writers)."""
    return tree_cpu_seconds(os.getpid()), tree_cpu_seconds(pg.pid()) if pg else 0.0


def frame(spark: SparkSession, rows: int) -> DataFrame:
    padded_id = F.lpad(F.col("id").cast("string"), 10, "0")
    payload = F.concat(F.lit("x" * 190), padded_id).alias("payload")
    df = spark.range(rows, numPartitions=PARTITIONS).select(F.col("id"), payload).cache()
    df.count()
    return df


def writers(df: DataFrame, url: str, rows: int) -> dict[str, Callable[[], None]]:
    """Each measure's write of ``df``."""
    jdbc_df = df.select(
        F.sha2(F.col("id").cast("string"), 256).alias("message_id"),
        F.lit("orders").alias("exchange"),
        F.lit("order.created").alias("routing_key"),
        F.col("payload").cast("binary").alias("payload"),
        F.lit("text/plain; charset=utf-8").alias("content_type"),
        F.lit(None).cast("string").alias("headers"),
        F.lit(None).cast("string").alias("ordering_key"),
    )
    jdbc_url, properties = jdbc_target(url)
    if jdbc_url.startswith("jdbc:sqlite:"):
        jdbc_df = jdbc_df.coalesce(1)
    properties = {**properties, "batchsize": str(BATCH_ROWS), "reWriteBatchedInserts": "true"}

    def jdbc(table: str) -> None:
        jdbc_df.write.jdbc(jdbc_url, table, mode="append", properties=properties)

    def outbox_writer(atomic: bool) -> None:
        result = write_outbox(
            df,
            url,
            payload="payload",
            exchange="orders",
            routing_key="order.created",
            key=["id"],
            atomic=atomic,
        )
        assert result.inserted == rows, result

    return {
        "plain_append": functools.partial(jdbc, "plain_append"),
        "unique_append": functools.partial(jdbc, "unique_append"),
        "jdbc_outbox": functools.partial(jdbc, "outbox"),
        "outbox": functools.partial(outbox_writer, False),
        "outbox_atomic": functools.partial(outbox_writer, True),
    }


def clean(engine: sa.Engine) -> None:
    """Every table the writes fill emptied, and a checkpoint: no measure pays for another's
    rows, dead tuples or pending WAL."""
    tables = [*PLAIN_TABLES, outbox.name, outbox_sent.name]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text(f"TRUNCATE {', '.join(tables)}"))
            conn.execute(sa.text("CHECKPOINT"))
        else:
            for table in tables:
                conn.execute(sa.text(f"DELETE FROM {table}"))


class NothingWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()


class NothingSource(DataSource):
    """A Python data source that writes nothing: what Spark itself costs any Python writer
    (its planner, task and commit, each a Python process of its own)."""

    @classmethod
    def name(cls) -> str:
        return "nothing"

    def writer(self, schema: Any, overwrite: bool) -> NothingWriter:
        return NothingWriter()


def one_row(url: str, engine: sa.Engine, rounds: int) -> dict[str, float]:
    """Median seconds of a one-row write: Spark's JDBC append into the outbox, a Python data
    source that writes nothing, and the outbox writer, each the first write of a new
    SparkSession: its fixed cost, Python workers started and the writer imported in them
    included."""
    seconds: dict[str, list[float]] = {"jdbc_outbox": [], "nothing_source": [], "outbox": []}
    for round_ in range(rounds):
        for name in seconds if round_ % 2 == 0 else list(seconds)[::-1]:
            spark = session()
            try:
                df = frame(spark, 1)
                write: Callable[[], None]
                if name == "nothing_source":
                    spark.dataSource.register(NothingSource)
                    write = df.write.format(NothingSource.name()).mode("append").save
                else:
                    write = writers(df, url, 1)[name]
                clean(engine)
                start = time.perf_counter()
                write()
                seconds[name].append(time.perf_counter() - start)
            finally:
                spark.stop()
    return {f"one_row_{name}_s": statistics.median(s) for name, s in seconds.items()}


def streaming(
    spark: SparkSession, url: str, engine: sa.Engine, args: argparse.Namespace, tmp: Path
) -> dict[str, float]:
    """``writeStream.format("outbox")`` from a rate source while ``relay run`` drains."""
    clean(engine)
    register(spark)
    node = RabbitNode(tmp / "rabbit", name="relay-spark-bench")
    node.start()
    fresh_queue(node.url, QUEUE, None)
    port = free_port()
    relay = RelayProcess(
        relay_env(
            RELAY_DATABASE_URL=url,
            RELAY_AMQP_URL=node.url,
            RELAY_LOG_LEVEL="warning",
            RELAY_NAME="spark-bench",
            RELAY_METRICS_PORT=str(port),
        )
    ).start()
    try:
        wait_until(lambda: answers_ok(f"http://127.0.0.1:{port}/readyz"), 60, "the relay ready")
        rows = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.stream_rate)
            .option("numPartitions", PARTITIONS)
            .load()
            .select(
                F.col("value"),
                F.concat(F.lit("x" * 180), F.lpad(F.col("value").cast("string"), 20, "0")).alias(
                    "payload"
                ),
            )
        )
        query = (
            rows.writeStream.format("outbox")
            .option("url", url)
            .option("payload", "payload")
            .option("routingKey", QUEUE)
            .option("key", "value")
            .option("checkpointLocation", str(tmp / "checkpoint"))
            .trigger(processingTime=STREAM_TRIGGER)
            .start()
        )
        sent_before, started = sent(engine), time.monotonic()
        time.sleep(args.stream_seconds)
        sent_after, elapsed = sent(engine), time.monotonic() - started
        query.stop()
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0][1:]
    finally:
        relay.stop()
        node.stop()
    if not progress:
        raise SystemExit("no micro-batch after the first finished: raise --stream-seconds")
    rates = [p["processedRowsPerSecond"] for p in progress]
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    return {
        "streaming_rows_per_s": statistics.median(rates),
        "streaming_batches": len(progress),
        "streaming_kept_up": float(all(d <= STREAM_TRIGGER_S for d in durations)),
        "relay_drain_rows_per_s": (sent_after - sent_before) / elapsed,
    }


def sent(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(outbox_sent)).scalar_one())


def report(results: dict[str, float], args: argparse.Namespace) -> None:
    anchor = results.get("jdbc_outbox_rows_per_s", math.nan)
    heading = f"measure (median of {args.rounds})"
    print(
        f"\n{heading:<28} {'rows/s':>10} {'/ jdbc_outbox':>14} {'CPU us/row: Spark':>18} {'db':>5}"
    )
    for name in args.only:
        rate = results[f"{name}_rows_per_s"]
        spark_cpu, db_cpu = (results[f"{name}_{u}_cpu_us_per_row"] for u in ("spark", "db"))
        print(f"{name:<28} {rate:>10.0f} {rate / anchor:>14.2f} {spark_cpu:>18.1f} {db_cpu:>5.1f}")
    extra = results.get("one_row_outbox_s", math.nan) - results.get("one_row_jdbc_outbox_s", 0)
    if args.one_row_rounds:
        print(
            f"one-row write: JDBC {results['one_row_jdbc_outbox_s']:.2f} s, a Python data "
            f"source writing nothing {results['one_row_nothing_source_s']:.2f} s, outbox "
            f"{results['one_row_outbox_s']:.2f} s ({extra:+.2f} s over JDBC; median of "
            f"{args.one_row_rounds})"
        )
    if "streaming_rows_per_s" in results:
        print(
            f"stream: {results['streaming_rows_per_s']:.0f} rows/s per micro-batch (median), "
            f"kept up with {args.stream_rate} rows/s: {bool(results['streaming_kept_up'])}; "
            f"relay drained {results['relay_drain_rows_per_s']:.0f} rows/s meanwhile"
        )
    print(
        json.dumps(
            {
                "rows": args.rows,
                "rounds": args.rounds,
                "database": args.database,
                **{k: round(v, 3) for k, v in results.items()},
                "outbox_over_jdbc_outbox": round(
                    results.get("outbox_rows_per_s", math.nan) / anchor, 3
                ),
                "atomic_over_jdbc_outbox": round(
                    results.get("outbox_atomic_rows_per_s", math.nan) / anchor, 3
                ),
                "one_row_extra_s": round(extra, 3),
            }
        )
    )


def jdbc_target(url: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties of the SQLAlchemy URL ``url``."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "postgresql":
        props = {"driver": "org.postgresql.Driver", "user": parsed.username or ""}
        if parsed.password:
            props["password"] = str(parsed.password)
        port = f":{parsed.port}" if parsed.port else ""
        return f"jdbc:postgresql://{parsed.host or 'localhost'}{port}/{parsed.database}", props
    return f"jdbc:sqlite:{parsed.database}", {"driver": "org.sqlite.JDBC"}


if __name__ == "__main__":
    sys.exit(main())
