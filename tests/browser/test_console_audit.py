"""The audit log in a real browser (Debian's chromium, headless, Playwright) over an SQLite
outbox: a partial change names the rows it left, on its done page (links to them) and in
its entry; a refused attempt is an entry with who and why; each target reads in words;
the log is filtered by user, action and time, and its pages keep the filter."""

from __future__ import annotations

from pathlib import Path

from tests.support.console import SETTLED, follow, log_in, park, signed_in

NO_ROUTE = "returned: 312 NO_ROUTE"


def test_the_audit_names_what_a_change_left_and_whom_it_refused_filtered_by_user(
    sqlite_url: str, tmp_path: Path
) -> None:
    park(
        sqlite_url, [{"exchange": "x", "message_id": f"s{i}"} for i in range(2)], NO_ROUTE, SETTLED
    )
    with signed_in(sqlite_url, tmp_path, "otto", RELAY_CONSOLE_PAGE_ROWS="1") as (
        console,
        chromium,
        page,
    ):
        page.goto(f"{console.url}/rows?exchange=x")
        (late,) = park(sqlite_url, [{"exchange": "x", "message_id": "late"}], NO_ROUTE)
        page.check("#scope-filter")
        follow(page, "#replay-selected")
        # The row it would leave is named before it is made, and after.
        assert page.inner_text("#parked-since").endswith(f"Rows {late}.")
        follow(page, "#confirm")
        # The row left is named, and a link to its page.
        assert page.inner_text("#parked-since").endswith(f"Rows {late}.")
        follow(page, f"#parked-since a[href$='/rows/{late}']")
        assert page.inner_text("#message-id") == "late"

        viewer = chromium.page()
        chromium.context.clear_cookies()
        log_in(viewer, console.url, "vera")
        token = viewer.input_value("form.who input[name=csrf]")
        form: dict[str, str | float | bool] = {
            "csrf": token,
            "action": "discard",
            "id": str(late),
            "bound": "2026-01-01T00:00:00+00:00",
        }
        assert viewer.request.post(f"{console.url}/act", form=form).status == 403

        viewer.goto(f"{console.url}/audit")
        first = viewer.locator("#audit tbody tr").nth(0)
        assert first.get_attribute("class") == "refused"
        assert "vera" in first.inner_text() and "discard" in first.inner_text()
        assert f"rows: ids {late}" in first.locator(".target").inner_text()
        assert first.locator(".result").inner_text() == (
            "refused at act (403): this needs the operator role; vera is a viewer"
        )
        # One entry a page: the next page keeps the filter.
        follow(viewer, "#older")
        second = viewer.locator("#audit tbody tr").nth(0)
        assert "otto" in second.inner_text()
        assert second.locator(".target").inner_text().startswith("filter: exchange “x”")
        assert second.locator(".result").inner_text() == (
            f"done; left 1 parked after the bound: ids {late}"
        )

        viewer.goto(f"{console.url}/audit")
        viewer.fill("input[name=user]", "otto")
        follow(viewer, "#audit-filter button[type=submit]")
        assert viewer.locator("#audit tbody tr").count() == 1
        assert "replay" in viewer.inner_text("#audit tbody tr")
        assert viewer.locator("#older").count() == 0  # otto's one entry
        viewer.select_option("select[name=action]", "discard")
        follow(viewer, "#audit-filter button[type=submit]")
        assert viewer.inner_text("#audit tbody") == "No entry matches this filter."
        viewer.goto(f"{console.url}/audit?since=2100-01-01T00:00")
        assert viewer.inner_text("#audit tbody") == "No entry matches this filter."

        # An edit refused names its row, never the values posted.
        edit: dict[str, str | float | bool] = {"csrf": token, "exchange": "secret-exchange"}
        assert viewer.request.post(f"{console.url}/rows/{late}/edit", form=edit).status == 403
        viewer.goto(f"{console.url}/audit?action=edit_and_replay")
        entry = viewer.inner_text("#audit tbody tr")
        assert f"rows: ids {late}" in entry and "needs the admin role" in entry
        assert "secret-exchange" not in entry
        assert chromium.dialogs == [] and chromium.errors == []
