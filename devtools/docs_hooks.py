"""The documentation's generated parts, so that neither the site nor the checkout can drift
from the code or the README: the configuration page's tables of settings come from the
settings' declarations (``relay.settings.describe``, what ``relay run --help`` prints), and
the home page is the README, its links to ``docs/`` made relative to the site.

The tables are written into docs/configuration.md itself, between their markers
(``python -m devtools.docs_hooks`` writes them anew): a page filled in only when MkDocs
built the site showed empty sections to whoever read it in the checkout or on GitHub. The
site's build (a MkDocs hook, mkdocs.yml) and tests/unit/test_docs.py fail while the page's
tables are not what the declarations give.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.settings import ConsoleSettings, InboxSettings, Settings, describe

MARKER = "<!-- settings -->"
INBOX_MARKER = "<!-- inbox-settings -->"
CONSOLE_MARKER = "<!-- console-settings -->"
README_MARKER = "<!-- readme -->"
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
TABLES = ((MARKER, Settings), (INBOX_MARKER, InboxSettings), (CONSOLE_MARKER, ConsoleSettings))


def settings_table(
    settings: type[Settings] | type[InboxSettings] | type[ConsoleSettings] = Settings,
) -> str:
    """Every setting as a Markdown table: variable, default, meaning."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for _name, env, default, text, see in describe(settings):
        shown = f"`{default.lower() if default in ('True', 'False') else default}`"
        more = f" [More]({see})." if see else ""
        rows.append(
            f"| `{env}` | {shown if default else ''} | {text.replace('|', '&#124;')}{more} |"
        )
    return "\n".join(rows)


def end_of(marker: str) -> str:
    """``<!-- settings -->``'s end marker: ``<!-- /settings -->``."""
    return marker.replace("<!-- ", "<!-- /", 1)


def with_tables(markdown: str) -> str:
    """``markdown`` with each table of settings between its markers made anew."""
    for marker, settings in TABLES:
        between = re.compile(re.escape(marker) + ".*?" + re.escape(end_of(marker)), re.S)
        block = f"{marker}\n\n{settings_table(settings)}\n\n{end_of(marker)}"
        # A replacement string would read the table's backslashes as escapes.
        markdown, found = between.subn(_as_it_is(block), markdown)
        if found != 1:
            raise ValueError(f"{marker} ... {end_of(marker)}: not once in the page")
    return markdown


def _as_it_is(text: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: text


def home_page() -> str:
    return README.read_text().replace("](docs/", "](")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown and with_tables(markdown) != markdown:
        raise ValueError(
            "docs/configuration.md: its tables of settings are not the declarations'; "
            "run python -m devtools.docs_hooks"
        )
    return markdown.replace(README_MARKER, home_page())


if __name__ == "__main__":
    CONFIGURATION.write_text(with_tables(CONFIGURATION.read_text()))
    sys.exit(0)
