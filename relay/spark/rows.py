"""Arrow record batches, as Spark hands them to a Python data source, into checked outbox rows.

Every value is checked against the limits the relay enforces (``relay.message``) before
anything is written: a row the relay could never publish is refused here, with the column,
the limit and the row's place, instead of being parked later.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, NoReturn, cast

import pyarrow as pa

from relay.errors import InputError
from relay.identity import Unidentifiable, encode, message_ids
from relay.message import Unpublishable, encode_headers, short_string
from relay.spark.encodings import joined
from relay.spark.options import WriteOptions
from relay.tracing import TRACEPARENT, trace_ids, with_context

# One outbox row, in relay.db.sink.WRITTEN_COLUMNS order.
Row = tuple[str, str, str, bytes, str, str | None, str | None]


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

    def convert(self, batch: pa.RecordBatch) -> list[Row]:
        """The outbox rows for ``batch``; InputError names the first bad value."""
        o = self.options
        columns = {name: batch.column(name) for name in batch.schema.names}
        n = batch.num_rows
        payloads = self._payloads(columns[o.payload])
        text = {name: self._text(name, columns, n) for name in o.fields}
        headers = self._traced(self._headers(columns, n), columns)
        ids = self._message_ids(columns)
        rows: list[Row] = []
        for i in range(n):
            payload = payloads[i]
            if payload is None:
                self._fail(i, f"column {o.payload!r} is null: every message needs a payload")
            if len(payload) > o.max_payload_bytes:
                self._fail(
                    i,
                    f"column {o.payload!r} is {len(payload)} bytes, larger than maxPayloadBytes "
                    f"{o.max_payload_bytes}",
                )
            # The checks in _text ruled out nulls in the text fields but the ordering key.
            rows.append(
                cast(
                    Row,
                    (
                        ids[i],
                        text["exchange"][i],
                        text["routingKey"][i],
                        payload,
                        text["contentType"][i],
                        headers[i],
                        text["orderingKey"][i],
                    ),
                )
            )
        self._rows += n
        return rows

    def _fail(self, index: int, reason: str) -> NoReturn:
        raise InputError(f"{reason} ({self._where}, row {self._rows + index})")

    def _payloads(self, col: pa.Array) -> list[bytes | None]:
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            return col.to_pylist()  # type: ignore[no-any-return]
        if pa.types.is_string(col.type):
            return col.cast(pa.binary()).to_pylist()  # type: ignore[no-any-return]
        if pa.types.is_large_string(col.type):
            return col.cast(pa.large_binary()).to_pylist()  # type: ignore[no-any-return]
        out: list[bytes | None] = []
        for i, value in enumerate(col.to_pylist(maps_as_pydicts="strict")):
            out.append(None if value is None else self._json(i, value).encode())
        return out

    def _text(self, name: str, columns: dict[str, pa.Array], n: int) -> list[str | None]:
        field = self.options.fields[name]
        if field.column is None:
            return [field.value] * n
        values: list[str | None] = columns[field.column].to_pylist()
        if name == "orderingKey":
            return values  # null: the row has no ordering key
        for i, value in enumerate(values):
            if value is None:
                self._fail(i, f"column {field.column!r} ({name}) is null")
            try:
                short_string(name, value)
            except Unpublishable as exc:
                self._fail(i, f"column {field.column!r}: {exc}")
        return values

    def _headers(self, columns: dict[str, pa.Array], n: int) -> list[str | None]:
        name = self.options.headers
        if name is None:
            return [None] * n
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

    def _traced(self, headers: list[str | None], columns: dict[str, pa.Array]) -> list[str | None]:
        """``headers`` with the writer's trace context. A row's own traceparent that is null
        or malformed is left out: the relay would ignore it, and a trace id is no reason to
        fail a write."""
        o = self.options
        if o.traceparent_column is not None:
            parents = columns[o.traceparent_column].to_pylist()
            return [
                with_context(h, {TRACEPARENT: p}) if p is not None and trace_ids(p) else h
                for h, p in zip(headers, parents, strict=True)
            ]
        return [with_context(h, o.trace) for h in headers] if o.trace else headers

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
