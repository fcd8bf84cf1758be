"""The documentation site's reference pages cover every setting and every exported metric,
as MkDocs renders them (devtools/docs_hooks.py fills in the generated parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.docs_hooks import CONSOLE_MARKER, README_MARKER, on_page_markdown, with_tables
from relay.db.roles import PRIVILEGES, grants
from relay.metrics import Metrics
from relay.settings import Settings, describe, known_env_names

DOCS = Path(__file__).resolve().parents[2] / "docs"


def rendered(page: str) -> str:
    return on_page_markdown((DOCS / page).read_text(), None, None, None)


def test_the_configuration_page_documents_every_setting() -> None:
    page = rendered("configuration.md")
    assert [name for name in known_env_names() if f"`{name}`" not in page] == []
    # One table row per setting, with the help its declaration gives (what --help prints).
    for _name, env, _default, text, _see in describe(Settings):
        assert f"| `{env}` |" in page
        assert text.replace("|", "&#124;") in page


def test_the_configuration_pages_tables_are_written_in_it_as_declared() -> None:
    """In the checkout too, not only on the built site: each table between its markers is
    what the declarations give (``python -m devtools.docs_hooks`` writes them), the
    console's among them."""
    page = (DOCS / "configuration.md").read_text()
    assert with_tables(page) == page
    console = page.split(CONSOLE_MARKER)[1]
    assert "| `RELAY_CONSOLE_AUTH` |" in console
    stale = page.replace("| `RELAY_CONSOLE_AUTH` |", "| `RELAY_CONSOLE_AUTHS` |")
    with pytest.raises(ValueError, match=r"python -m devtools\.docs_hooks"):
        on_page_markdown(stale, None, None, None)


def test_the_operations_page_documents_every_metric() -> None:
    page = rendered("operations.md")
    families = Metrics().registry.collect()
    exported = {f.name + "_total" if f.type == "counter" else f.name for f in families}
    assert len(exported) >= 12
    assert [name for name in sorted(exported) if f"`{name}" not in page] == []


def test_the_home_page_is_the_readme_with_links_into_the_site() -> None:
    assert (DOCS / "index.md").read_text().strip() == README_MARKER
    home = rendered("index.md")
    assert home.startswith("# outbox-relay")
    assert "](docs/" not in home and "](how-it-works.md)" in home


def test_the_readme_stays_short() -> None:
    assert len((DOCS.parent / "README.md").read_text().splitlines()) <= 150


def test_the_operations_page_prints_each_roles_grants() -> None:
    """Exactly the statements the tests grant each role (``relay.db.roles``)."""
    page = rendered("operations.md")
    for role in PRIVILEGES:
        missing = [g for g in grants("postgresql", role, role) if f"{g};" not in page]
        assert missing == [], role
