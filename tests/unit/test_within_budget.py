"""relay.db.due.within_budget: a SQLite claim's rows cut to the byte budget as they are read,
as the claim statement cuts them elsewhere."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from relay.db.due import within_budget

# name: (each row's counted bytes, max_bytes, first_always, how many rows are taken)
CASES = {
    "all fit": ([10, 10, 10], 30, False, 3),
    "the third does not fit": ([10, 10, 11], 30, False, 2),
    "none fit": ([31, 1], 30, False, 0),
    "a large first row goes alone with first_always": ([31, 1], 30, True, 1),
    "first_always takes only the first": ([31, 0, 0], 30, True, 1),
    "oversized rows count nothing": ([10, 0, 20, 0], 30, False, 4),
    "nothing claimed": ([], 30, True, 0),
    "a row after one that did not fit is not taken": ([20, 20, 1], 30, False, 1),
}


@pytest.mark.parametrize("name", CASES)
def test_rows_are_cut_where_the_budget_ends(name: str) -> None:
    sizes, max_bytes, first_always, taken = CASES[name]
    rows = [(f"row {n}", size) for n, size in enumerate(sizes)]
    assert within_budget(rows, max_bytes, first_always) == rows[:taken]


def test_no_row_is_read_after_the_first_that_does_not_fit() -> None:
    read = []

    def rows() -> Iterator[tuple[str, int]]:
        for n in range(10):
            read.append(n)
            yield (f"row {n}", 10)

    assert len(within_budget(rows(), 25, False)) == 2
    assert read == [0, 1, 2]
