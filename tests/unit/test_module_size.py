"""No module of ``relay/`` is over 400 lines (issue 58): a module whose job a reader cannot
hold in mind at once is split by role into modules with one job each (the layout is in
``docs/development.md``)."""

from __future__ import annotations

from pathlib import Path

import relay

PACKAGE = Path(relay.__file__).parent  # relay/
MAX_LINES = 400


def test_no_module_of_relay_is_over_400_lines() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert PACKAGE / "relay.py" in modules  # the walk reads the package itself
    too_long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in modules
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert too_long == {}
