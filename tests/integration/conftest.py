"""The integration tests run against both RabbitMQ versions (see tests/conftest.py)."""

from __future__ import annotations

import pytest

from devtools.servers import RabbitNode
from tests.support.rabbitmq import RABBITMQ_3, RABBITMQ_VERSIONS


@pytest.fixture(scope="session", params=RABBITMQ_VERSIONS)
def rabbit(request: pytest.FixtureRequest, rabbit: RabbitNode) -> RabbitNode:
    if request.param == RABBITMQ_3:
        return rabbit
    node: RabbitNode = request.getfixturevalue("rabbit4")
    return node
