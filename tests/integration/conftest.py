"""The integration tests run against both RabbitMQ versions (see tests/conftest.py)."""

from __future__ import annotations

import pytest

from devtools.servers import RabbitNode
from tests.support.inbox import effects, with_table
from tests.support.inbox_model import FLAVOURS
from tests.support.rabbitmq import RABBITMQ_3, RABBITMQ_VERSIONS


@pytest.fixture(scope="session", params=RABBITMQ_VERSIONS)
def rabbit(request: pytest.FixtureRequest) -> RabbitNode:
    # Each version's node by a fixture of another name (tests/conftest.py's ``rabbit`` says
    # why), asked for only by the tests of that version.
    node: RabbitNode = request.getfixturevalue(
        "rabbit3" if request.param == RABBITMQ_3 else "rabbit4"
    )
    return node


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    """Each kind of inbox, for the inbox's tests that hold for all of them."""
    kind: str = request.param
    return kind


@pytest.fixture
def with_effects(database_url: str) -> str:
    """``database_url``, with the table the inbox tests' handlers write their effects to."""
    return with_table(database_url, effects)
