"""Benchmark: the Spark writer's Python work per row inside a task, without Spark or a database.

    .venv/bin/python -m bench.spark_task [--rows 200000] [--batch 10000] [--rounds 5]

Builds Arrow batches shaped as bench/spark_write.py's DataFrame (a long ``id`` key, a
200-character string payload) and measures, in CPU microseconds per row of this process
(``getrusage``, medians of ``--rounds`` interleaved rounds): ``convert``, the whole
conversion of a batch into its COPY data (``RowConverter.convert`` and ``Chunk.copy_data``,
what a task does before PostgreSQL takes the rows), and ``message_ids``, the identity
alone. Pure CPU work on one core, so the figures move far less than a rate does on this
shared machine. By hand only.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import types as T

from relay.identity import encode, message_ids
from relay.spark.encodings import joined
from relay.spark.options import WriteOptions
from relay.spark.rows import RowConverter

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("payload", T.StringType())])
OPTIONS = {"url": "sqlite://", "exchange": "orders", "routingKey": "order.created", "key": "id"}


def batches(rows: int, size: int) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, rows, size):
        ids = range(start, min(rows, start + size))
        out.append(
            pa.record_batch(
                [pa.array(ids, pa.int64()), pa.array([f"{'x' * 190}{i:010d}" for i in ids])],
                names=["id", "payload"],
            )
        )
    return out


def cpu_us_per_row(work: Callable[[], object], rows: int) -> float:
    def seconds() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    start = seconds()
    work()
    return (seconds() - start) * 1e6 / rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    data = batches(args.rows, args.batch)
    options = WriteOptions.parse(OPTIONS, SCHEMA, streaming=False)

    def convert() -> None:
        converter = RowConverter(options, "partition 0")
        for batch in data:
            converter.convert(batch).copy_data()

    def ids() -> None:
        for batch in data:
            message_ids(joined(encode("key"), [batch.column("id")]))

    measures = {"convert": convert, "message_ids": ids}
    figures: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(args.rounds):
        for name, work in measures.items():
            figures[name].append(cpu_us_per_row(work, args.rows))
    report = {name: round(statistics.median(v), 2) for name, v in figures.items()}
    for name, value in report.items():
        print(f"{name:<12} {value:>6.2f} us of CPU per row")
    print(json.dumps({"rows": args.rows, "batch": args.batch, "us_per_row": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
