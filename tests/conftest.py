"""Session fixtures: a private RabbitMQ node, a private PostgreSQL and a private MariaDB,
started once on loopback in temporary directories when a test first needs them; SQLite in a
temp file. Every test that uses MariaDB is also marked ``mariadb`` (``-m mariadb`` runs them
alone, whatever their folder). MariaDB meets RabbitMQ 3.10 only: what its cases check is the
database's side, which the broker's version does not change, and the whole suite must stay
under 15 minutes; their RabbitMQ 4.0 twins are deselected.

``scripts/test`` runs the suite in four processes (pytest-xdist): each has its own servers
(node names carry the process id, ports are free ones, the Debian 13 root is built once under
a lock), and nothing a test changes is shared with another process's tests. The slowest
tests are handed out first (``tests/support/schedule.py``).

Two RabbitMQ versions: ``rabbit`` is Debian 12's own (3.10), ``rabbit4`` is 4.0 from a Debian
13 root (``devtools.debian13``, built on first use into a cache folder). The integration and
fault suites run against both (their ``rabbit`` and ``broker`` fixtures are parametrized;
the fault scenarios with the broker a bystander run on 3.10 alone);
the items on 4.0 are marked ``rabbitmq4``, so either layer runs alone (``-m rabbitmq4``,
``-m "not rabbitmq4"``).

A missing server binary or tool fails loudly, saying which: these tests never skip
themselves (the 4.0 layer too needs root and debootstrap; ``-m "not rabbitmq4"`` leaves it
out where it cannot run).

Each test's layer is its folder's (``LAYERS``), so that every layer runs alone
(``scripts/test -m unit``, ``-m "contract or integration"``, ...).
"""

from __future__ import annotations

import contextlib
import gc
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

from devtools.servers import MariaDBServer, PostgresServer, RabbitNode
from relay.db.migrate import migrate
from relay.db.sentlog import SentLogRebuild
from tests.support.pairwise import beyond_pairs
from tests.support.rabbitmq import RABBITMQ_3, RABBITMQ_4, rabbit_node, running
from tests.support.schedule import OneProcessModules, SlowestFirst, measured

# tests/<folder>/ -> its layer's marker (declared, with what each layer needs, in pyproject.toml)
LAYERS = {
    "unit": pytest.mark.unit,
    "contract": pytest.mark.contract,
    "integration": pytest.mark.integration,
    "e2e": pytest.mark.e2e,
    "faults": pytest.mark.faults,
    "model": pytest.mark.model,
    "cluster": pytest.mark.cluster,
    "spark": pytest.mark.spark,
    "deploy": pytest.mark.deploy,
    "browser": pytest.mark.browser,
}
TESTS = Path(__file__).parent


# Property tests judge values, never time: the suite runs beside other work (a load of 6 to
# 12 on two cores in CI's run), where Hypothesis's wall-clock checks (a deadline per example,
# input generation "too slow") failed a test whose values were right (tests/unit/test_pgcopy.py
# beside the CPU hog).
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


def pytest_configure(config: pytest.Config) -> None:
    # The slowest tests handed out first (``--dist loadgroup``): tests/support/schedule.py
    config.pluginmanager.register(SlowestFirst(measured()), "slowest-first")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup``: the modules that share a long server start run in one process."""
    if config.getvalue("dist") == "loadgroup":
        return OneProcessModules(config, log)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        item.add_marker(LAYERS[folder])
        callspec = getattr(item, "callspec", None)
        if "rabbit4" in getattr(item, "fixturenames", ()) or (
            callspec is not None and RABBITMQ_4 in callspec.params.values()
        ):
            item.add_marker(pytest.mark.rabbitmq4)
        if "mariadb" in getattr(item, "fixturenames", ()) or (
            callspec is not None
            and any(str(p).startswith("mariadb") for p in callspec.params.values())
        ):
            item.add_marker(pytest.mark.mariadb)
    left_out = [
        i
        for i in items
        if _twin(i) or _not_on_this_database(i) or _beyond_pairs(i) or _inapplicable(i)
    ]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [i for i in items if i not in left_out]


def _twin(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("mariadb") and item.get_closest_marker("rabbitmq4"))


def _beyond_pairs(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and beyond_pairs(callspec.params)


def _inapplicable(item: pytest.Item) -> bool:
    """An ``applies(predicate)`` test whose parameters the predicate refuses: a case that
    does not exist there (SQLite's one isolation level, the fake's atomic settle), left out
    at collection rather than skipped, so that a skip always means something is missing."""
    applies = item.get_closest_marker("applies")
    callspec = getattr(item, "callspec", None)
    return applies is not None and callspec is not None and not applies.args[0](callspec.params)


def _not_on_this_database(item: pytest.Item) -> bool:
    """A ``databases(...)`` test whose ``database_url`` is not one of them: the test is about
    the broker's side or the DataFrame's, the same on every database (see pyproject)."""
    databases = item.get_closest_marker("databases")
    callspec = getattr(item, "callspec", None)
    if databases is None or callspec is None or "database_url" not in callspec.params:
        return False
    return callspec.params["database_url"] not in databases.args


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (the relay, its drivers, the test modules: some 130,000
    objects, alive for the whole session) kept out of the cycle collector's sight, so that
    ``collected`` below looks only at what the tests made: a collection after each test
    took 0.09 to 0.16 s of CPU over that heap, some 250 s of a suite's four processes on two
    cores, and 0.004 s after it. Nothing frozen here becomes garbage: the tests' own objects
    (fixtures of every scope included) are made later and stay in sight."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def collected() -> Iterator[None]:
    """After each test, its garbage collected before the next test starts. An object left
    unclosed (a pika connection: its I/O loop's socket pair) warns when it is collected
    (ResourceWarning, an error here: pyproject's filterwarnings), and the connections hold
    themselves in reference cycles, which only the cycle collector frees, whenever it runs:
    the warning failed whichever test ran then. Collected here, it fails the test that left
    it, in its teardown. ``PYTHONTRACEMALLOC=20`` adds where the object was made. The unit
    layer too (an outside review's socket left in a cycle there failed the next test): with
    what collection imported frozen, a collection costs it about 10 ms of CPU a test."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def rabbit3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    yield from running(rabbit_node(RABBITMQ_3, tmp_path_factory, "relay-tests"))


@pytest.fixture(scope="session")
def rabbit(rabbit3: RabbitNode) -> RabbitNode:
    """The 3.10 node (the integration layer's ``rabbit`` is either version). Named apart
    from the node's own fixture: a parametrized ``rabbit`` that asked for the one it
    overrides passed its version to it as the cache key, and every change of version
    between two tests stopped and started the 3.10 node again (29 times a process)."""
    return rabbit3


@pytest.fixture(scope="session")
def rabbit4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    yield from running(rabbit_node(RABBITMQ_4, tmp_path_factory, "relay-tests-4"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    # Not under pytest's base temp: any other pytest session started on this machine makes
    # that private to root again, and the server, which runs as postgres, loses its files.
    with tempfile.TemporaryDirectory(prefix="relay-tests-postgres-") as base:
        server = PostgresServer(Path(base), tuned_for_tests=True)
        server.start()
        server.psql("CREATE DATABASE outbox_template")
        migrate(server.url("outbox_template"))
        yield server
        server.stop("immediate")


@pytest.fixture
def postgresql_url(postgres: PostgresServer) -> str:
    """A fresh, migrated database per test (a copy of the migrated template), its sent log
    complete. Fault tests crash the shared server, and a crash empties unlogged tables in
    every database, the template's too: copies made after one have no state row, so that
    no claim takes a row until a relay has rebuilt the log (``relay.db.sentlog``), as after
    a crash in production. A copy's journal is the template's, empty: the rebuild copies
    nothing and marks the log complete."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {name} TEMPLATE outbox_template")
    url = postgres.url(name)
    rebuild = SentLogRebuild(url)
    try:
        assert rebuild.rebuild() == 0
    finally:
        rebuild.close()
    return url


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb"), tuned_for_tests=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mariadb_template(mariadb: MariaDBServer) -> tuple[str, dict[str, int]]:
    """A database migrated once per process, for ``mariadb_url`` to copy: its name, and its
    tables with the rows each holds. Copied table by table, which holds while the schema has
    no foreign keys, triggers or views on MariaDB (which CREATE TABLE ... LIKE would leave
    out): said here if one comes."""
    name = "outbox_template"
    mariadb.create_database(name)
    migrate(mariadb.url(name))
    engine = sa.create_engine(mariadb.url(name))
    try:
        with engine.connect() as conn:
            left_out = conn.exec_driver_sql(
                "SELECT (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE "
                "TRIGGER_SCHEMA = DATABASE()) + (SELECT COUNT(*) FROM information_schema.VIEWS "
                "WHERE TABLE_SCHEMA = DATABASE()) + (SELECT COUNT(*) FROM "
                "information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE())"
            ).scalar_one()
            assert left_out == 0, "mariadb_url's copy leaves out triggers, views or foreign keys"
            tables = conn.exec_driver_sql("SHOW FULL TABLES WHERE Table_type = 'BASE TABLE'")
            names = [row[0] for row in tables]
            rows = {
                t: conn.exec_driver_sql(f"SELECT COUNT(*) FROM `{t}`").scalar_one() for t in names
            }
    finally:
        engine.dispose()
    return name, rows


@pytest.fixture
def mariadb_url(mariadb: MariaDBServer, mariadb_template: tuple[str, dict[str, int]]) -> str:
    """A fresh, migrated database per test: the template's tables made alike and their rows
    copied, in a tenth of a second (migrating took 0.4 s, some 250 tests)."""
    template, rows = mariadb_template
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(mariadb.url(template))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
            for table, count in rows.items():
                conn.exec_driver_sql(f"CREATE TABLE {name}.`{table}` LIKE `{table}`")
                if count:
                    conn.exec_driver_sql(f"INSERT INTO {name}.`{table}` SELECT * FROM `{table}`")
    finally:
        engine.dispose()
    return mariadb.url(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated once per process, for ``sqlite_url`` to copy."""
    path = tmp_path_factory.mktemp("sqlite-template") / "outbox.db"
    migrate(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh, migrated database per test: a copy of the migrated template, by SQLite's
    backup (whatever its WAL holds), in 10 ms; migrating took 0.2 s, some 300 tests."""
    path = tmp_path / "outbox.db"
    with (
        contextlib.closing(sqlite3.connect(sqlite_template)) as template,
        contextlib.closing(sqlite3.connect(path)) as copy,
    ):
        template.backup(copy)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def database_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))
