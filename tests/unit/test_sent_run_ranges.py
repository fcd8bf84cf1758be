"""The ranges of keys a merge of the sent log's runs writes a transaction at a time
(``relay.db.sentmerge.key_bound``, ``next_bound``): equal ranges of the uuid space, and the
end of the one after a key written."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.db.sentmerge import key_bound, next_bound

LAST = "ffffffff-ffff-ffff-ffff-ffffffffffff"


@pytest.mark.parametrize(
    ("index", "chunks", "bound"),
    [
        (0, 1, "00000000-0000-0000-0000-000000000000"),
        (1, 2, "80000000-0000-0000-0000-000000000000"),
        (1, 4, "40000000-0000-0000-0000-000000000000"),
        (3, 4, "c0000000-0000-0000-0000-000000000000"),
        (1, 3, "55555555-5555-5555-5555-555555555555"),
    ],
)
def test_bounds_split_the_keys_evenly(index: int, chunks: int, bound: str) -> None:
    assert key_bound(index, chunks) == bound


@pytest.mark.parametrize(
    ("after", "chunks", "end"),
    [
        (None, 1, None),  # one range: all of it
        (None, 4, "40000000-0000-0000-0000-000000000000"),
        ("00000000-0000-0000-0000-000000000001", 4, "40000000-0000-0000-0000-000000000000"),
        # A key on a bound is in the range it begins: the next range ends past it.
        ("40000000-0000-0000-0000-000000000000", 4, "80000000-0000-0000-0000-000000000000"),
        ("3fffffff-ffff-ffff-ffff-ffffffffffff", 4, "40000000-0000-0000-0000-000000000000"),
        ("c0000000-0000-0000-0000-000000000000", 4, None),  # in the last range
        (LAST, 4, None),
        # The ranges' count changed under a merge taken on (an input purged): the end is
        # still past the key written, whatever the count.
        ("80000000-0000-0000-0000-000000000001", 3, "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"),
        # A bound of a count not a power of two is rounded down: the range it begins ends
        # at the next bound, not at itself (an outside review: a merge looped on it).
        ("55555555-5555-5555-5555-555555555555", 3, "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"),
        ("aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa", 3, None),
    ],
)
def test_the_next_range_ends_past_the_key_written(
    after: str | None, chunks: int, end: str | None
) -> None:
    assert next_bound(after, chunks) == end
    if after is not None and end is not None:
        assert end > after


@given(st.integers(1, 5000), st.integers(0, 2**128 - 1))
def test_the_next_range_ends_at_the_first_bound_past_any_key(chunks: int, key: int) -> None:
    """Whatever the count and the key: the end is a bound past the key, with no bound
    between (each range a merge writes moves on, and skips none)."""
    end = next_bound(str(uuid.UUID(int=key)), chunks)
    if end is None:  # past the last bound
        assert chunks == 1 or uuid.UUID(key_bound(chunks - 1, chunks)).int <= key
        return
    index = round(uuid.UUID(end).int * chunks / 2**128)
    assert key_bound(index, chunks) == end and uuid.UUID(end).int > key
    assert index == 1 or uuid.UUID(key_bound(index - 1, chunks)).int <= key


@given(st.integers(1, 5000).flatmap(lambda c: st.tuples(st.just(c), st.integers(0, c - 1))))
def test_the_range_a_bound_begins_ends_at_the_next_bound(given_: tuple[int, int]) -> None:
    chunks, index = given_
    expected = key_bound(index + 1, chunks) if index + 1 < chunks else None
    assert next_bound(key_bound(index, chunks), chunks) == expected
