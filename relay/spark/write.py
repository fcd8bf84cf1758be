"""``write_outbox``: a DataFrame into the outbox in one Python call (the package docstring
says how rows are identified), and ``register`` for ``df.write.format("outbox")``."""

from __future__ import annotations

import importlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from relay import errors
from relay.db.sink import OutboxSink
from relay.spark.options import INTERNAL_PREFIX, WriteOptions
from relay.spark.source import NAME, OutboxDataSource, prepare
from relay.tracing import TRACEPARENT, TRACESTATE

# How a task's error reads inside the exception Spark raises on the driver.
_TASK_ERROR = re.compile(r"relay\.errors\.(\w+): (.*)")
# A Python worker (Spark's planner, a task, the commit) whose Python lacks a package.
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
OCCURRENCE = f"{INTERNAL_PREFIX}occurrence"
TRACEPARENT_COLUMN = f"{INTERNAL_PREFIX}traceparent"
POSITION = f"{INTERNAL_PREFIX}position"


@dataclass(frozen=True)
class WriteResult:
    rows: int  # rows the DataFrame had (more if retried tasks wrote rows twice)
    inserted: int  # rows new to the outbox


def register(spark: SparkSession) -> None:
    """Make ``format("outbox")`` known to ``spark``."""
    spark.dataSource.register(OutboxDataSource)


def write_outbox(
    df: DataFrame,
    database_url: str,
    *,
    payload: str = "payload",
    exchange: str | Column = "",
    routing_key: str | Column = "",
    content_type: str | Column | None = None,
    headers: str | None = None,
    ordering_key: str | Column | None = None,
    key: Sequence[str] = (),
    run_id: str | None = None,
    message_id_prefix: str = "",
    atomic: bool = False,
    max_payload_bytes: int | None = None,
    traceparent: str | Column | None = None,
    tracestate: str | None = None,
) -> WriteResult:
    """Append ``df``'s rows to the outbox at ``database_url`` (a SQLAlchemy URL, as
    ``RELAY_DATABASE_URL``); each row becomes one message. The README's Spark section lists
    the options; this is ``df.write.format("outbox")`` with them.

    ``exchange``, ``routing_key``, ``content_type``, ``ordering_key``: a value for every row,
    or a Column. ``ordering_key``: rows with the same key get ids in the DataFrame's order
    (each key's rows are put into one partition, in order, for the write).
    ``atomic``: nothing is visible to the relay until every row is in (one transaction at
    the end) instead of each partition committing on its own.
    ``traceparent`` (and ``tracestate``): the W3C trace context the messages continue, for
    every row, or a Column of each row's own; by default the driver's current OpenTelemetry
    context, when OpenTelemetry is installed and a span is active.
    A bad option, or a column missing or of the wrong type, raises InputError before
    anything is written. Values are checked inside the tasks (a null payload, a value too
    long, headers that are not JSON): a bad value raises InputError when its task meets it.
    In the default mode the partitions that finished first stay committed, and the error
    says how many rows they added; writing the fixed data again adds only the rest. An
    atomic write leaves nothing. So do Spark's Python workers when they cannot import this
    package (ConfigError: where to install it) and executors that cannot reach the database
    (StoreError, with the driver's error).
    """
    options: dict[str, str] = {"url": database_url, "payload": payload}
    frame = df
    fields = {
        "exchange": exchange,
        "routingKey": routing_key,
        "contentType": content_type,
        "orderingKey": ordering_key,
    }
    if ordering_key is not None:
        # The DataFrame's order, taken before any shuffle below.
        frame = frame.withColumn(POSITION, F.monotonically_increasing_id())
    for name, value in fields.items():
        if isinstance(value, Column):
            column = f"{INTERNAL_PREFIX}{name}"
            frame = _with_text(frame, column, value, name)
            options[f"{name}Column"] = column
        elif value is not None:
            options[name] = value
    if headers is not None:
        options["headers"] = headers
    if isinstance(traceparent, Column):
        frame = _with_text(frame, TRACEPARENT_COLUMN, traceparent, "traceparent")
        options["traceparentColumn"] = TRACEPARENT_COLUMN
    else:
        context = (
            {TRACEPARENT: traceparent, TRACESTATE: tracestate or ""}
            if traceparent is not None
            else _current_context()
        )
        options.update({k: v for k, v in context.items() if v})
    if key:
        options["key"] = ",".join(key)
    if run_id is not None:
        options["runId"] = run_id
        if not key:
            frame = _number_identical_rows(frame)
            options["occurrenceColumn"] = OCCURRENCE
    options["messageIdPrefix"] = message_id_prefix
    options["atomic"] = str(atomic).lower()
    if max_payload_bytes is not None:
        options["maxPayloadBytes"] = str(max_payload_bytes)
    # The same checks the data source makes, here first: the caller gets the relay's own
    # exception types, not Spark's wrapping of them.
    parsed = WriteOptions.parse(options, frame.schema, streaming=False)
    sink = OutboxSink(database_url)
    try:
        prepare(sink, parsed)
        options["prepared"] = "true"
        return _write(frame, options, sink, ordering_key, atomic=atomic)
    finally:
        sink.close()


def _write(
    frame: DataFrame,
    options: dict[str, str],
    sink: OutboxSink,
    ordering_key: str | Column | None,
    *,
    atomic: bool,
) -> WriteResult:
    if ordering_key is not None:
        if atomic:  # the merge gives ids in the written partitions' order
            frame = frame.orderBy(POSITION)
        else:  # each partition commits by itself: one key's rows must share one
            by = F.col(options["orderingKeyColumn"]) if isinstance(ordering_key, Column) else None
            frame = frame.repartition(by if by is not None else F.lit(ordering_key))
            frame = frame.sortWithinPartitions(POSITION)
    register(frame.sparkSession)
    fd, report = tempfile.mkstemp(prefix="outbox-write-", suffix=".json")
    os.close(fd)
    try:
        with ExitStack() as held:
            if atomic:
                # Held while the write runs: if this process dies, the next atomic write or
                # `relay purge` drops the stage at once; while it lives, never.
                options["stageTable"] = stage = held.enter_context(sink.held_stage())
            try:
                frame.write.format(NAME).options(**options, reportPath=report).mode("append").save()
            except Exception as exc:
                if atomic:  # failed before the data source took the stage over, perhaps
                    sink.drop_stage(stage)
                raise _relay_error(exc, _committed(report, atomic=atomic)) from exc
        result = json.loads(Path(report).read_text())
    finally:
        Path(report).unlink(missing_ok=True)
    return WriteResult(result["rows"], result["inserted"])


def _with_text(frame: DataFrame, name: str, value: Column, option: str) -> DataFrame:
    """``frame`` with the Column ``value`` as text in column ``name``. A Column Spark cannot
    resolve (a misspelt column) raises InputError, as every other bad column does, instead
    of Spark's AnalysisException."""
    try:
        return frame.withColumn(name, value.cast("string"))
    except AnalysisException as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        message = f"option {option}: Spark cannot compute the column: {first_line}"
        raise errors.InputError(message) from None


def _current_context() -> dict[str, str]:
    """The driver's current trace context (``traceparent``, ``tracestate``), when OpenTelemetry
    is installed (it is optional) and a span is active; else nothing."""
    try:
        propagate = importlib.import_module("opentelemetry.propagate")
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in (TRACEPARENT, TRACESTATE)}


def _committed(report: str, *, atomic: bool) -> str:
    """What a failed write left in the outbox, as its error says it."""
    if atomic:
        return "nothing of this write is in the outbox (atomic)"
    try:
        inserted = int(json.loads(Path(report).read_text())["inserted"])
    except (OSError, ValueError, KeyError, TypeError):
        return "partitions that finished first may have committed their rows"
    return (
        f"at least {inserted} rows of partitions that finished first were committed; fix the "
        "cause and write again: the rows already in the outbox are skipped by message id, so "
        "the re-run completes the write with each message once"
    )


def _relay_error(exc: Exception, committed: str) -> Exception:
    """The relay's own error a task raised (a bad value, a database it cannot reach), out of
    Spark's wrapping of it, or a Python worker's missing package, with what the write left
    behind (``committed``)."""
    text = str(exc)
    found = _TASK_ERROR.search(text)
    kind = getattr(errors, found[1], None) if found else None
    if found and isinstance(kind, type) and issubclass(kind, errors.RelayError):
        return kind(f"{found[2]}; {committed}")
    if missing := _MISSING_MODULE.search(text):
        return errors.ConfigError(
            f"Spark's Python workers cannot import {missing[1]!r}: install outbox-relay[spark] "
            "into the Python that spark.pyspark.python (or PYSPARK_PYTHON) names, on the "
            f"driver's host and every worker's; {committed}"
        )
    return exc


def _number_identical_rows(frame: DataFrame) -> DataFrame:
    """Each row's occurrence number among the rows equal to it in every column."""
    group = [
        F.to_json(F.col(f.name)) if _has_map(f.dataType) else F.col(f.name)
        for f in frame.schema.fields
        if not f.name.startswith(INTERNAL_PREFIX)
    ]
    # Maps cannot be grouped on: their JSON text stands in (equal maps, equal text).
    window = Window.partitionBy(*group).orderBy(F.lit(0))
    return frame.withColumn(OCCURRENCE, F.row_number().over(window) - 1)


def _has_map(kind: T.DataType) -> bool:
    if isinstance(kind, T.MapType):
        return True
    if isinstance(kind, T.ArrayType):
        return _has_map(kind.elementType)
    if isinstance(kind, T.StructType):
        return any(_has_map(f.dataType) for f in kind.fields)
    return False
