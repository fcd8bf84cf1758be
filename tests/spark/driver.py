"""A Spark driver the tests start as a process of its own, so that they can SIGKILL it.

    python -m tests.spark.driver files URL CHECKPOINT INPUT_DIR   # file source, to the end
    python -m tests.spark.driver rate URL CHECKPOINT              # rate source, until killed
    python -m tests.spark.driver atomic URL ROWS                  # one slow atomic write
    python -m tests.spark.driver cluster URL MASTER ROWS EVENTS  # a slow write on a cluster
    python -m tests.spark.driver speculate URL MASTER ROWS EVENTS  # one task stalls, once
    python -m tests.spark.driver broken URL without-relay|unreachable DIR  # prints errors

Rows whose number is a multiple of SLOW_EVERY take SLOW_S seconds in the writer's input,
so that a kill lands in the middle of a batch: some partitions committed, others not. On a
standalone cluster (``devtools.spark_cluster``) the driver writes Spark's event log to
EVENTS, where the tests read what Spark did (executors lost, speculative copies).
``broken`` writes 10 rows, by default and atomically, with Python workers that cannot import
this package (``without-relay``) or executors that cannot reach the database
(``unreachable``: libpq sends them to 127.0.0.2, where nothing listens), and prints each
write's error as a JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from relay.spark import LOCAL_MODE_ENV, register, write_outbox

SLOW_EVERY = 97
SLOW_S = 1.0
STALL_S = 30.0
PARTITIONS = 8
# Speculation as soon as half the tasks are done and one runs twice as long as their median.
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "200ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "2",
    "spark.speculation.minTaskRuntime": "500ms",
}


def slowly(n: int) -> int:
    if n % SLOW_EVERY == 0:
        time.sleep(SLOW_S)
    return n


def stalled_once(n: int) -> int:
    """Row 0 stalls the first attempt of its task only: a speculative copy of it does not."""
    task = TaskContext.get()
    if n == 0 and task is not None and task.attemptNumber() == 0:
        time.sleep(STALL_S)
    return n


def on_cluster(mode: str, url: str, master: str, rows: str, events: str) -> None:
    builder = (
        SparkSession.builder.master(master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executor.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", events)
        # One plain JSON-lines file per application, for the tests to read.
        .config("spark.eventLog.rolling.enabled", "false")
        .config("spark.eventLog.compress", "false")
    )
    for name, value in (SPECULATION if mode == "speculate" else {}).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    delay = F.udf(stalled_once if mode == "speculate" else slowly, T.LongType())
    df = spark.range(int(rows), numPartitions=PARTITIONS).select(
        delay(F.col("id")).alias("id"), F.to_json(F.struct("id")).alias("payload")
    )
    write_outbox(df, url, key=["id"])
    spark.stop()


def broken(url: str, kind: str, scratch: str) -> None:
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    if kind == "without-relay":
        script = Path(scratch) / "python"
        without = Path(__file__).with_name("without_relay.py")
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{without}" "$@"\n')
        script.chmod(0o755)
        os.environ["PYSPARK_PYTHON"] = str(script)
    else:
        builder = builder.config("spark.executorEnv.PGHOSTADDR", "127.0.0.2")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    df = spark.range(10, numPartitions=2).select("id", F.to_json(F.struct("id")).alias("payload"))
    for atomic in (False, True):
        try:
            write_outbox(df, url, key=["id"], atomic=atomic)
            print(json.dumps({"atomic": atomic, "error": None}), flush=True)
        except Exception as exc:
            error = {"error": type(exc).__name__, "message": str(exc)}
            print(json.dumps({"atomic": atomic, **error}), flush=True)


def main(mode: str, url: str, *args: str) -> None:
    for name, value in LOCAL_MODE_ENV.items():
        os.environ.setdefault(name, value)
    if mode in ("cluster", "speculate"):
        on_cluster(mode, url, *args)
        return
    if mode == "broken":
        broken(url, *args)
        return
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    slow = F.udf(slowly, T.LongType())
    if mode == "atomic":
        df = spark.range(int(args[0]), numPartitions=4).select(
            slow(F.col("id")).alias("id"), F.to_json(F.struct("id")).alias("payload")
        )
        write_outbox(df, url, key=["id"], atomic=True)
        return
    checkpoint = args[0]
    if mode == "files":
        source = (
            spark.readStream.schema("id long, word string")
            .option("maxFilesPerTrigger", 2)
            .json(args[1])
        )
        trigger: dict[str, Any] = {"availableNow": True}
        column = "id"
    else:
        source = (
            spark.readStream.format("rate").option("rowsPerSecond", 100).option("numPartitions", 2)
        ).load()
        trigger = {"processingTime": "500 milliseconds"}
        column = "value"
    frame = source.withColumn(column, slow(F.col(column))).withColumn(
        "payload", F.to_json(F.struct(column))
    )
    query = (
        frame.writeStream.format("outbox")
        .option("url", url)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:])
