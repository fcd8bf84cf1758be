"""``format("outbox")``: the outbox as a Spark data source (Spark 4's Python Data Source API).

Spark runs ``writer``/``streamWriter`` on the driver, pickles the writer to the executors,
calls ``write`` once per task with that task's Arrow batches, and ``commit`` (or ``abort``)
on the driver with what the tasks returned.

- Batch, default: each task writes and commits its partition by itself (``OutboxSink.append``),
  as Spark's own JDBC append does; a failed job leaves the partitions that finished, and a
  re-run or a retried task adds only what is missing.
- Batch, ``atomic=true``: tasks fill a staging table; the driver's commit merges it into the
  outbox in one transaction, so nothing is visible to the relay until the whole DataFrame is.
- Stream: each micro-batch as the default batch write; a replayed micro-batch (the query
  restarted from its checkpoint) writes the same message ids, so it inserts nothing twice.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark import TaskContext
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from relay.spark.options import WriteOptions

if TYPE_CHECKING:
    from relay.db.sink import OutboxSink

log = logging.getLogger(__name__)
Item = TypeVar("Item")

NAME = "outbox"
# Local properties Spark sets on a micro-batch's tasks (StreamExecution, MicroBatchExecution):
# the query's id is kept in its checkpoint, so a restarted query has the same one.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class Written(WriterCommitMessage):
    """What one task wrote: rows it was given, rows new to the outbox (0 when staged)."""

    rows: int
    inserted: int


class OutboxDataSource(DataSource):
    """Register with ``spark.dataSource.register(OutboxDataSource)`` (``relay.spark.register``)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: T.StructType, overwrite: bool) -> OutboxWriter:
        return OutboxWriter(WriteOptions.parse(self.options, schema, streaming=False))

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> OutboxStreamWriter:
        return OutboxStreamWriter(WriteOptions.parse(self.options, schema, streaming=True))


class OutboxWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.stage = options.stage
        if not options.prepared:
            with _sink(options.url) as sink:
                prepare(sink, options)
                if options.atomic and self.stage is None:
                    self.stage = sink.create_stage()

    def write(self, iterator: Iterator[Any]) -> Written:
        from relay.spark.rows import RowConverter, with_rows

        partition = _task().partitionId()
        converter = RowConverter(self.options, f"partition {partition}")
        # A task over an empty partition (common after a filter or a shuffle) opens no
        # connection and imports no database code.
        chunks = with_rows(read_ahead(converter.convert(batch) for batch in iterator))
        if chunks is None:
            return Written(0, 0)
        with _sink(self.options.url) as sink:
            if self.stage is not None:
                return Written(sink.stage(self.stage, chunks, partition), 0)
            return Written(*sink.append(chunks))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, inserted = _totals(messages)
        if self.stage is not None:
            with _sink(self.options.url) as sink:
                inserted = sink.merge(self.stage, keep_order=self.options.ordered)
        log.info(
            "outbox write committed",
            extra={"action": "spark_write_committed", "rows": rows, "inserted": inserted},
        )
        if self.options.report_path is not None:
            Path(self.options.report_path).write_text(
                json.dumps({"rows": rows, "inserted": inserted})
            )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed: an atomic write's stage goes, and nothing of it is in the outbox;
        in the default mode the partitions that finished first stay committed, and the
        report says how many rows they added (``write_outbox`` puts it in its error)."""
        committed = 0
        if self.stage is not None:
            with _sink(self.options.url) as sink:
                sink.drop_stage(self.stage)
        else:
            committed = _totals(messages)[1]
        log.warning(
            "outbox write failed",
            extra={"action": "spark_write_aborted", "inserted": committed},
        )
        if self.options.report_path is not None:
            Path(self.options.report_path).write_text(
                json.dumps({"failed": True, "inserted": committed})
            )


class OutboxStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        with _sink(options.url) as sink:
            sink.check()

    def write(self, iterator: Iterator[Any]) -> Written:
        from relay.spark.rows import RowConverter, StreamBatch, with_rows

        task = _task()
        batch = StreamBatch(
            query_id=task.getLocalProperty(QUERY_ID_PROPERTY) or "",
            batch_id=int(task.getLocalProperty(BATCH_ID_PROPERTY) or -1),
            partition_id=task.partitionId(),
        )
        converter = RowConverter(self.options, f"batch {batch.batch_id}", stream=batch)
        chunks = with_rows(read_ahead(converter.convert(b) for b in iterator))
        if chunks is None:
            return Written(0, 0)
        with _sink(self.options.url) as sink:
            return Written(*sink.append(chunks))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, inserted = _totals(messages)
        log.info(
            "outbox micro-batch committed",
            extra={
                "action": "spark_batch_committed",
                "batch_id": batchId,
                "rows": rows,
                "inserted": inserted,
            },
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Partitions that committed stay: the replayed batch skips their rows by message_id.
        log.warning(
            "outbox micro-batch aborted",
            extra={"action": "spark_batch_aborted", "batch_id": batchId},
        )


def prepare(sink: OutboxSink, options: WriteOptions) -> None:
    """What a batch write does before its tasks run: the outbox checked (SchemaMissingError
    before any row is read) and, atomic, the stages of killed writes dropped."""
    sink.check()
    if options.atomic:
        for name in sink.drop_abandoned_stages(options.stage_abandoned_s):
            log.warning(
                "dropped an abandoned staging table",
                extra={"action": "spark_stage_dropped", "table": name},
            )


@contextmanager
def _sink(url: str) -> Iterator[OutboxSink]:
    """The outbox at ``url``. Imported where a worker uses it, as the Arrow code is: Spark
    starts Python workers for every write, and the commit of a default write needs
    neither."""
    from relay.db.sink import OutboxSink

    sink = OutboxSink(url)
    try:
        yield sink
    finally:
        sink.close()


def read_ahead(items: Iterator[Item]) -> Iterator[Item]:
    """``items``, each next one made in a thread while the caller handles the one before: a
    task converts its next chunk while PostgreSQL takes in the one before (Arrow compute,
    hashing and the socket writes release the GIL). Stops making them when the caller
    stops."""
    with ThreadPoolExecutor(1, thread_name_prefix="outbox-read-ahead") as pool:
        upcoming = pool.submit(list, itertools.islice(items, 1))
        while made := upcoming.result():
            upcoming = pool.submit(list, itertools.islice(items, 1))
            yield made[0]


def _task() -> TaskContext:
    task = TaskContext.get()
    assert task is not None, "write runs in a Spark task"
    return task


def _totals(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    """(rows, inserted) over the tasks' commit messages."""
    written = [m for m in messages if isinstance(m, Written)]
    return sum(m.rows for m in written), sum(m.inserted for m in written)
