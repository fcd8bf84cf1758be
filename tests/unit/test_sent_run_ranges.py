"""The ranges of keys a merge of the sent log's runs writes a transaction at a time
(``relay.db.sentmerge.key_bound``, ``next_bound``): equal ranges of the uuid space, and the
end of the one after a key written."""

from __future__ import annotations

import pytest

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
    ],
)
def test_the_next_range_ends_past_the_key_written(
    after: str | None, chunks: int, end: str | None
) -> None:
    assert next_bound(after, chunks) == end
    if after is not None and end is not None:
        assert end > after
