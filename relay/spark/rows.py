"""Arrow record batches, as Spark hands them to a Python data source, into checked outbox rows.

Every value is checked against the limits the relay enforces (``relay.message``) before
anything is written: a row the relay could never publish is refused here, with the column,
the limit and the row's place, instead of being parked later.

A batch stays columnar: checks, ids and the COPY data are computed over whole Arrow columns
(``relay.spark.encodings``, ``relay.spark.pgcopy``); only headers, payloads that are not
text or bytes, and the hashing of each id are per row.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, NoReturn, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from relay.errors import InputError
from relay.identity import Unidentifiable, encode, message_ids
from relay.message import SHORT_STRING_MAX, Unpublishable, encode_headers, short_string
from relay.spark.encodings import joined
from relay.spark.options import WriteOptions
from relay.spark.pgcopy import copy_rows
from relay.tracing import TRACEPARENT, trace_ids, with_context

# A column of a chunk: Arrow values, or one value (text, or None for null) for every row.
Column: TypeAlias = "pa.Array | str | None"


@dataclass(frozen=True)
class Chunk:
    """One batch's outbox rows, column by column in relay.db.sink.WRITTEN_COLUMNS order (the
    sink's ``Chunk``)."""

    count: int
    columns: tuple[Column, ...]

    def __len__(self) -> int:
        return self.count

    def copy_data(self, first_position: int | None = None) -> memoryview:
        fields = [c.encode() if isinstance(c, str) else c for c in self.columns]
        return memoryview(copy_rows(fields, self.count, first_position))

    def tuples(self, first_position: int | None = None) -> list[tuple[Any, ...]]:
        columns: list[Any] = [
            c.to_pylist() if isinstance(c, pa.Array) else [c] * self.count for c in self.columns
        ]
        if first_position is not None:
            columns.append(range(first_position, first_position + self.count))
        return list(zip(*columns, strict=True))


def with_rows(chunks: Iterator[Chunk]) -> Iterator[Chunk] | None:
    """``chunks`` without the empty ones, or None when not one has a row."""
    rows = (chunk for chunk in chunks if len(chunk))
    first = next(rows, None)
    return None if first is None else itertools.chain([first], rows)


@dataclass(frozen=True)
class StreamBatch:
    """Where a stream writer's partition comes from: what identifies its rows without a key."""

    query_id: str
    batch_id: int
    partition_id: int


class RowConverter:
    """Converts one task's batches, in order; keeps what identity needs across batches."""

    def __init__(self, options: WriteOptions, where: str, stream: StreamBatch | None = None):
        self.options = options
        self._where = where  # "partition 3", for error messages
        self._stream = stream
        self._seen: Counter[bytes] = Counter()  # stream rows' content, for occurrence numbers
        self._rows = 0

    def convert(self, batch: pa.RecordBatch) -> Chunk:
        """The outbox rows for ``batch``; InputError names the first bad value."""
        o = self.options
        columns = {name: batch.column(name) for name in batch.schema.names}
        payloads = self._payloads(columns[o.payload])
        text = {name: self._text(name, columns) for name in o.fields}
        headers = self._traced(self._headers(columns), columns)
        ids = pa.array(self._message_ids(columns), pa.string())
        self._rows += batch.num_rows
        return Chunk(
            batch.num_rows,
            (
                ids,
                text["exchange"],
                text["routingKey"],
                payloads,
                text["contentType"],
                headers,
                text["orderingKey"],
            ),
        )

    def _fail(self, index: int, reason: str) -> NoReturn:
        raise InputError(f"{reason} ({self._where}, row {self._rows + index})")

    def _payloads(self, col: pa.Array) -> pa.Array:
        o = self.options
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = col.cast(pa.large_binary())
        elif not pa.types.is_binary(col.type) and not pa.types.is_large_binary(col.type):
            values = col.to_pylist(maps_as_pydicts="strict")
            col = pa.array(
                [None if v is None else self._json(i, v).encode() for i, v in enumerate(values)],
                pa.large_binary(),
            )
        if col.null_count:
            self._fail(
                _first(col.is_null()),
                f"column {o.payload!r} is null: every message needs a payload",
            )
        sizes = pc.binary_length(col)
        if len(col) and pc.max(sizes).as_py() > o.max_payload_bytes:
            i = _first(pc.greater(sizes, o.max_payload_bytes))
            self._fail(
                i,
                f"column {o.payload!r} is {sizes[i].as_py()} bytes, larger than maxPayloadBytes "
                f"{o.max_payload_bytes}",
            )
        return col

    def _text(self, name: str, columns: dict[str, pa.Array]) -> Column:
        field = self.options.fields[name]
        if field.column is None:
            return field.value
        values = columns[field.column]
        if name == "orderingKey":
            return values  # null: the row has no ordering key
        if values.null_count:
            self._fail(_first(values.is_null()), f"column {field.column!r} ({name}) is null")
        sizes = pc.binary_length(values)
        if len(values) and pc.max(sizes).as_py() > SHORT_STRING_MAX:
            i = _first(pc.greater(sizes, SHORT_STRING_MAX))
            try:
                short_string(name, values[i].as_py())
            except Unpublishable as exc:
                self._fail(i, f"column {field.column!r}: {exc}")
        return values

    def _headers(self, columns: dict[str, pa.Array]) -> list[str | None] | None:
        """Each row's headers, or None when no row has any."""
        name = self.options.headers
        if name is None:
            return None
        col = columns[name]
        values = col.to_pylist(maps_as_pydicts="strict")
        if not pa.types.is_string(col.type) and not pa.types.is_large_string(col.type):
            values = [None if v is None else self._json(i, v) for i, v in enumerate(values)]
        for i, text in enumerate(values):
            if text is not None:
                try:
                    encode_headers(text)
                except Unpublishable as exc:
                    self._fail(i, f"column {name!r}: {exc}")
        return values  # type: ignore[no-any-return]

    def _traced(self, headers: list[str | None] | None, columns: dict[str, pa.Array]) -> Column:
        """``headers`` with the writer's trace context. A row's own traceparent that is null
        or malformed is left out: the relay would ignore it, and a trace id is no reason to
        fail a write."""
        o = self.options
        if o.traceparent_column is not None:
            parents = columns[o.traceparent_column].to_pylist()
            headers = headers or [None] * len(parents)
            headers = [
                with_context(h, {TRACEPARENT: p}) if p is not None and trace_ids(p) else h
                for h, p in zip(headers, parents, strict=True)
            ]
        elif o.trace:
            if headers is None:
                return with_context(None, o.trace)
            headers = [with_context(h, o.trace) for h in headers]
        return None if headers is None else pa.array(headers, pa.string())

    def _message_ids(self, columns: dict[str, pa.Array]) -> list[str]:
        o = self.options
        prefix = o.message_id_prefix
        try:
            if o.key:
                return message_ids(joined(encode("key"), [columns[k] for k in o.key]), prefix)
            content = [columns[c] for c in o.content]
            if o.occurrence is not None:
                run = encode("run") + encode(o.run_id)
                return message_ids(joined(run, [*content, columns[o.occurrence]]), prefix)
            return self._stream_ids(joined(b"", content))
        except Unidentifiable as exc:
            raise InputError(f"{exc}: choose key columns of simpler types") from None

    def _stream_ids(self, contents: list[bytes]) -> list[str]:
        """Without a key, a stream row is identified by its micro-batch (replayed with the same
        query id, batch id and partitions) and its content (``contents``: each row's encoded
        values), numbered among identical rows: ``message_id(["stream", query id, batch id,
        partition id, content, occurrence])``."""
        assert self._stream is not None
        s = self._stream
        batch = b"".join(map(encode, ("stream", s.query_id, s.batch_id, s.partition_id)))
        encodings = []
        for content in contents:
            occurrence = self._seen[content]
            self._seen[content] += 1
            encodings.append(batch + encode(content) + encode(occurrence))
        return message_ids(encodings, self.options.message_id_prefix)

    def _json(self, index: int, value: Any) -> str:
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False, default=_jsonable)
        except (TypeError, ValueError) as exc:
            self._fail(index, f"cannot be sent as JSON: {exc}")


def _first(mask: pa.Array) -> int:
    """The index of the first true value of ``mask``."""
    return int(pc.index(mask, True).as_py())


def _jsonable(value: Any) -> Any:
    """JSON for the values Spark has and JSON lacks: times as ISO 8601 (instants in UTC),
    decimals as strings (exact), binary as base64."""
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).isoformat()
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"a value of type {type(value).__name__}")
