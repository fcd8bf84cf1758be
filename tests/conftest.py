"""Session fixtures: a private RabbitMQ node and a private PostgreSQL, started once on
loopback in temporary directories when a test first needs them; SQLite in a temp file.

A missing server binary fails loudly: these tests never skip themselves."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.servers import PostgresServer, RabbitNode
from relay.db.engine import migrate

SERVER_FIXTURES = {"rabbit", "postgres", "postgresql_url", "database_url"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    node = RabbitNode(tmp_path_factory.mktemp("rabbit"), name="relay-tests")
    node.start()
    yield node
    node.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("postgres"), tuned_for_tests=True)
    server.start()
    server.psql("CREATE DATABASE outbox_template")
    migrate(server.url("outbox_template"))
    yield server
    server.stop("immediate")


@pytest.fixture
def postgresql_url(postgres: PostgresServer) -> str:
    """A fresh, migrated database per test (a copy of the migrated template)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {name} TEMPLATE outbox_template")
    return postgres.url(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    migrate(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))
