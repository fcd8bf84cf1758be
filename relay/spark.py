"""Write Spark DataFrames into the outbox through JDBC, safe under task retries and re-runs.

Install with the ``spark`` extra; the relay daemon never imports this module.

Spark re-runs failed tasks, runs speculative copies, and people re-run whole jobs: a plain
JDBC append would then insert a message twice, under two ids. Instead every row gets a
deterministic ``message_id`` (its idempotency key, unique in the outbox), the DataFrame is
appended to a staging table of its own, and one transaction inserts the staged rows whose
``message_id`` the outbox does not have yet, then drops the staging table. Whatever the
retries staged twice, and whatever an earlier run already inserted, is skipped.

For a re-run of the same job to add nothing, pass either
- ``key``: the columns that identify a message (for example ``["order_id", "event"]``);
  ``message_id`` is a hash of their values, whatever else changes; or
- ``run_id`` (and no ``key``): a name for this logical run, such as the job name and the
  date it processes. ``message_id`` hashes the run id, the row's content and its position,
  so a re-run with the same run id over the same input (same partitioning) adds nothing.

The JDBC drivers come from Debian's ``libpostgresql-jdbc-java`` and
``libxerial-sqlite-jdbc-java``: put ``spark_jars()`` into ``spark.jars`` (or pass them with
``spark-submit --jars``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from relay.constants import JDBC_BATCH_SIZE
from relay.db.staging import STAGED_COLUMNS, STAGED_POSITION, Staging
from relay.errors import InputError

DEBIAN_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/sqlite-jdbc.jar")
_SEPARATOR = "\x1f"


# Local-mode Spark on loopback, with no host name to resolve: a minimal machine or container
# may have no /etc/hosts, and then neither the machine's name nor "localhost" resolves.
# SPARK_LOCAL_IP/HOSTNAME keep the JVM on 127.0.0.1 (UnknownHostException at start-up
# otherwise); PYSPARK_UDS_MODE puts PySpark's accumulator server, which would bind
# ("localhost", 0) from Python, on a Unix-domain socket instead.
LOCAL_MODE_ENV = {
    "SPARK_LOCAL_IP": "127.0.0.1",
    "SPARK_LOCAL_HOSTNAME": "localhost",
    "PYSPARK_UDS_MODE": "true",
}


def spark_jars(jars: Sequence[str] = DEBIAN_JARS) -> str:
    """The ``spark.jars`` value for the JDBC drivers; fails clearly if one is missing."""
    missing = [j for j in jars if not Path(j).exists()]
    if missing:
        raise InputError(
            f"JDBC driver not found: {', '.join(missing)} (Debian: apt-get install "
            "libpostgresql-jdbc-java libxerial-sqlite-jdbc-java)"
        )
    return ",".join(jars)


@dataclass(frozen=True)
class WriteResult:
    staged: int  # rows the DataFrame had (more if retried tasks staged rows twice)
    inserted: int  # rows new to the outbox


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
) -> WriteResult:
    """Append ``df``'s rows to the outbox at ``database_url`` (a SQLAlchemy URL, as
    ``RELAY_DATABASE_URL``); each row becomes one message.

    ``payload``: the column with the body: string (UTF-8), binary, or a struct, map or array
    (serialised to JSON). ``exchange``, ``routing_key``: a value for every row, or a Column.
    ``content_type``: a value or a Column; by default from the payload's type. ``headers``: a
    map or struct column (serialised to JSON) or a string column of JSON objects.
    ``ordering_key``: a value or a Column; rows with the same ordering key are published in
    the DataFrame's order when the relay's ordering is on (sort it first, for example with
    ``orderBy``, or ``repartition`` by the key and ``sortWithinPartitions``). Without one,
    rows are inserted in message_id order, which is faster. ``key`` / ``run_id``: see the
    module docstring.
    Nothing is written when a check fails.
    """
    frame = outbox_frame(
        df,
        payload=payload,
        exchange=exchange,
        routing_key=routing_key,
        content_type=content_type,
        headers=headers,
        ordering_key=ordering_key,
        key=key,
        run_id=run_id,
        message_id_prefix=message_id_prefix,
    )
    with Staging(database_url) as staging:
        jdbc_url, properties = staging.jdbc_target()
        stage = f"outbox_stage_{uuid.uuid4().hex[:16]}"
        staging.create(stage)
        try:
            if jdbc_url.startswith("jdbc:sqlite:"):
                frame = frame.coalesce(1)  # SQLite takes one writer at a time
            # Multi-row INSERTs (the PostgreSQL driver's rewrite): staging costs half as much.
            postgresql = jdbc_url.startswith("jdbc:postgresql:")
            rewrite = {"reWriteBatchedInserts": "true"} if postgresql else {}
            batch = {"batchsize": str(JDBC_BATCH_SIZE)}
            frame.write.jdbc(
                jdbc_url, stage, mode="append", properties={**properties, **rewrite, **batch}
            )
            try:
                staged, inserted = staging.merge(stage, keep_order=ordering_key is not None)
            except InputError as exc:
                raise InputError(f"column {payload!r}: {exc}") from None
        except BaseException:
            staging.drop(stage)
            raise
    return WriteResult(staged, inserted)


def outbox_frame(
    df: DataFrame,
    *,
    payload: str,
    exchange: str | Column,
    routing_key: str | Column,
    content_type: str | Column | None,
    headers: str | None,
    ordering_key: str | Column | None,
    key: Sequence[str],
    run_id: str | None,
    message_id_prefix: str,
) -> DataFrame:
    """The DataFrame with exactly the outbox's staged columns, checked and typed, and the
    row's position in ``df``."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    for name in [payload, *key, *([headers] if headers else [])]:
        if name not in fields:
            raise InputError(f"column {name!r} not found (the DataFrame has: {', '.join(fields)})")
    body, default_type = _payload(payload, fields[payload])
    # Increasing in the DataFrame's order (partition by partition), the same on a retry.
    position = F.monotonically_increasing_id()
    if key:
        identity = [F.coalesce(F.col(k).cast("string"), F.lit("\x00null")) for k in key]
    elif run_id:
        row = F.to_json(F.struct(*[F.col(c) for c in df.columns]))
        identity = [F.lit(run_id), position.cast("string"), row]
    else:
        raise InputError(
            "pass key columns or a run_id: without one, a re-run or a retried "
            "task would insert every message again"
        )
    digest = F.sha2(F.concat_ws(_SEPARATOR, *identity), 256)
    message_id = F.concat(F.lit(message_id_prefix), digest)
    columns = {
        "message_id": message_id,
        "exchange": _text(exchange),
        "routing_key": _text(routing_key),
        "payload": body,
        "content_type": _text(default_type if content_type is None else content_type),
        "headers": _headers(headers, fields) if headers else F.lit(None).cast("string"),
        "ordering_key": _text(ordering_key),
    }
    assert tuple(columns) == STAGED_COLUMNS
    columns[STAGED_POSITION] = position
    return df.select(*[c.alias(name) for name, c in columns.items()])


def _payload(name: str, kind: T.DataType) -> tuple[Column, str]:
    col = F.col(name)
    if isinstance(kind, T.BinaryType):
        return col, "application/octet-stream"
    if isinstance(kind, T.StringType):
        return col.cast("binary"), "text/plain; charset=utf-8"
    if isinstance(kind, (T.StructType, T.MapType, T.ArrayType)):
        return F.when(col.isNull(), None).otherwise(F.to_json(col)).cast(
            "binary"
        ), "application/json"
    raise InputError(
        f"column {name!r} has type {kind.simpleString()}: the payload must be "
        "string, binary, or a struct, map or array (sent as JSON)"
    )


def _headers(name: str, fields: dict[str, T.DataType]) -> Column:
    kind = fields[name]
    if isinstance(kind, (T.StructType, T.MapType)):
        return F.to_json(F.col(name))
    if isinstance(kind, T.StringType):
        return F.col(name)
    raise InputError(
        f"column {name!r} has type {kind.simpleString()}: headers must be a map "
        "or struct (sent as a JSON object), or a string of JSON"
    )


def _text(value: str | Column | None) -> Column:
    column = value if isinstance(value, Column) else F.lit(value)
    return column.cast("string")
