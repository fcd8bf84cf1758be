"""relay.spark.encodings: a column's encodings, built with Arrow, are identity.encode's bytes
for each of its values, for every type the Spark writer's columns can have."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.identity import encode, message_id, message_ids
from relay.spark.encodings import encoded, joined

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64()]


def ints(kind: pa.DataType) -> st.SearchStrategy[int]:
    bits = kind.bit_width
    if pa.types.is_unsigned_integer(kind):
        return st.integers(0, 2**bits - 1)
    return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def floats(width: Literal[32, 64]) -> st.SearchStrategy[float]:
    edges = st.sampled_from([0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf])
    return st.one_of(edges, st.floats(width=width))


# Spark's years 1-9999, less a day at each end, where Python's datetime in a zone overflows.
MICROS = st.integers(-62_135_510_400_000_000, 253_402_214_400_000_000)
# (type, values): every type the writer's key and content columns may have, the ones encoded
# with Arrow and the ones encoded value by value.
CASES: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.string(), st.text()),
    (pa.large_string(), st.text()),
    (pa.binary(), st.binary()),
    (pa.large_binary(), st.binary()),
    (pa.bool_(), st.booleans()),
    *((kind, ints(kind)) for kind in INT_TYPES),
    (pa.float32(), floats(32)),
    (pa.float64(), floats(64)),
    (pa.timestamp("us", "UTC"), MICROS),
    (pa.timestamp("us", "Asia/Kolkata"), MICROS),
    (pa.timestamp("us"), MICROS),
    (pa.date32(), st.integers(-719_162, 2_932_896)),
    (pa.duration("us"), st.integers(-(2**63) + 1, 2**63 - 1)),
    # Encoded value by value.
    (
        pa.decimal128(38, 10),
        st.decimals(allow_nan=False, places=10, min_value=-(10**27), max_value=10**27),
    ),
    (pa.time64("us"), st.times().map(lambda t: t.replace(tzinfo=None))),
    (pa.list_(pa.int32()), st.lists(ints(pa.int32()), max_size=3)),
    (
        pa.struct([("a", pa.string()), ("b", pa.int64())]),
        st.fixed_dictionaries({"a": st.text(), "b": ints(pa.int64())}),
    ),
    (pa.map_(pa.string(), pa.float64()), st.lists(st.tuples(st.text(), floats(64)), max_size=3)),
]


def arrays(kind: pa.DataType, values: st.SearchStrategy[Any]) -> st.SearchStrategy[pa.Array]:
    """Arrays of ``kind`` with nulls among the values, sliced at any offset (a batch's
    column can be a slice of a bigger buffer)."""

    @st.composite
    def build(draw: st.DrawFn) -> pa.Array:
        items = draw(st.lists(st.one_of(st.none(), values), max_size=20))
        whole = pa.array(items, kind)
        start = draw(st.integers(0, len(whole)))
        return whole.slice(start, draw(st.integers(0, len(whole) - start)))

    return build()


@pytest.mark.parametrize(("kind", "values"), CASES, ids=[str(k) for k, _ in CASES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_columns_encodings_are_each_values_encoding(
    kind: pa.DataType, values: st.SearchStrategy[Any], data: st.DataObject
) -> None:
    column = data.draw(arrays(kind, values))
    assert encoded(column).to_pylist() == [encode(v) for v in column.to_pylist()]


def test_edge_values_by_hand() -> None:
    """The values whose encodings are special cases, written out."""
    floats64 = pa.array([-0.0, math.nan, -math.nan, math.inf, None, 1.5])
    assert encoded(floats64).to_pylist() == [
        encode(0.0),
        encode(math.nan),
        encode(math.nan),
        encode(math.inf),
        b"n",
        encode(1.5),
    ]
    assert encoded(pa.array([None, None], pa.null())).to_pylist() == [b"n", b"n"]
    assert encoded(pa.array(["", "é", None])).to_pylist() == [encode(""), encode("é"), b"n"]
    stamps = pa.array([datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC)])
    assert encoded(stamps).to_pylist() == [encode(v) for v in stamps.to_pylist()]
    assert encoded(pa.array([date(1970, 1, 1)])).to_pylist() == [encode(date(1970, 1, 1))]
    assert encoded(pa.array([timedelta(microseconds=-1)])).to_pylist() == [
        encode(timedelta(microseconds=-1))
    ]
    assert encoded(pa.array([Decimal("1.10")])).to_pylist() == [encode(Decimal("1.1"))]
    assert encoded(pa.array([time(1, 2)])).to_pylist() == [encode(time(1, 2))]


def test_joined_columns_hash_to_message_ids_ids() -> None:
    keys = pa.array(["a", None, "c"])
    numbers = pa.array([1, 2, None], pa.int64())
    encodings = joined(encode("key"), [keys, numbers])
    assert message_ids(encodings, "p-") == [
        message_id(["key", k, n], "p-")
        for k, n in zip(keys.to_pylist(), numbers.to_pylist(), strict=True)
    ]
