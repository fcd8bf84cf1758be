"""PostgreSQL's binary COPY rows, built from whole Arrow columns.

psycopg's ``Copy.write_row`` formats a row at a time in Python (1.2 us a row in the Spark
writer's tasks); here a chunk's rows are joined from its columns with Arrow compute, and the
result's data buffer is the COPY data, handed to ``Copy.write`` without a copy. The bytes
are those psycopg's binary ``write_row`` sends for the same values with the columns' types
set (tests/unit/test_pgcopy.py): per row a 16-bit field count, then per field a 32-bit
length (-1 for null) and the value (text: UTF-8; bytea: the bytes; bigint: 8 bytes), all
big-endian (the stream's signature and trailer are the sink's, relay.db.sink).

Large binary throughout: a chunk of big payloads may pass the 2 GiB a binary array holds.
"""

from __future__ import annotations

import array
import struct
from collections.abc import Sequence
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from relay.spark.encodings import big_endian, words_big_endian

_LARGE = pa.large_binary()
_NULL_LENGTH = struct.pack(">i", -1)
_EMPTY = pa.scalar(b"", _LARGE)

# A field for every row of a chunk: an Arrow array of text or binary values, or one value
# (bytes, or None for null) shared by all rows.
Field: TypeAlias = "pa.Array | bytes | None"


def copy_rows(fields: Sequence[Field], count: int, first_position: int | None = None) -> pa.Buffer:
    """The binary COPY data of ``count`` rows with ``fields``; with ``first_position``, one
    more bigint field numbering the rows from it."""
    if count == 0:
        return pa.py_buffer(b"")
    width = len(fields) + (first_position is not None)
    parts: list[pa.Array | bytes] = [struct.pack(">h", width)]
    for field in fields:
        if field is None:
            parts.append(_NULL_LENGTH)
        elif isinstance(field, bytes):
            parts.append(struct.pack(">i", len(field)) + field)
        else:
            values = field.cast(_LARGE)
            lengths = pc.fill_null(pc.binary_length(values).cast(pa.int32()), -1)
            parts += [big_endian(lengths, "i", _LARGE), pc.fill_null(values, _EMPTY)]
    if first_position is not None:
        positions = array.array("q", range(first_position, first_position + count))
        parts += [struct.pack(">i", 8), words_big_endian(positions, _LARGE)]
    joined = pc.binary_join_element_wise(*_merged(parts, count), _EMPTY)
    offsets, data = joined.buffers()[1:]
    (start,) = struct.unpack_from("<q", offsets, joined.offset * 8)
    (end,) = struct.unpack_from("<q", offsets, (joined.offset + count) * 8)
    return data.slice(start, end - start)


def _merged(parts: list[pa.Array | bytes], count: int) -> list[pa.Array | pa.Scalar]:
    """``parts`` with neighbouring constants joined into one scalar (fewer inputs to join);
    the first as ``count`` copies when every part is a constant, so that the join gives an
    array."""
    out: list[pa.Array | pa.Scalar] = []
    pending = b""
    for part in parts:
        if isinstance(part, bytes):
            pending += part
            continue
        if pending:
            out.append(pa.scalar(pending, _LARGE))
            pending = b""
        out.append(part)
    if pending:
        out.append(pa.scalar(pending, _LARGE))
    if not any(isinstance(part, pa.Array) for part in out):
        out[0] = pa.repeat(out[0], count)
    return out
