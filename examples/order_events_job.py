"""Example Spark job: order events into the outbox, safe to re-run.

Copy it and replace ``order_events`` with your own DataFrame. Run it with spark-submit:

    spark-submit examples/order_events_job.py --database-url postgresql://app:secret@db/outbox

or as a plain Python script where PySpark is installed (local mode). Each (order_id, event)
pair is one message: its message_id is a hash of those two values, so running the job again
over the same orders adds nothing to the outbox, and a retried Spark task cannot add a
message twice. The order id is the ordering key and the events are sorted by their step, so
with ``RELAY_ORDERING=true`` each order's events are published created, paid, shipped.
Then ``relay run`` publishes what the job wrote.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from relay.spark import write_outbox


def order_events(spark: SparkSession, orders: int) -> DataFrame:
    """Three events (created, paid, shipped) for each of ``orders`` orders."""
    events = spark.createDataFrame(
        [("created", 1), ("paid", 2), ("shipped", 3)], "event string, step int"
    )
    return (
        spark.range(1000, 1000 + orders)
        .withColumnRenamed("id", "order_id")
        .crossJoin(events)
        .withColumn("amount_cents", F.col("order_id") * 7 % 5000 + 999)
        .withColumn("tenant", F.concat(F.lit("tenant-"), (F.col("order_id") % 3).cast("string")))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write order events into the outbox.")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("RELAY_DATABASE_URL", "sqlite:///outbox.db"),
        help="outbox database, as RELAY_DATABASE_URL [%(default)s]",
    )
    parser.add_argument("--orders", type=int, default=4, help="how many orders [%(default)s]")
    parser.add_argument("--exchange", default="orders", help="exchange [%(default)s]")
    args = parser.parse_args(argv)

    spark = (
        SparkSession.builder.appName("order-events-to-outbox")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # Ids follow the DataFrame's order for rows with an ordering key: sort by step.
        events = (
            order_events(spark, args.orders)
            .orderBy("order_id", "step")
            .select(
                "order_id",
                "event",
                F.struct("order_id", "event", "amount_cents").alias("body"),
                F.create_map(
                    F.lit("tenant"), F.col("tenant"), F.lit("schema"), F.lit("order-event/1")
                ).alias("headers"),
            )
        )
        result = write_outbox(
            events,
            args.database_url,
            payload="body",
            exchange=args.exchange,
            routing_key=F.concat(F.lit("order."), F.col("event")),
            headers="headers",
            ordering_key=F.col("order_id"),
            key=["order_id", "event"],
        )
    finally:
        spark.stop()
    print(f"{result.inserted} new messages in the outbox ({result.rows} rows written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
