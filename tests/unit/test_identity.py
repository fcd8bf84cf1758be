"""relay.identity: a message's id is a function of its values alone, and never shared."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
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
        "o-65caf0fe721359a09aeafc8cd3a56be39116bb7a2af42671d1db43be6b206af4"
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


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.datetimes(timezones=st.just(UTC))
    | st.dates()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


def canonical(value: Any) -> Any:
    """What identity treats as equal: -0.0 is 0.0, decimals by value, types kept apart."""
    if isinstance(value, float):
        return ("f", value + 0.0)
    if isinstance(value, Decimal):
        return ("d", value.normalize() if not value.is_zero() else Decimal(0))
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
