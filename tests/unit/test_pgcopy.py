"""relay.spark.pgcopy: binary COPY rows joined from Arrow columns are the bytes psycopg's own
binary ``write_row`` sends for the same values, and a chunk's tuples are those values."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from psycopg import postgres, pq
from psycopg._copy_base import BinaryFormatter  # the formatter Copy.write_row uses
from psycopg.adapt import Transformer

from relay.db.sink import COPY_SIGNATURE, COPY_TRAILER
from relay.spark.pgcopy import copy_rows
from relay.spark.rows import Chunk

# The outbox's written columns' types (relay.db.sink.WRITTEN_COLUMNS), and a position.
TYPES = ["text", "text", "text", "bytea", "text", "text", "text"]
# Text as PostgreSQL takes it: no NUL character (and none of Python's lone surrogates).
TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))


def psycopg_copy(rows: list[tuple[Any, ...]], types: list[str]) -> bytes:
    """What ``Copy.write_row`` sends for ``rows``, after ``Copy.set_types(types)``."""
    transformer = Transformer()
    oids = [postgres.types.get(name).oid for name in types]  # type: ignore[union-attr]
    transformer.set_dumper_types(oids, pq.Format.BINARY)
    formatter = BinaryFormatter(transformer)
    out = b"".join(bytes(formatter.write_row(row)) for row in rows)
    return out + bytes(formatter.end())


@st.composite
def chunks(draw: st.DrawFn) -> Chunk:
    """A chunk whose columns are each an Arrow array or one value for every row, with nulls
    where the outbox allows them (headers, ordering key)."""
    count = draw(st.integers(1, 20))

    def column(values: st.SearchStrategy[Any], kind: pa.DataType, nullable: bool) -> Any:
        value = st.none() | values if nullable else values
        if draw(st.booleans()):
            return draw(value)  # one value for every row
        array = pa.array(draw(st.lists(value, min_size=count, max_size=count)), kind)
        # Arrays sliced out of bigger ones, as Spark's batches may be.
        return array if draw(st.booleans()) else pa.concat_arrays([array, array]).slice(count)

    text = (pa.string(), pa.large_string())
    return Chunk(
        count,
        (
            pa.array(draw(st.lists(TEXT, min_size=count, max_size=count)), pa.string()),
            column(TEXT, draw(st.sampled_from(text)), False),
            column(TEXT, pa.string(), False),
            pa.array(
                draw(st.lists(st.binary(), min_size=count, max_size=count)),
                draw(st.sampled_from([pa.binary(), pa.large_binary()])),
            ),
            column(TEXT, pa.string(), False),
            column(TEXT, pa.string(), True),
            column(TEXT, draw(st.sampled_from(text)), True),
        ),
    )


@given(chunks(), st.none() | st.integers(0, 2**62))
def test_the_copy_rows_are_psycopgs_bytes(chunk: Chunk, first_position: int | None) -> None:
    rows = chunk.tuples(first_position)
    types = TYPES if first_position is None else [*TYPES, "int8"]
    data = COPY_SIGNATURE + bytes(chunk.copy_data(first_position)) + COPY_TRAILER
    assert data == psycopg_copy(rows, types)


@given(chunks())
def test_the_tuples_are_the_columns_values(chunk: Chunk) -> None:
    for i, row in enumerate(chunk.tuples()):
        for value, column in zip(row, chunk.columns, strict=True):
            assert value == (column[i].as_py() if isinstance(column, pa.Array) else column)


def test_rows_of_constants_only_are_rows_all_the_same() -> None:
    assert bytes(copy_rows([b"a", None], 2)) == 2 * b"\x00\x02\x00\x00\x00\x01a\xff\xff\xff\xff"


def test_no_rows_are_no_bytes() -> None:
    assert bytes(copy_rows([pa.array([], pa.string())], 0)) == b""
