"""relay.spark.rows: a batch's checks over whole columns name the first bad row, by its place
in the task's input, and an empty batch is an empty chunk."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from relay.errors import InputError
from relay.spark.options import WriteOptions
from relay.spark.rows import Chunk, RowConverter, with_rows

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("payload", T.BinaryType()),
        T.StructField("route", T.StringType()),
    ]
)
OPTIONS = {
    "url": "sqlite://",
    "key": "id",
    "routingKeyColumn": "route",
    "maxPayloadBytes": "4",
}


def batch(payloads: list[bytes | None], routes: list[str | None] | None = None) -> pa.RecordBatch:
    ids = pa.array(range(len(payloads)), pa.int64())
    routes = routes if routes is not None else ["r"] * len(payloads)
    return pa.record_batch(
        [ids, pa.array(payloads, pa.binary()), pa.array(routes, pa.string())],
        names=["id", "payload", "route"],
    )


def converter() -> RowConverter:
    return RowConverter(WriteOptions.parse(OPTIONS, SCHEMA, streaming=False), "partition 3")


def test_an_empty_batch_is_an_empty_chunk() -> None:
    chunk = converter().convert(batch([]))
    assert len(chunk) == 0
    assert chunk.tuples() == []
    assert bytes(chunk.copy_data()) == b""


@pytest.mark.parametrize(
    ("payloads", "routes", "message"),
    [
        ([b"a", None], None, r"column 'payload' is null: .* \(partition 3, row 12\)"),
        (
            [b"a", b"12345"],
            None,
            r"is 5 bytes, larger than maxPayloadBytes 4 \(partition 3, row 12\)",
        ),
        (
            [b"a", b"b"],
            ["r", None],
            r"column 'route' \(routingKey\) is null \(partition 3, row 12\)",
        ),
        ([b"a", b"b"], ["r", "é" * 128], r"routingKey is 256 bytes; .* \(partition 3, row 12\)"),
    ],
)
def test_the_first_bad_value_is_named_by_its_row_in_the_task(
    payloads: list[bytes | None], routes: list[str | None] | None, message: str
) -> None:
    rows = converter()
    rows.convert(batch([b"x"] * 11))  # rows 0-10 of the task
    with pytest.raises(InputError, match=message):
        rows.convert(batch(payloads, routes))  # its second row is the task's row 12


@pytest.mark.parametrize(
    ("sizes", "kept"),
    [
        ([], None),
        ([0], None),
        ([0, 0, 0], None),
        ([3], [3]),
        ([0, 2, 0, 5, 0], [2, 5]),
        ([1, 0], [1]),
    ],
)
def test_with_rows_drops_empty_chunks_and_says_when_none_has_a_row(
    sizes: list[int], kept: list[int] | None
) -> None:
    chunks = [Chunk(size, ()) for size in sizes]
    found = with_rows(iter(chunks))
    assert (None if found is None else [len(c) for c in found]) == kept
