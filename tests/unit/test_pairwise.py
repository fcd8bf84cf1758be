"""The inbox's front ends, databases and broker versions the suite combines
(tests/support/pairwise.py): every pair of values met at least once, in 9 combinations."""

from __future__ import annotations

import itertools

import pytest

from tests.support.inbox_model import FLAVOURS
from tests.support.pairwise import PAIRWISE, beyond_pairs
from tests.support.rabbitmq import RABBITMQ_3, RABBITMQ_VERSIONS

DATABASES = ("sqlite", "postgresql", "mariadb")
# What the suite can run at all: MariaDB meets 3.10 only (tests/conftest.py's twins).
POSSIBLE = [
    combination
    for combination in itertools.product(FLAVOURS, DATABASES, RABBITMQ_VERSIONS)
    if combination[1] != "mariadb" or combination[2] == RABBITMQ_3
]


def kept() -> list[tuple[str, str, str]]:
    return [c for c in POSSIBLE if not beyond_pairs(dict(zip(PAIRWISE, c, strict=True)))]


@pytest.mark.parametrize(("first", "second"), list(itertools.combinations(range(3), 2)))
def test_every_pair_of_values_runs(first: int, second: int) -> None:
    assert {(c[first], c[second]) for c in kept()} == {(c[first], c[second]) for c in POSSIBLE}


def test_nine_of_the_fifteen_combinations_run() -> None:
    assert len(POSSIBLE) == 15
    assert len(kept()) == 9


@pytest.mark.parametrize(
    "params",
    [{"flavour": "asyncio"}, {"flavour": "asyncio", "database_url": "sqlite"}, {}],
)
def test_a_test_without_all_three_parameters_is_kept(params: dict[str, str]) -> None:
    assert not beyond_pairs(params)
