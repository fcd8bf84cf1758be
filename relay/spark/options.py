"""The outbox data source's options, read once and checked against the DataFrame's schema.

Spark passes options as strings (case-insensitive names). Each message field is either a
value for every row (``exchange``) or the name of a string column (``exchangeColumn``);
``WriteOptions.parse`` refuses anything it cannot write before a single row is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import types as T

from relay.constants import MAX_MESSAGE_SIZE, SPARK_STAGE_ABANDONED_S
from relay.errors import InputError
from relay.message import Unpublishable, short_string
from relay.tracing import TRACEPARENT, TRACESTATE, given_context

# Columns write_outbox adds for Column arguments; they are not part of a row's content.
INTERNAL_PREFIX = "__outbox_"
# The fields that are a value or a column, with their option names and defaults.
TEXT_FIELDS = {"exchange": "", "routingKey": "", "contentType": None, "orderingKey": None}
PAYLOAD_TYPES = (T.StringType, T.BinaryType, T.StructType, T.MapType, T.ArrayType)
HEADER_TYPES = (T.StringType, T.StructType, T.MapType)
# The content type a payload gets by default, by the payload column's type (else JSON).
DEFAULT_CONTENT_TYPE = {
    T.BinaryType: "application/octet-stream",
    T.StringType: "text/plain; charset=utf-8",
}
JSON = "application/json"
# A message id is the prefix and a SHA-256 in hex.
DIGEST_HEX_LENGTH = 64


@dataclass(frozen=True)
class Field:
    """A message field: the same ``value`` for every row, or the string ``column``."""

    value: str | None
    column: str | None = None


@dataclass(frozen=True)
class WriteOptions:
    url: str
    payload: str
    fields: dict[str, Field]  # by TEXT_FIELDS name
    headers: str | None
    key: tuple[str, ...]
    run_id: str | None
    occurrence: str | None  # the column numbering identical rows (batch run_id mode)
    message_id_prefix: str
    atomic: bool
    max_payload_bytes: int
    stage_abandoned_s: int
    stage: str | None  # an atomic write's staging table, made (and held) by write_outbox
    # write_outbox has checked the outbox and dropped abandoned stages on the driver: the
    # planner, a fresh Python process, then needs no database (nor its 0.3 s of imports).
    prepared: bool
    report_path: str | None
    content: tuple[str, ...]  # the columns that make a row's content (identity without key)
    trace: dict[str, str]  # the writer's trace context, for every row (traceparent option)
    traceparent_column: str | None  # or each row's own traceparent

    @property
    def ordered(self) -> bool:
        """Rows have an ordering key: the relay publishes each key's rows in id order."""
        ordering = self.fields["orderingKey"]
        return ordering.value is not None or ordering.column is not None

    @classmethod
    def parse(
        cls, options: Mapping[str, str], schema: T.StructType, *, streaming: bool
    ) -> WriteOptions:
        """The options for writing a DataFrame of ``schema``; InputError says what is wrong."""
        opts = {k.lower(): v for k, v in options.items()}
        columns = {f.name: f.dataType for f in schema.fields}

        def column(name: str, types: tuple[type[T.DataType], ...], what: str) -> str:
            if name not in columns:
                raise InputError(
                    f"column {name!r} not found (the DataFrame has: {', '.join(columns)})"
                )
            if not isinstance(columns[name], types):
                raise InputError(f"column {name!r} has type {columns[name].simpleString()}: {what}")
            return name

        url = opts.get("url", "")
        if not url:
            raise InputError('option "url" is required: the outbox database, as RELAY_DATABASE_URL')
        payload = column(
            opts.get("payload", "payload"),
            PAYLOAD_TYPES,
            "the payload must be string, binary, or a struct, map or array (sent as JSON)",
        )
        payload_type = columns[payload]
        default_type = DEFAULT_CONTENT_TYPE.get(type(payload_type), JSON)
        fields = {}
        for name, default in TEXT_FIELDS.items():
            named = opts.get(f"{name}column".lower())
            if named is not None:
                fields[name] = Field(None, column(named, (T.StringType,), f"{name} must be text"))
            else:
                value = opts.get(name.lower(), default)
                if name == "contentType" and value is None:
                    value = default_type
                fields[name] = Field(value)
                if value is not None and name != "orderingKey":
                    _check_short(name, value)
        headers = opts.get("headers")
        if headers is not None:
            column(
                headers,
                HEADER_TYPES,
                "headers must be a map or struct (sent as a JSON object), or a string of JSON",
            )
        key = tuple(k.strip() for k in opts.get("key", "").split(",") if k.strip())
        for k in key:
            column(k, (T.DataType,), "")
        run_id = opts.get("runid") or None
        occurrence = opts.get("occurrencecolumn") or None
        if occurrence is not None:
            column(occurrence, (T.IntegerType, T.LongType), "occurrence numbers are integers")
        if key and run_id:
            raise InputError("pass key columns or a run_id, not both")
        if not key and not streaming:
            if run_id is None:
                raise InputError(
                    "pass key columns or a run_id: without one, a re-run or a retried task "
                    "would insert every message again"
                )
            if occurrence is None:
                raise InputError(
                    "a run_id without key columns needs each row's occurrence number among "
                    "identical rows: use relay.spark.write_outbox(df, url, run_id=...), "
                    "which adds it, or pass key columns"
                )
        prefix = opts.get("messageidprefix", "")
        _check_short("messageIdPrefix", prefix + "0" * DIGEST_HEX_LENGTH)
        atomic = _flag(opts.get("atomic", "false"), "atomic")
        if atomic and streaming:
            raise InputError(
                "atomic is for batch writes: a stream's micro-batches are replayed whole, "
                "and each partition commits on its own"
            )
        trace, traceparent_column = _trace(opts, column)
        # The trace context is not content: a re-run in another trace is the same messages.
        content = tuple(
            c
            for c in columns
            if not c.startswith(INTERNAL_PREFIX) and c not in (occurrence, traceparent_column)
        )
        return cls(
            url=url,
            payload=payload,
            fields=fields,
            headers=headers,
            key=key,
            run_id=run_id,
            occurrence=occurrence,
            message_id_prefix=prefix,
            atomic=atomic,
            max_payload_bytes=_number(
                opts.get("maxpayloadbytes", str(MAX_MESSAGE_SIZE)), "maxPayloadBytes"
            ),
            stage_abandoned_s=_number(
                opts.get("stageabandonedseconds", str(SPARK_STAGE_ABANDONED_S)),
                "stageAbandonedSeconds",
            ),
            stage=opts.get("stagetable") or None,
            prepared=_flag(opts.get("prepared", "false"), "prepared"),
            report_path=opts.get("reportpath") or None,
            content=content,
            trace=trace,
            traceparent_column=traceparent_column,
        )


def _trace(
    opts: Mapping[str, str], column: Callable[[str, tuple[type[T.DataType], ...], str], str]
) -> tuple[dict[str, str], str | None]:
    """(the context for every row, the column of each row's traceparent)."""
    named = opts.get("traceparentcolumn")
    traceparent = opts.get(TRACEPARENT)
    tracestate = opts.get(TRACESTATE)
    if named is not None:
        if traceparent is not None or tracestate is not None:
            raise InputError("pass traceparent (and tracestate) or traceparentColumn, not both")
        return {}, column(named, (T.StringType,), "a traceparent is text")
    try:
        return given_context(traceparent, tracestate), None
    except ValueError as exc:
        raise InputError(f"option traceparent/tracestate: {exc}") from None


def _check_short(name: str, value: str) -> None:
    try:
        short_string(name, value)
    except Unpublishable as exc:
        raise InputError(f"option {exc}") from None


def _flag(text: str, name: str) -> bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise InputError(f"option {name} must be true or false, not {text!r}")


def _number(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"option {name} must be a whole number >= 0, not {text!r}")
    return value
