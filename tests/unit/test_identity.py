"""relay.identity: a message's id is a function of its values alone, and never shared."""

from __future__ import annotations

import calendar
import hashlib
import math
import struct
from collections.abc import Mapping
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relay.identity import Unidentifiable, encode, message_id

BERLIN_SUMMER = timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # A separator inside a value cannot move the boundary between two values.
        (["x\x1fy", "z"], ["x", "y\x1fz"]),
        (["ab", "c"], ["a", "bc"]),
        # A null is not any string, nor nothing.
        ([None], ["\x00null"]),
        ([None], ["null"]),
        ([None], [""]),
        ([None], []),
        ([""], []),
        # Types: a number is not its text, an int is not a float, a bool is not an int.
        ([1], ["1"]),
        ([1], [1.0]),
        ([True], [1]),
        ([b"a"], ["a"]),
        ([Decimal("1")], [1]),
        # A timestamp is not a date, and a wall-clock time is not an instant.
        ([datetime(2026, 1, 1, tzinfo=UTC)], [date(2026, 1, 1)]),
        ([datetime(2026, 1, 1, tzinfo=UTC)], [datetime(2026, 1, 1)]),
        # Floating point: near values stay apart.
        ([0.30000000000000004], [0.3]),
        ([1.5e10], [15000000000]),
        # Nesting: an array of two is not two values, a struct's names count.
        ([["a", "b"]], ["a", "b"]),
        ([{"a": 1}], [{"b": 1}]),
        ([[("k", 1)]], [{"k": 1}]),
    ],
)
def test_different_values_never_share_an_id(a: list[Any], b: list[Any]) -> None:
    assert message_id(a) != message_id(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # The same instant in any time zone: the session's zone must not matter.
        (
            [datetime(2026, 7, 1, 12, 0, tzinfo=UTC)],
            [datetime(2026, 7, 1, 14, 0, tzinfo=BERLIN_SUMMER)],
        ),
        # Equal as Spark groups them (so that identical rows are numbered consistently).
        ([-0.0], [0.0]),
        ([math.nan], [float("nan")]),
        ([Decimal("1.10")], [Decimal("1.1")]),
        ([Decimal("0E-5")], [Decimal("0")]),
    ],
)
def test_equal_values_share_an_id(a: list[Any], b: list[Any]) -> None:
    assert message_id(a) == message_id(b)


def test_an_id_is_stable_across_releases() -> None:
    """A changed encoding would make every re-run after an upgrade insert everything again:
    this value may only change with IDENTITY_VERSION."""
    assert message_id(["key", 42, "created"], "o-") == (
        "o-70deb65f7d397c3b09ba058315b3ec430e73dfe549ee8e86ceb311b527cd9ba6"
    )


def test_the_prefix_is_prepended_to_a_sha256() -> None:
    mid = message_id(["a"], "orders-")
    assert mid.startswith("orders-")
    assert len(mid) == len("orders-") + 64


def test_times_of_day_intervals_and_dates_encode() -> None:
    values = [time(1, 2, 3, 4), timedelta(days=-1, microseconds=5), date(1969, 12, 31)]
    assert len({encode(v) for v in values}) == 3


def test_a_value_of_an_unknown_type_is_refused() -> None:
    with pytest.raises(Unidentifiable, match="type object"):
        encode(object())


def test_an_interval_beyond_64_bit_microseconds_is_refused() -> None:
    with pytest.raises(Unidentifiable, match="beyond 64-bit"):
        encode(timedelta(days=106_751_992))


# --- The encoding, written out again from the table in relay.identity's docstring ----------
# With arithmetic of its own (integers, calendar, struct): the properties below compare the
# code with this definition, never with itself.


def u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def i64(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def sized(tag: bytes, data: bytes) -> bytes:
    return tag + u64(len(data)) + data


def decimal_text(unscaled: int, scale: int) -> str:
    """The value ``unscaled * 10**-scale`` as ``<coefficient>e<exponent>``, trailing zeros
    moved into the exponent."""
    if unscaled == 0:
        return "0e0"
    exponent = -scale
    while unscaled % 10 == 0:
        unscaled, exponent = unscaled // 10, exponent + 1
    return f"{unscaled}e{exponent}"


def micros_since_epoch(moment: datetime) -> int:
    """Whole microseconds from 1970-01-01 (UTC for an instant, the wall clock otherwise)."""
    utc = moment.astimezone(UTC) if moment.tzinfo else moment
    return calendar.timegm(utc.timetuple()) * 1_000_000 + utc.microsecond


def reference(value: Any) -> bytes:
    if value is None:
        return b"n"
    if isinstance(value, bool):
        return b"b" + bytes([value])
    if isinstance(value, int):
        return sized(b"i", str(value).encode())
    if isinstance(value, float):
        if math.isnan(value):
            return b"f" + bytes.fromhex("7ff8000000000000")
        return b"f" + struct.pack(">d", 0.0 if value == 0 else value)
    if isinstance(value, Decimal):
        if value.is_nan():
            return sized(b"d", b"NaN")
        if value.is_infinite():
            return sized(b"d", b"-Infinity" if value < 0 else b"Infinity")
        ratio = Fraction(value)
        scale = 0
        while ratio.denominator != 1:
            ratio, scale = ratio * 10, scale + 1
        return sized(b"d", decimal_text(int(ratio), scale).encode())
    if isinstance(value, str):
        return sized(b"s", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return sized(b"y", value)
    if isinstance(value, datetime):
        return (b"t" if value.tzinfo else b"l") + i64(micros_since_epoch(value))
    if isinstance(value, date):
        return b"D" + i64((value - date(1970, 1, 1)).days)
    if isinstance(value, time):
        seconds = value.hour * 3600 + value.minute * 60 + value.second
        return b"h" + i64(seconds * 1_000_000 + value.microsecond)
    if isinstance(value, timedelta):
        return b"x" + i64(value // timedelta(microseconds=1))
    if isinstance(value, Mapping):
        return (
            b"r" + u64(len(value)) + b"".join(reference(k) + reference(v) for k, v in value.items())
        )
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return b"m" + u64(len(value)) + b"".join(reference(k) + reference(v) for k, v in value)
    assert isinstance(value, list)
    return b"a" + u64(len(value)) + b"".join(map(reference, value))


def decimal(unscaled: int, scale: int) -> Decimal:
    """``unscaled * 10**-scale`` built from its digits (``scaleb`` would round to 28)."""
    digits = tuple(int(d) for d in str(abs(unscaled)))
    return Decimal((int(unscaled < 0), digits, -scale))


# --- Values at the edges of each Spark type -------------------------------------------------
MAX_38 = 10**38 - 1
spark_decimals = st.builds(
    decimal,
    st.integers(-MAX_38, MAX_38) | st.sampled_from([MAX_38, -MAX_38, MAX_38 - 1, 10**37, 1, 0]),
    st.integers(0, 38),
)
bigints = st.integers(-(2**63), 2**63 - 1) | st.sampled_from(
    [2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, 2**63 - 2, -(2**63)]
)
doubles = st.floats() | st.sampled_from([5e-324, -5e-324, 2.0**53, 1.7976931348623157e308])
# Spark's range: years 1 to 9999, microseconds.
instants = st.datetimes(timezones=st.just(UTC))
wall_clock = st.datetimes()
scalars = (
    st.none()
    | st.booleans()
    | bigints
    | doubles
    | st.text()
    | st.binary()
    | spark_decimals
    | instants
    | wall_clock
    | st.dates()
    | st.times()
    | st.timedeltas(timedelta(microseconds=-(2**63)), timedelta(microseconds=2**63 - 1))
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.lists(st.tuples(st.text(max_size=3), inner), min_size=1, max_size=3)  # a map
    ),
    max_leaves=8,
)


@given(values)
def test_the_encoding_is_the_documented_one(value: Any) -> None:
    assert encode(value) == reference(value)


@given(st.lists(values, max_size=3))
def test_an_id_is_the_sha256_of_the_version_and_the_values(values: list[Any]) -> None:
    encoded = reference("outbox-identity/2") + b"".join(map(reference, values))
    assert message_id(values, "p-") == "p-" + hashlib.sha256(encoded).hexdigest()


@given(
    st.integers(-MAX_38, MAX_38),
    st.integers(0, 38),
    st.integers(-MAX_38, MAX_38),
    st.integers(0, 38),
)
@example(123456789012345678901234567890, 0, 123456789012345678901234567891, 0)
@example(MAX_38, 38, MAX_38 - 1, 38)
@example(10**37, 0, 10**37 + 1, 0)
@example(110, 2, 11, 1)
def test_decimals_share_an_id_exactly_when_their_values_are_equal(
    a: int, scale_a: int, b: int, scale_b: int
) -> None:
    """The defect of identity version 1: a 28-digit context rounded 38-digit decimals."""
    equal = a * 10**scale_b == b * 10**scale_a
    assert (message_id([decimal(a, scale_a)]) == message_id([decimal(b, scale_b)])) == equal


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (Decimal("123456789012345678901234567890"), Decimal("123456789012345678901234567891")),
        (decimal(MAX_38, 0), decimal(MAX_38 - 1, 0)),
        (decimal(MAX_38, 38), decimal(MAX_38 - 1, 38)),
        (decimal(10**37 + 1, 19), decimal(10**37, 19)),
        (1.0, math.nextafter(1.0, 2.0)),
        (2.0**53, math.nextafter(2.0**53, math.inf)),
        (5e-324, 0.0),
        (2**53, 2**53 + 1),
        (2**63 - 1, 2**63 - 2),
        (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC)),
        (datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)),
        (datetime(9999, 12, 31, 23, 59, 59, 999999), datetime(9999, 12, 31, 23, 59, 59, 999998)),
        (date(1970, 1, 1), date(1969, 12, 31)),
        ([decimal(MAX_38, 0)], [decimal(MAX_38 - 1, 0)]),
        ({"amount": decimal(MAX_38, 2)}, {"amount": decimal(MAX_38 - 1, 2)}),
        ([("k", decimal(MAX_38, 0))], [("k", decimal(MAX_38 - 1, 0))]),
    ],
)
def test_neighbours_at_each_types_edge_have_different_ids(a: Any, b: Any) -> None:
    assert message_id(["key", a]) != message_id(["key", b])


def canonical(value: Any) -> Any:
    """What identity treats as equal: -0.0 is 0.0, one NaN, decimals by exact value, types
    kept apart."""
    if isinstance(value, float):
        return ("f", "nan" if math.isnan(value) else value + 0.0)
    if isinstance(value, Decimal):
        return ("d", Fraction(value))
    if isinstance(value, datetime):
        return ("t" if value.tzinfo else "l", micros_since_epoch(value))
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return ("m", tuple((k, canonical(v)) for k, v in value))
    if isinstance(value, list):
        return ("a", tuple(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("r", tuple((k, canonical(v)) for k, v in value.items()))
    return (type(value).__name__, value)


@given(st.lists(values, max_size=4), st.lists(values, max_size=4))
def test_distinct_keys_never_share_an_encoding(a: list[Any], b: list[Any]) -> None:
    """The encoding is injective (up to the equalities above), so distinct keys can only
    share an id by a SHA-256 collision."""
    same = [canonical(v) for v in a] == [canonical(v) for v in b]
    encoded = b"".join(map(encode, a)) == b"".join(map(encode, b))
    assert same == encoded
