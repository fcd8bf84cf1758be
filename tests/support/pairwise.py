"""The inbox's tests run each front end on each database and each broker version, and each
database on each version: every pair of the three, not every triple (6 of 12 combinations,
9 of 15 with MariaDB, which meets RabbitMQ 3.10 only). What a front end does with a delivery
does not change with the database beneath it and the broker version at once; the model
(tests/model) runs the three front ends together, on each database, with every sequence."""

from __future__ import annotations

from collections.abc import Mapping

from tests.support.inbox_model import FLAVOURS
from tests.support.rabbitmq import RABBITMQ_4

PAIRWISE = ("flavour", "database_url", "rabbit")  # the parameters' names
ALTERNATING = ("sqlite", "postgresql")  # the databases that meet both versions


def beyond_pairs(params: Mapping[str, object]) -> bool:
    """Whether a test's parameters are a combination the pairs leave out: on SQLite and
    PostgreSQL, 4.0 takes the front ends whose place in ``FLAVOURS`` plus the database's
    place is odd, 3.10 the others. A test without all three parameters is kept."""
    if not set(PAIRWISE) <= params.keys():
        return False
    flavour, database, version = (params[name] for name in PAIRWISE)
    if database not in ALTERNATING:
        return False
    odd = (FLAVOURS.index(str(flavour)) + ALTERNATING.index(str(database))) % 2 == 1
    return odd != (version == RABBITMQ_4)
