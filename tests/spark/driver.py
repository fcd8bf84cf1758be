"""A Spark driver the tests start as a process of its own, so that they can SIGKILL it.

    python -m tests.spark.driver files URL CHECKPOINT INPUT_DIR   # file source, to the end
    python -m tests.spark.driver rate URL CHECKPOINT              # rate source, until killed
    python -m tests.spark.driver atomic URL ROWS                  # one slow atomic write

Rows whose number is a multiple of SLOW_EVERY take SLOW_S seconds in the writer's input,
so that a kill lands in the middle of a batch: some partitions committed, others not.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from relay.spark import LOCAL_MODE_ENV, register, write_outbox

SLOW_EVERY = 97
SLOW_S = 1.0


def slowly(n: int) -> int:
    if n % SLOW_EVERY == 0:
        time.sleep(SLOW_S)
    return n


def main(mode: str, url: str, *args: str) -> None:
    for name, value in LOCAL_MODE_ENV.items():
        os.environ.setdefault(name, value)
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
