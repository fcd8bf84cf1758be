"""Every per-database piece lives in ``relay.db.dialects``: nothing else branches on a
database's name (the migrations, which are history, may)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from relay.db import dialects
from relay.db.dialects import DIALECTS, for_url, of
from relay.errors import ConfigError

PACKAGE = Path(dialects.__file__).parents[2]  # relay/
ALLOWED = (PACKAGE / "db" / "dialects", PACKAGE / "db" / "migrations")
NAMES = {backend for dialect in DIALECTS for backend in (dialect.name, *dialect.url_backends)}


def _names_a_database(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_database(element) for element in node.elts)
    return False


def branches_on_a_database(source: str) -> list[str]:
    """The comparisons with a database's name in ``source`` (``x == "mysql"``, ``x in
    ("postgresql", ...)``), and dicts keyed by one: each is a branch on the database."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            map(_names_a_database, (node.left, *node.comparators))
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Dict) and any(
            k is not None and _names_a_database(k) for k in node.keys
        ):
            found.append(f"{node.lineno}: a dict keyed by a database's name")
    return found


@pytest.mark.parametrize(
    ("source", "branches"),
    [
        ('if conn.dialect.name == "mysql": pass', 1),
        ('x = a if name != "sqlite" else b', 1),
        ('ok = backend in ("postgresql", "postgres")', 1),
        ('choice = {"postgresql": 1}', 1),
        ('sa.Text().with_variant(mysql.LONGTEXT(), "mysql")', 0),  # a declaration
        ("if dialect.one_writer: pass", 0),
    ],
)
def test_the_scan_finds_branches_and_nothing_else(source: str, branches: int) -> None:
    assert len(branches_on_a_database(source)) == branches


def test_no_module_outside_the_dialects_branches_on_a_database() -> None:
    found = {
        str(path.relative_to(PACKAGE.parent)): branches
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(path.is_relative_to(allowed) for allowed in ALLOWED)
        and (branches := branches_on_a_database(path.read_text()))
    }
    assert found == {}


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("postgresql://h/db", "postgresql"),
        ("postgres://h/db", "postgresql"),
        ("postgresql+psycopg://h/db", "postgresql"),
        ("sqlite:///outbox.db", "sqlite"),
        ("mysql://h/db", "mysql"),
        ("mariadb+mysqldb://h/db", "mysql"),
    ],
)
def test_a_url_reaches_its_dialect(url: str, name: str) -> None:
    assert for_url(sa.make_url(url)).name == name
    assert of(name) is for_url(sa.make_url(url))


def test_a_database_without_a_dialect_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="'oracle' is not one of postgresql://"):
        for_url(sa.make_url("oracle://h/db"))


@pytest.mark.parametrize(
    ("driver", "changed"),
    [
        (SimpleNamespace(isolation_level=""), False),
        (SimpleNamespace(isolation_level=None), True),
        # Python 3.12's sqlite3: its autocommit attribute, as kept and as a handler may set it.
        (SimpleNamespace(isolation_level="", autocommit=-1), False),
        (SimpleNamespace(isolation_level="", autocommit=True), True),
        (SimpleNamespace(isolation_level="", autocommit=False), True),
    ],
)
def test_a_sqlite_connection_left_in_another_transaction_mode_is_changed(
    driver: SimpleNamespace, changed: bool
) -> None:
    assert of("sqlite").session_changed(driver) is changed
