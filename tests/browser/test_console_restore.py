"""A bulk discard undone whole, in a real browser (Debian's chromium, headless, Playwright)
over an SQLite outbox: the discard's done page links to the rows it archived, and a restore
of every row that filter matches brings each back, across many chunks."""

from __future__ import annotations

from pathlib import Path

from relay.console_constants import CONSOLE_CHUNK_ROWS, CONSOLE_PAGE_ROWS
from relay.console_records import Actor
from relay.db.console import ConsoleReads
from relay.db.console_actions import ConsoleActions
from tests.support.console import SETTLED, follow, park, signed_in, statuses_of

NO_ROUTE = "returned: 312 NO_ROUTE"


def test_a_bulk_discard_is_undone_whole_from_its_done_page(sqlite_url: str, tmp_path: Path) -> None:
    many = CONSOLE_CHUNK_ROWS * 2 + 1
    ids = park(
        sqlite_url,
        [{"exchange": "orders", "message_id": f"o-{i}"} for i in range(many)],
        NO_ROUTE,
        ago=SETTLED,
    )
    # Discarded by someone else, before: not this discard's to undo.
    theirs = park(sqlite_url, [{"exchange": "orders", "message_id": "t"}], NO_ROUTE, ago=SETTLED)
    reads, actions = ConsoleReads(sqlite_url), ConsoleActions(sqlite_url)
    try:
        actions.discard(Actor("ada", "admin"), theirs, None, reads.now())
    finally:
        reads.close()
        actions.close()
    with signed_in(sqlite_url, tmp_path, "otto") as (console, chromium, page):
        page.goto(f"{console.url}/rows?exchange=orders")
        page.check("#scope-filter")
        follow(page, "button[value=discard]")
        follow(page, "#confirm")
        assert page.inner_text("#changed") == f"{many} changed."
        assert statuses_of(sqlite_url, ids) == {}

        follow(page, "#undo")
        listed = page.locator("#archive tbody tr")
        assert listed.count() == CONSOLE_PAGE_ROWS
        assert theirs[0] not in [
            int(listed.nth(i).get_attribute("data-id") or 0) for i in range(CONSOLE_PAGE_ROWS)
        ]
        page.check("#scope-filter")
        follow(page, "#restore-selected")
        assert page.inner_text("#confirm-count").startswith(f"{many} discarded rows match")
        follow(page, "#confirm")
        assert page.inner_text("#changed") == f"{many} changed."
        assert statuses_of(sqlite_url, ids + theirs) == dict.fromkeys(ids, "parked")
        page.goto(f"{console.url}/archive")
        assert [listed.nth(i).get_attribute("data-id") for i in range(listed.count())] == [
            str(theirs[0])
        ]
        assert chromium.dialogs == [] and chromium.errors == []
