"""MkDocs hooks (mkdocs.yml), so that the site cannot drift from the code or the README: the
configuration page's table of settings comes from the settings' declarations
(``relay.settings.describe``, what ``relay run --help`` prints), and the home page is the
README, its links to ``docs/`` made relative to the site."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relay.settings import ConsoleSettings, InboxSettings, Settings, describe

MARKER = "<!-- settings -->"
INBOX_MARKER = "<!-- inbox-settings -->"
CONSOLE_MARKER = "<!-- console-settings -->"
README_MARKER = "<!-- readme -->"
README = Path(__file__).resolve().parents[1] / "README.md"


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


def home_page() -> str:
    return README.read_text().replace("](docs/", "](")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return (
        markdown.replace(MARKER, settings_table())
        .replace(INBOX_MARKER, settings_table(InboxSettings))
        .replace(CONSOLE_MARKER, settings_table(ConsoleSettings))
        .replace(README_MARKER, home_page())
    )
