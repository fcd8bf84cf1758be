"""The layers' import boundaries: the database (``relay/db``) and the broker (``relay/broker``)
import nothing of the console, the admin commands or the inbox (``relay.console``,
``relay.admin``, ``relay.inbox``). Those sit above both and use them; what a layer below
shares with one above (the console's records and causes, the admin's records, the inbox's
dead-letter headers) lives below both, beside ``relay/records.py``. An import upward would
make the database and the broker carry the web console's and the inbox's code (and their
import cycles) wherever they are used: in the relay daemon, in a Spark worker.

This test is the enforcement, not ruff. Ruff's ``flake8-tidy-imports.banned-api`` is one
table for the project, and a per-file ignore lifts the whole rule (TID251) for a file, not
one banned name: ``relay/db`` and ``relay/broker`` lift it to import SQLAlchemy and pika. Only
a nested ``ruff.toml`` in each layer could ban ``relay.console`` there, and (ruff 0.17) a
nested file's ``banned-api`` and ``per-file-ignores`` replace the project's rather than add
to them: each layer would re-declare its other bans and ignores (the dialects' and
``migrate.py``'s lazy imports), copies to drift from ``pyproject.toml``. Here the rule is
one table, read from the source with ``ast`` (no module under test is imported): every
``import`` and ``from ... import`` anywhere in a module (at the top, inside a function, under
``TYPE_CHECKING``), relative ones resolved against the module's own package."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository: relay/ is beside tests/

# Each lower layer, and the packages above it that it must not import.
BOUNDARIES = {
    "relay/db": ("relay.console", "relay.admin", "relay.inbox"),
    "relay/broker": ("relay.console", "relay.admin", "relay.inbox"),
}


def imported(source: str, package: str) -> Iterator[tuple[int, str]]:
    """Every module that ``source``, a module of ``package`` (dotted), imports, as (line,
    dotted name): ``from a import b`` names both ``a`` and ``a.b`` (``b`` may be a
    submodule), and a relative import is resolved against ``package``."""
    parts = package.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            start = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, start
            for alias in node.names:
                yield node.lineno, f"{start}.{alias.name}"


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in packages)


def crossings(layer: str, banned: tuple[str, ...]) -> list[str]:
    """``layer``'s imports of the ``banned`` packages, as ``path:line: name`` (the first
    name banned of each statement)."""
    found: dict[tuple[str, int], str] = {}
    for path in sorted((ROOT / layer).rglob("*.py")):
        relative = path.relative_to(ROOT)
        package = ".".join(relative.parent.parts)  # an __init__'s too: its own folder
        for line, name in imported(path.read_text(), package):
            if within(name, banned):
                found.setdefault((str(relative), line), name)
    return [f"{path}:{line}: {name}" for (path, line), name in sorted(found.items())]


@pytest.mark.parametrize(("layer", "banned"), BOUNDARIES.items(), ids=list(BOUNDARIES))
def test_a_lower_layer_imports_nothing_from_the_layers_above_it(
    layer: str, banned: tuple[str, ...]
) -> None:
    assert (ROOT / layer).is_dir()  # a layer renamed must not pass by having no modules
    assert crossings(layer, banned) == []


# Each way to import upward that the check must see (True) or must let be (False).
FORMS = {
    "import": ("import relay.console.records", True),
    "import as": ("import relay.admin.records as r", True),
    "from import": ("from relay.inbox.policy import DEAD_ERROR", True),
    "from the top package": ("from relay import inbox", True),
    "in a function": ("def f():\n    from relay.console.causes import grouped", True),
    "relative": ("from ..inbox.policy import DEAD_ERROR", True),
    "relative, its package": ("from .. import console", True),
    "a sibling, relative": ("from .connection import connection_parameters", False),
    "a name that only begins alike": ("import relay.consoles", False),
    "below both": ("from relay.records import RETRY_HEADER", False),
}


@pytest.mark.parametrize(("source", "upward"), FORMS.values(), ids=list(FORMS))
def test_the_check_sees_every_form_of_import(source: str, upward: bool) -> None:
    names = [name for _, name in imported(source, "relay.broker")]
    assert any(within(name, BOUNDARIES["relay/broker"]) for name in names) is upward
