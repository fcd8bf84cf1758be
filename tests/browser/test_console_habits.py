"""An operator's habits in a real browser (Debian's chromium, headless, Playwright) over an
SQLite outbox: a JSON payload pretty-printed and downloaded as a file, never drawn as a page;
times said as ages with their UTC time, without the script; long values that keep the
layout, each whole within reach."""

from __future__ import annotations

import json
from pathlib import Path

from relay.causes import CAUSES_LISTED
from relay.console_constants import CONSOLE_LISTED_CHARS
from tests.support.console import (
    ConsoleProcess,
    browser,
    console_env,
    follow,
    log_in,
    park,
    signed_in,
    users_file,
)

NO_ROUTE = "returned: 312 NO_ROUTE"


def test_a_json_payload_is_pretty_printed_and_downloaded_whole_as_an_attachment(
    sqlite_url: str, tmp_path: Path
) -> None:
    document = {"order": 1042, "lines": [{"sku": "a", "qty": 2}]}
    (row,) = park(
        sqlite_url,
        [
            {
                "message_id": "j",
                "payload": json.dumps(document).encode(),
                "content_type": "application/json",
            }
        ],
        NO_ROUTE,
    )
    (html,) = park(
        sqlite_url,
        [{"message_id": "h", "payload": b"<script>alert(1)</script>", "content_type": "text/html"}],
        NO_ROUTE,
    )
    with signed_in(sqlite_url, tmp_path, "otto") as (console, chromium, page):
        page.goto(f"{console.url}/rows/{row}")
        assert page.inner_text("#payload") == json.dumps(document, indent=2)
        with page.expect_download() as started:
            page.click("#payload-download")
        download = started.value
        assert download.suggested_filename == f"row-{row}.json"
        assert Path(download.path()).read_bytes() == json.dumps(document).encode()
        answer = page.request.get(f"{console.url}/rows/{row}/payload")
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["content-disposition"] == f'attachment; filename="row-{row}.json"'

        # Markup is downloaded as bytes: nothing of it runs, even opened directly.
        answer = page.request.get(f"{console.url}/rows/{html}/payload")
        assert answer.headers["content-type"] == "application/octet-stream"
        assert answer.body() == b"<script>alert(1)</script>"
        with page.expect_download() as started:
            page.evaluate(f"window.location.href = '/rows/{html}/payload'")
        assert started.value.suggested_filename == f"row-{html}.bin"
        assert chromium.dialogs == [] and chromium.errors == []

        viewer = chromium.page()
        chromium.context.clear_cookies()
        log_in(viewer, console.url, "vera")
        assert viewer.request.get(f"{console.url}/rows/{row}/payload").status == 403


def test_times_are_ages_with_their_utc_time_and_need_no_script(
    sqlite_url: str, tmp_path: Path
) -> None:
    (row,) = park(sqlite_url, [{"message_id": "t"}], NO_ROUTE, ago=3 * 60 + 5)
    env = console_env(
        sqlite_url, RELAY_CONSOLE_AUTH="users", RELAY_CONSOLE_USERS_FILE=str(users_file(tmp_path))
    )
    with (
        ConsoleProcess(env, tmp_path / "console.log") as console,
        browser(java_script_enabled=False) as chromium,
    ):
        page = chromium.page()
        log_in(page, console.url, "otto")
        for path, where in (
            ("/rows", f"#rows tr[data-id='{row}'] time"),
            (f"/rows/{row}", ".detail dd time >> nth=1"),
            ("/", "#causes time >> nth=0"),
        ):
            page.goto(console.url + path)
            shown = page.locator(where)
            assert shown.inner_text() == "3 min ago", path
            assert (shown.get_attribute("title") or "").endswith(" UTC"), path
            assert (shown.get_attribute("datetime") or "").endswith("+00:00"), path


def test_long_values_keep_the_layout_and_stay_whole_within_reach(
    sqlite_url: str, tmp_path: Path
) -> None:
    error = "failed: " + " ".join(f"word{i}" for i in range(1500))  # about 10 kB
    destination = "x" * 300
    key = "k" * 400  # no space to break at
    (row,) = park(
        sqlite_url,
        [{"message_id": key, "exchange": destination, "routing_key": key, "ordering_key": key}],
        error,
    )
    with signed_in(sqlite_url, tmp_path, "otto") as (console, chromium, page):
        page.set_viewport_size({"width": 1280, "height": 800})
        for path in ("/", "/rows", f"/rows/{row}", "/archive"):
            page.goto(console.url + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280, (path, width)
        page.goto(f"{console.url}/rows")
        listed = page.locator(f"#rows tr[data-id='{row}']")
        assert (listed.bounding_box() or {"height": 0})["height"] < 200
        # Within reach: the cell scrolls over the list's cut (a list of fifty 2 MB errors was
        # a 105 MB page), and the row's page shows it all.
        assert listed.locator(".reason").inner_text() == error[:CONSOLE_LISTED_CHARS]
        follow(page, f"#rows tr[data-id='{row}'] a")
        assert page.inner_text("#last-error") == error
        assert page.inner_text("#message-id") == key
        assert chromium.dialogs == [] and chromium.errors == []


def test_a_message_id_prefix_finds_its_rows_and_a_whole_id_offers_its_row(
    sqlite_url: str, tmp_path: Path
) -> None:
    ids = park(
        sqlite_url,
        [
            {"message_id": m}
            for m in ("order-1042-paid", "order-1042-sent", "order-7", "Order-1042")
        ],
        NO_ROUTE,
    )
    with signed_in(sqlite_url, tmp_path, "otto") as (console, chromium, page):
        page.goto(f"{console.url}/rows")
        page.fill("#message-prefix", "order-1042")
        follow(page, "#filters button[type=submit]")
        listed = page.locator("#rows tbody tr")
        assert sorted(int(listed.nth(i).get_attribute("data-id") or 0) for i in range(2)) == ids[:2]
        assert listed.count() == 2 and page.locator("#row-of-id").count() == 0
        page.fill("#message-prefix", str(ids[2]))
        follow(page, "#filters button[type=submit]")
        follow(page, "#row-of-id a")
        assert page.inner_text("#message-id") == "order-7"
        assert chromium.dialogs == [] and chromium.errors == []


def test_every_cause_is_reachable_past_the_listed_ones(sqlite_url: str, tmp_path: Path) -> None:
    """More causes than the overview lists: the "other causes" line links to every cause,
    one line each, and the rows page offers the first of them (read from the index of
    causes, not a walk of the rows) with a link to the rest."""
    letters = "ghijklmnopqrstuvwxyz"  # words, not numbers or hex, which causes take out
    words = [a + b for a in letters for b in letters][: CAUSES_LISTED + 2]
    for word in words:
        park(sqlite_url, [{"message_id": f"m-{word}"}], f"refused by rule {word}")
    with signed_in(sqlite_url, tmp_path, "otto") as (console, chromium, page):
        page.goto(f"{console.url}/")
        assert page.locator("#causes tbody tr").count() == CAUSES_LISTED + 1
        assert page.inner_text("#other-causes").startswith("2 other causes")
        follow(page, "#other-causes a")
        listed = page.locator("#causes tbody tr")
        assert listed.count() == len(words) and page.locator("#other-causes").count() == 0
        shown = {listed.nth(i).inner_text().split("\t")[0] for i in range(len(words))}
        assert shown == {f"refused by rule {word}" for word in words}
        page.goto(f"{console.url}/rows")
        assert page.locator("#filters select[name=cause] option").count() == CAUSES_LISTED + 1
        follow(page, "#every-cause")
        assert page.locator("#causes tbody tr").count() == len(words)
        assert chromium.dialogs == [] and chromium.errors == []
