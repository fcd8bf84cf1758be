"""Benchmark: the Spark outbox writer against a plain Spark JDBC append, same database, same run.

    .venv/bin/python -m bench.spark_write [--rows 1000000] [--database postgresql|sqlite]

Builds one DataFrame (200-byte payloads), then times (a) ``df.write.jdbc(mode="append")``
into a plain table with the outbox's columns and no indexes, (b) the same append into a
table whose message_id is unique, as the outbox's is (what the index that makes writes
idempotent costs by itself; such an append still fails on a duplicate), (c) the outbox
writer, ``format("outbox")``, into a migrated outbox (each partition committed by itself)
and (d) the same with ``atomic=True`` (staged, merged in one transaction). Prints a table
and, last, one JSON line. By hand only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from devtools.servers import PostgresServer
from relay.db.engine import create_engine, migrate
from relay.spark import LOCAL_MODE_ENV, write_outbox

# The JDBC drivers Debian ships (libpostgresql-jdbc-java, libxerial-sqlite-jdbc-java): only
# the plain appends use them, the outbox writer does not.
DEBIAN_JARS = "/usr/share/java/postgresql.jar,/usr/share/java/sqlite-jdbc.jar"
# Rows per JDBC batch for the plain appends, and the PostgreSQL driver's multi-row rewrite.
JDBC_BATCH_SIZE = 5000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--database", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a PostgreSQL setting (repeat), e.g. shared_buffers=2GB",
    )
    args = parser.parse_args()
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
            results = run(url, args.rows)
        finally:
            if pg is not None:
                pg.stop()
    plain, unique, outbox = (results[k] for k in ("plain_append", "unique_append", "outbox"))
    print(f"\n{'measure':<16} {'rows/s':>10} {'seconds':>8}")
    for name, (rate, seconds) in results.items():
        print(f"{name:<16} {rate:>10.0f} {seconds:>8.1f}")
    ratio, ratio_unique = outbox[0] / plain[0], outbox[0] / unique[0]
    print(
        f"outbox writer / plain append: {ratio:.2f}, / unique append: {ratio_unique:.2f}; "
        f"atomic / plain append: {results['outbox_atomic'][0] / plain[0]:.2f} "
        f"({args.rows} rows, {args.database})"
    )
    print(
        json.dumps(
            {
                "rows": args.rows,
                "database": args.database,
                **{f"{k}_rows_per_s": round(v[0], 1) for k, v in results.items()},
                "ratio": round(ratio, 3),
                "ratio_to_unique": round(ratio_unique, 3),
            }
        )
    )
    return 0


PLAIN_TABLES = {"plain_append": "", "unique_append": "UNIQUE"}


def run(url: str, rows: int) -> dict[str, tuple[float, float]]:
    migrate(url)
    engine = create_engine(url)
    binary, collate = ("BYTEA", 'COLLATE "C"') if "postgresql" in url else ("BLOB", "")
    with engine.begin() as conn:
        for table, unique in PLAIN_TABLES.items():
            conn.execute(
                sa.text(
                    f"CREATE TABLE {table} (message_id TEXT {collate} {unique}, "
                    "exchange TEXT, routing_key TEXT, "
                    f"payload {binary}, content_type TEXT, headers TEXT)"
                )
            )
    engine.dispose()
    for name, value in LOCAL_MODE_ENV.items():
        os.environ.setdefault(name, value)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", DEBIAN_JARS)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        padded_id = F.lpad(F.col("id").cast("string"), 10, "0")
        payload = F.concat(F.lit("x" * 190), padded_id).alias("payload")
        df = spark.range(rows).select(F.col("id"), payload).cache()
        df.count()
        plain_df = df.select(
            F.sha2(F.col("id").cast("string"), 256).alias("message_id"),
            F.lit("orders").alias("exchange"),
            F.lit("order.created").alias("routing_key"),
            F.col("payload").cast("binary").alias("payload"),
            F.lit("text/plain; charset=utf-8").alias("content_type"),
            F.lit(None).cast("string").alias("headers"),
        )
        jdbc_url, properties = jdbc_target(url)
        if jdbc_url.startswith("jdbc:sqlite:"):
            plain_df = plain_df.coalesce(1)
        seconds = {}
        for table in PLAIN_TABLES:
            start = time.perf_counter()
            plain_df.write.jdbc(
                jdbc_url,
                table,
                mode="append",
                properties={
                    **properties,
                    "batchsize": str(JDBC_BATCH_SIZE),
                    "reWriteBatchedInserts": "true",
                },
            )
            seconds[table] = time.perf_counter() - start
        for name, atomic in (("outbox", False), ("outbox_atomic", True)):
            start = time.perf_counter()
            result = write_outbox(
                df,
                url,
                payload="payload",
                exchange="orders",
                routing_key="order.created",
                key=["id"],
                message_id_prefix=f"{name}-",
                atomic=atomic,
            )
            seconds[name] = time.perf_counter() - start
            assert result.inserted == rows, result
    finally:
        spark.stop()
    return {name: (rows / s, s) for name, s in seconds.items()}


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
