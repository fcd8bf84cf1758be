"""The console in a real browser (Debian's chromium, headless, driven by Playwright), as
`relay console` subprocesses over a real PostgreSQL and an SQLite outbox, a running relay and
RabbitMQ: each login mode, parked rows by cause, a filter, a row's page, a replay whose rows
reach a queue through the relay while a row parked after the page was drawn stays parked,
refusals (a viewer's replay, a form without its CSRF token, forged proxy headers), the audit
log. Every page is watched for dialogs and console errors: hostile values must show as text
and run nothing. Screenshots go to docs/images/console/ when CONSOLE_SCREENSHOTS is set."""

from __future__ import annotations

import http.client
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page

from devtools.broker import drain
from devtools.relayproc import RelayProcess, relay_on_new_queue
from devtools.servers import RabbitNode, free_port
from relay.console.passwords import hash_password
from relay.db.schema import console_audit, outbox
from tests.support.console import (
    IMG,
    SCRIPT,
    SETTLED,
    ConsoleProcess,
    announce,
    browser,
    call,
    console_env,
    follow,
    log_in,
    login_form,
    park,
    post_login,
    session_cookie,
    signed_in,
    statuses_of,
    users_file,
)
from tests.support.oidc_provider import CLIENT_ID, CLIENT_SECRET, oidc_provider

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "images" / "console"
NO_ROUTE = "returned: 312 NO_ROUTE"


def shot(page: Page, name: str) -> None:
    """A screenshot for the docs, when asked for (CONSOLE_SCREENSHOTS=1)."""
    if os.environ.get("CONSOLE_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def audit_rows(url: str) -> list[sa.Row[tuple[object, ...]]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(console_audit).order_by(console_audit.c.id)))
    finally:
        engine.dispose()


def test_an_operator_replays_what_they_saw_through_the_relay_and_the_audit_says_so(
    postgresql_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    exchange, queue, relay_env = relay_on_new_queue(
        tmp_path, "console", postgresql_url, rabbit.url, RELAY_METRICS_PORT=str(free_port())
    )
    seen = park(
        postgresql_url,
        [
            {"exchange": exchange, "routing_key": "order.paid", "message_id": f"seen-{i}"}
            for i in range(3)
        ],
        NO_ROUTE,
        ago=SETTLED,
    )
    other = park(
        postgresql_url,
        [{"exchange": "gone", "message_id": f"gone-{i}"} for i in range(2)],
        "failed: 404 NOT_FOUND - no exchange 'gone' in vhost '/'",
    )
    env = console_env(
        postgresql_url,
        RELAY_CONSOLE_AUTH="users",
        RELAY_CONSOLE_USERS_FILE=str(users_file(tmp_path)),
    )
    with (
        RelayProcess(relay_env, tmp_path / "relay.log"),
        ConsoleProcess(env, tmp_path / "console.log") as console,
        browser() as chromium,
    ):
        page = chromium.page()
        log_in(page, console.url, "otto")
        causes = page.locator("#causes tbody tr")
        assert causes.count() == 2
        assert NO_ROUTE in causes.nth(0).inner_text() and "\t3\t" in causes.nth(0).inner_text()
        assert "failed: 404 NOT_FOUND - no exchange '…' in vhost '…'" in causes.nth(1).inner_text()
        shot(page, "overview")

        page.goto(f"{console.url}/rows?exchange={exchange}")
        listed = page.locator("#rows tbody tr")
        assert sorted(int(listed.nth(i).get_attribute("data-id") or 0) for i in range(3)) == seen
        assert listed.count() == 3
        shot(page, "rows")

        page.goto(f"{console.url}/rows/{seen[0]}")
        assert page.inner_text("#message-id") == "seen-0"
        assert page.inner_text("#payload") == "x"
        shot(page, "row")

        # The page is drawn; a row of the same filter is parked after it.
        page.goto(f"{console.url}/rows?exchange={exchange}")
        late = park(postgresql_url, [{"exchange": exchange, "message_id": "late"}], NO_ROUTE)
        page.check("#scope-filter")
        follow(page, "#replay-selected")
        assert page.inner_text("#confirm-count").startswith("3 parked rows match")
        assert page.inner_text("#parked-since").startswith("1 rows parked since")
        shot(page, "confirm")
        follow(page, "#confirm")
        assert page.inner_text("#changed") == "3 changed."
        assert page.inner_text("#parked-since").startswith("1 rows parked after")

        delivered = drain(rabbit.url, queue, expect=3)
        assert sorted(d.message_id for d in delivered) == ["seen-0", "seen-1", "seen-2"]
        assert statuses_of(postgresql_url, late + other) == dict.fromkeys(late + other, "parked")

        page.goto(f"{console.url}/audit")
        assert "otto" in page.inner_text("#audit tbody tr >> nth=0")
        shot(page, "audit")
        assert chromium.dialogs == [] and chromium.errors == []

    (entry,) = audit_rows(postgresql_url)
    assert (entry.actor, entry.role, entry.action, entry.rows, entry.result) == (
        "otto",
        "operator",
        "replay",
        3,
        f"done; left 1 parked after the bound: ids {late[0]}",
    )
    target = json.loads(entry.target)
    assert target["filter"] == {"exchange": exchange} and target["bound"]


def test_a_viewers_replay_and_a_form_without_its_token_are_refused(
    sqlite_url: str, tmp_path: Path
) -> None:
    ids = park(sqlite_url, [{"message_id": "one"}], NO_ROUTE)
    with signed_in(sqlite_url, tmp_path, "vera") as (console, chromium, page):
        page.goto(f"{console.url}/rows")
        assert page.locator("#replay-selected").count() == 0  # no such button for a viewer
        assert page.locator("#payload-hidden").count() == 0
        token = page.input_value("form.who input[name=csrf]")
        form: dict[str, str | float | bool] = {
            "csrf": token,
            "action": "replay",
            "id": str(ids[0]),
            "bound": "2100-01-01T00:00:00+00:00",
        }
        refused = page.request.post(f"{console.url}/act", form=form)
        assert refused.status == 403 and "needs the operator role" in refused.text()
        page.goto(f"{console.url}/rows/{ids[0]}")
        assert page.locator("#payload-hidden").count() == 1  # payloads hidden from viewers

        operator = chromium.page()
        chromium.context.clear_cookies()
        log_in(operator, console.url, "otto")
        without: dict[str, str | float | bool] = {k: v for k, v in form.items() if k != "csrf"}
        assert operator.request.post(f"{console.url}/act", form=without).status == 403
        forged: dict[str, str | float | bool] = {
            **form,
            "csrf": token,
        }  # the viewer's token, not this session's
        assert operator.request.post(f"{console.url}/act", form=forged).status == 403
        own = operator.input_value("form.who input[name=csrf]")
        future = operator.request.post(f"{console.url}/act", form={**form, "csrf": own})
        assert future.status == 400 and "later than the database" in future.text()
        assert chromium.dialogs == []
    assert statuses_of(sqlite_url, ids) == {ids[0]: "parked"}
    # Each attempt audited, with who and why (none changed a row).
    assert [(e.actor, e.action, e.rows, e.result) for e in audit_rows(sqlite_url)] == [
        (
            "vera",
            "replay",
            0,
            "refused at act (403): this needs the operator role; vera is a viewer",
        ),
        *[
            (
                "otto",
                "replay",
                0,
                "refused at act (403): the form's CSRF token is missing or not this session's",
            )
        ]
        * 2,
        (
            "otto",
            "replay",
            0,
            "refused at act (400): bound: later than the database's time; draw the page again",
        ),
    ]


def test_failed_logins_are_limited(sqlite_url: str, tmp_path: Path) -> None:
    env = console_env(
        sqlite_url,
        RELAY_CONSOLE_AUTH="users",
        RELAY_CONSOLE_USERS_FILE=str(users_file(tmp_path)),
        RELAY_CONSOLE_LOGIN_ATTEMPTS="3",
    )
    with ConsoleProcess(env, tmp_path / "console.log") as console, browser() as chromium:
        page = chromium.page()
        for _ in range(3):
            log_in(page, console.url, "otto", "wrong")
            assert page.inner_text("#login-error") == "wrong name or password"
        log_in(page, console.url, "otto")  # the right password, too late
        assert "too many failed logins" in page.inner_text("#refusal")
        log_in(page, console.url, "nobody-but-a-password", "wrong")
        log_in(page, console.url, "ada")  # another name keeps its attempts
    # The start, each refusal with its reason and the login logged; the name only if the file
    # has it, never a password.
    said = (tmp_path / "console.log").read_text()
    assert "[console_started] console serving on 127.0.0.1" in said
    refused = [line for line in said.splitlines() if "[console_login_failed]" in line]
    assert [line.split("refused (")[1].split(")")[0] for line in refused] == [
        *["password"] * 3,
        "limited",
        "password",
    ], refused
    assert "for otto from 127.0.0.1" in refused[0] and "for a name nobody has" in refused[-1]
    assert "wrong" not in said and "nobody-but-a-password" not in said
    assert "[console_login] console login: ada (admin) from 127.0.0.1" in said


def test_logins_sent_at_once_are_limited_and_oversized_ones_refused_unread(
    sqlite_url: str, tmp_path: Path
) -> None:
    env = console_env(
        sqlite_url,
        RELAY_CONSOLE_AUTH="users",
        RELAY_CONSOLE_USERS_FILE=str(users_file(tmp_path)),
        RELAY_CONSOLE_LOGIN_ATTEMPTS="3",
    )
    with ConsoleProcess(env, tmp_path / "console.log") as console:
        forms = [login_form(console.url) for _ in range(40)]
        go = threading.Barrier(len(forms))

        def guess(n: int) -> int:
            cookie, token = forms[n]
            go.wait()
            return post_login(console.url, cookie, token, "ada", f"guess-{n}")[0]

        with ThreadPoolExecutor(len(forms)) as pool:
            answers = list(pool.map(guess, range(len(forms))))
        # However many arrive together, no more than the limit are checked: the rest are
        # refused, as over the limit (429) or as more than the checks allowed at once (503).
        assert answers.count(401) <= 3 and set(answers) <= {401, 429, 503}
        for _ in range(4):  # one by one, then: the burst's checked ones counted among them
            cookie, token = login_form(console.url)
            answers.append(post_login(console.url, cookie, token, "ada", "again")[0])
        assert answers.count(401) == 3 and answers[-1] == 429
        cookie, token = login_form(console.url)
        assert post_login(console.url, cookie, token, "x" * 300, "wrong")[0] == 400
        assert announce(console.url, "/login", cookie, 8_000_000) == 413  # answered, none read


def test_a_logout_a_removed_user_a_new_role_or_password_end_what_old_cookies_could_do(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A session is bound to its user's entry in the users file: a logout, the user removed,
    made a viewer, or given a new password (an outside review: the old session went on with
    a new password, or after the user was removed and put back) ends what its cookie could
    do, at its next request; a user whose entry is as it was keeps theirs."""
    (row,) = park(sqlite_url, [{"message_id": "kept"}], NO_ROUTE)
    users = users_file(tmp_path)
    env = console_env(sqlite_url, RELAY_CONSOLE_AUTH="users", RELAY_CONSOLE_USERS_FILE=str(users))
    with ConsoleProcess(env, tmp_path / "console.log") as console, browser() as chromium:
        page = chromium.page()
        log_in(page, console.url, "otto")
        page.goto(f"{console.url}/rows/{row}")
        token = page.get_attribute("input[name=csrf]", "value") or ""
        bound = page.get_attribute("input[name=bound]", "value") or ""
        kept = session_cookie(chromium)
        replay = {"csrf": token, "action": "replay", "id": str(row), "bound": bound}
        follow(page, "form.who button[type=submit]")  # log out
        assert page.url == console.url + "/login"
        # The cookie and token copied before the logout: refused, as if never logged in.
        assert call(console.url, "GET", "/", kept)[0] == 303
        assert call(console.url, "POST", "/act", kept, {**replay, "confirmed": "1"})[0] == 401
        assert call(console.url, "POST", "/logout", kept, {"csrf": token})[0] == 303

        log_in(page, console.url, "vera")
        vera = session_cookie(chromium)
        log_in(page, console.url, "ada")
        ada = session_cookie(chromium)
        log_in(page, console.url, "otto")  # the browser's cookie is otto's now
        otto = session_cookie(chromium)
        page.goto(f"{console.url}/rows/{row}")
        replay["csrf"] = page.get_attribute("input[name=csrf]", "value") or ""
        assert call(console.url, "GET", "/", ada)[0] == 200
        assert call(console.url, "POST", "/confirm", otto, replay)[0] == 200
        assert call(console.url, "GET", "/", vera)[0] == 200
        # A change's form of 20 MB, a viewer's: answered at once, none read (it was parsed
        # whole on the event loop, 19 s and 1.5 GB, before the role was checked).
        assert announce(console.url, "/act", f"relay_console={vera}", 20_000_000) == 413
        # ada removed from the file, otto made a viewer, vera's password new: at their next
        # request. Their entries were all alike but for the names: each session is its own.
        lines = users.read_text().splitlines()
        fresh = hash_password("a new password")
        users.write_text(
            "".join(
                line.replace("otto:operator:", "otto:viewer:") + "\n"
                for line in lines
                if not line.startswith(("ada:", "vera:"))
            )
            + f"vera:viewer:{fresh}\n"
        )
        assert call(console.url, "GET", "/", ada)[0] == 303
        assert call(console.url, "GET", "/", vera)[0] == 303
        status, shown = call(console.url, "POST", "/act", otto, {**replay, "confirmed": "1"})
        assert status == 401 and "log in first" in shown
        assert call(console.url, "GET", "/", otto)[0] == 303
        # ada's entry put back as it was: the session its removal ended stays ended.
        users.write_text(users.read_text() + next(x for x in lines if x.startswith("ada:")) + "\n")
        assert call(console.url, "GET", "/", ada)[0] == 303
        log_in(page, console.url, "otto")  # as a viewer now
        page.goto(f"{console.url}/rows/{row}")
        assert page.locator("form.actions").count() == 0
        otto = session_cookie(chromium)
        assert call(console.url, "GET", "/", otto)[0] == 200  # an entry as it was: kept
    assert statuses_of(sqlite_url, [row]) == {row: "parked"}


def test_hostile_values_show_as_text_and_run_nothing(sqlite_url: str, tmp_path: Path) -> None:
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:  # bytes that are not UTF-8 in a message id, as SQLite keeps any
        conn.execute(
            sa.text(
                "INSERT INTO outbox (message_id, payload, status, last_error) "
                "VALUES (CAST(X'FF3C623E' AS TEXT), X'00FF3C7363726970743E', 'parked', :e)"
            ),
            {"e": IMG},
        )
    engine.dispose()
    big = park(sqlite_url, [{"message_id": "big", "payload": b"<b>" * 700_000}], NO_ROUTE)
    hostile = park(
        sqlite_url,
        [
            {
                "message_id": SCRIPT,
                "exchange": IMG,
                "routing_key": SCRIPT,
                "ordering_key": IMG,
                "headers": json.dumps({"x": SCRIPT}),
                "payload": SCRIPT.encode(),
            }
        ],
        SCRIPT,
    )
    with signed_in(sqlite_url, tmp_path, "otto") as (console, chromium, page):
        # Its cause, the quoted part left out: still text, not markup.
        assert "<script>alert('…')</script>" in page.inner_text("#causes")
        page.goto(f"{console.url}/rows")
        assert page.locator("#rows tbody tr").count() == 3
        page.goto(f"{console.url}/rows/{hostile[0]}")
        assert page.inner_text("#message-id") == SCRIPT
        assert page.inner_text("#last-error") == SCRIPT
        assert page.inner_text("#payload") == SCRIPT
        assert SCRIPT in page.inner_text("#headers")
        assert page.locator("img").count() == 0 and page.locator("main script").count() == 0
        shot(page, "hostile")
        page.goto(f"{console.url}/rows/{big[0]}")
        assert len(page.inner_text("#payload")) == 4096  # the preview, not 2 MB
        page.goto(f"{console.url}/rows?reason={IMG}")
        (row,) = page.locator("#rows tbody tr").all()
        assert "\ufffd<b>" in row.inner_text()  # the bytes that were not UTF-8, replaced
        page.goto(f"{console.url}/rows/{row.get_attribute('data-id')}")
        assert page.inner_text("#payload").startswith("00000000  00 ff 3c 73")  # hex, not text
        for metacharacters in ("' OR '1'='1", "%", "_", "\\", '"; DROP TABLE outbox; --'):
            page.goto(f"{console.url}/rows?exchange={quote(metacharacters)}")
            assert page.inner_text("#rows tbody") == "No parked row matches."
        page.goto(f"{console.url}/rows?exchange={quote(IMG)}")  # matched exactly, as text
        assert [r.get_attribute("data-id") for r in page.locator("#rows tbody tr").all()] == [
            str(hostile[0])
        ]
        assert chromium.dialogs == [] and chromium.errors == []
        nul = page.goto(f"{console.url}/rows?message_id=a%00b")
        assert nul is not None and nul.status == 400


def test_behind_a_trusted_proxy_its_headers_log_in_and_from_elsewhere_they_are_refused(
    sqlite_url: str, tmp_path: Path
) -> None:
    park(sqlite_url, [{"message_id": "one"}], NO_ROUTE)
    headers = {"X-Forwarded-User": "pat", "X-Forwarded-Groups": "staff,ops"}
    roles = {"RELAY_CONSOLE_VIEWER_GROUPS": "staff", "RELAY_CONSOLE_OPERATOR_GROUPS": "ops"}
    trusted = console_env(
        sqlite_url, RELAY_CONSOLE_AUTH="proxy", RELAY_CONSOLE_PROXY_ADDRESSES="127.0.0.1", **roles
    )
    with (
        ConsoleProcess(trusted, tmp_path / "trusted.log") as console,
        browser(extra_http_headers=headers) as chromium,
    ):
        page = chromium.page()
        page.goto(console.url + "/")
        assert page.inner_text("form.who span") == "pat (operator)"
    elsewhere = {**trusted, "RELAY_CONSOLE_PROXY_ADDRESSES": "10.255.0.1/32"}
    with (
        ConsoleProcess(elsewhere, tmp_path / "forged.log") as console,
        browser(extra_http_headers=headers) as chromium,
    ):
        page = chromium.page()
        answer = page.goto(console.url + "/")
        assert answer is not None and answer.status == 403
        assert "configured proxy only" in page.inner_text("#refusal")


@pytest.mark.parametrize("groups, role", [(["ops-admins"], "admin"), ([], None)])
def test_openid_connect_logs_in_with_the_providers_groups(
    postgresql_url: str, tmp_path: Path, groups: list[str], role: str | None
) -> None:
    with oidc_provider("irene", groups) as provider:
        port = free_port()
        env = console_env(
            postgresql_url,
            RELAY_CONSOLE_AUTH="oidc",
            RELAY_CONSOLE_OIDC_ISSUER=provider.issuer,
            RELAY_CONSOLE_OIDC_CLIENT_ID=CLIENT_ID,
            RELAY_CONSOLE_OIDC_CLIENT_SECRET=CLIENT_SECRET,
            RELAY_CONSOLE_URL=f"http://127.0.0.1:{port}",
            RELAY_CONSOLE_ADMIN_GROUPS="ops-admins",
        )
        console = ConsoleProcess(env, tmp_path / "console.log", port=port)
        with console, browser() as chromium:
            page = chromium.page()
            page.goto(console.url + "/")
            assert provider.issued == 1
            if role is None:
                assert "in none of the console's groups" in page.inner_text("#refusal")
            else:
                # The provider's subject, which the user cannot edit, beside their name.
                assert page.inner_text("form.who span") == f"irene (sub-irene) ({role})"
            assert chromium.dialogs == []


def test_an_admin_replays_an_edited_copy_and_each_row_names_the_other(
    sqlite_url: str, tmp_path: Path
) -> None:
    (original,) = park(
        sqlite_url,
        [{"message_id": "typo", "routing_key": "order.payed", "payload": b"{}"}],
        NO_ROUTE,
    )
    with signed_in(sqlite_url, tmp_path, "otto") as (console, chromium, page):
        page.goto(f"{console.url}/rows/{original}")
        assert page.locator("form.edit").count() == 0  # an operator may not edit
        chromium.context.clear_cookies()
        log_in(page, console.url, "ada")
        page.goto(f"{console.url}/rows/{original}")
        page.fill("form.edit input[name=routing_key]", "order.paid")
        follow(page, "form.edit button[type=submit]")
        assert page.inner_text("#status") == "pending"
        copy = int(page.url.rsplit("/", 1)[1])
        assert copy != original and page.inner_text("#message-id") != "typo"
        follow(page, f"text=row {original}")
        assert page.inner_text("#status") == "parked"
        assert page.locator(f"text=row {copy}").count() == 1
        assert chromium.dialogs == [] and chromium.errors == []
    assert statuses_of(sqlite_url, [original, copy]) == {original: "parked", copy: "pending"}
    (entry,) = audit_rows(sqlite_url)
    assert (entry.actor, entry.role, entry.action) == ("ada", "admin", "edit_and_replay")


def test_an_edit_keeps_the_bytes_of_every_field_the_admin_left_alone(
    sqlite_url: str, tmp_path: Path
) -> None:
    payloads = [b'{"a":1}\n{"b":2}\n', b"\nhello", b"a\rb", b"line  \n", b"crlf\r\nkept"]
    headers = '{"k": "v",\n "n": 1}'
    rows = park(
        sqlite_url,
        [
            {"message_id": f"e{n}", "exchange": "old", "payload": p, "headers": headers}
            for n, p in enumerate(payloads)
        ],
        NO_ROUTE,
    )
    copies = []
    with signed_in(sqlite_url, tmp_path, "ada") as (console, chromium, page):
        for row in rows:
            page.goto(f"{console.url}/rows/{row}")
            page.fill("form.edit input[name=exchange]", "fixed")
            follow(page, "form.edit button[type=submit]")
            copies.append(int(page.url.rsplit("/", 1)[1]))
        page.goto(f"{console.url}/rows/{rows[0]}")  # the payload edited: its line breaks as LF
        page.fill("form.edit textarea[name=payload]", '{"a":2}\n{"b":3}\n')
        follow(page, "form.edit button[type=submit]")
        copies.append(int(page.url.rsplit("/", 1)[1]))
        assert chromium.dialogs == [] and chromium.errors == []
    stored = rows_of(sqlite_url, copies)
    for copy, payload in zip(copies, payloads, strict=False):
        assert stored[copy] == ("fixed", payload, headers)
    assert stored[copies[-1]] == ("old", b'{"a":2}\n{"b":3}\n', headers)
    changed = [json.loads(e.target)["changed"] for e in audit_rows(sqlite_url)]
    assert changed == [["exchange"]] * len(payloads) + [["payload"]]


def rows_of(url: str, ids: list[int]) -> dict[int, tuple[str, bytes, str | None]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.select(outbox.c.id, outbox.c.exchange, outbox.c.payload, outbox.c.headers).where(
                    outbox.c.id.in_(ids)
                )
            )
            return {int(i): (e, bytes(p), h) for i, e, p, h in found}
    finally:
        engine.dispose()


def test_errors_carry_the_security_headers_and_nothing_redirects_to_the_host_header(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A broker that does not answer is a page (503) with the headers every page has; a
    trailing slash is not redirected to wherever the Host header says; a proxy's identity
    header sent twice is refused."""
    queue = "orders"
    env = console_env(
        sqlite_url,
        RELAY_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F",  # nothing listens
        RELAY_CONSOLE_AUTH="proxy",
        RELAY_CONSOLE_PROXY_ADDRESSES="127.0.0.1",
        RELAY_CONSOLE_VIEWER_GROUPS="staff",
        RELAY_CONSOLE_INBOX_QUEUES=queue,
    )
    with ConsoleProcess(env, tmp_path / "console.log") as console:
        who = [("X-Forwarded-User", "pat"), ("X-Forwarded-Groups", "staff")]
        status, headers, _page = raw(console.url, f"/inbox/{queue}", who)
        assert status == 503
        assert headers["content-security-policy"].startswith("default-src 'none'")
        assert headers["x-frame-options"] == "DENY" and headers["cache-control"] == "no-store"
        status, headers, _page = raw(console.url, "/rows/", [*who, ("Host", "evil.example")])
        assert status == 404 and "location" not in headers
        twice = [*who, ("X-Forwarded-User", "admin")]
        status, _headers, page = raw(console.url, "/", twice)
        assert status == 400 and "sent more than once" in page


def raw(base: str, path: str, headers: list[tuple[str, str]]) -> tuple[int, dict[str, str], str]:
    """A GET with exactly ``headers`` (repeated ones as sent): status, headers, page."""
    connection = http.client.HTTPConnection(urlsplit(base).netloc, timeout=120)
    try:
        connection.putrequest("GET", path, skip_host=any(n == "Host" for n, _ in headers))
        for name, value in headers:
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        found = {name.lower(): value for name, value in answer.getheaders()}
        return answer.status, found, answer.read().decode()
    finally:
        connection.close()


def test_ids_and_ages_past_what_a_row_can_hold_are_bad_input_not_a_failure(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A row id past 64 bits (in the path, a form, a page's cursor), a digit that is not
    ASCII, an age of more days than any date holds: each a 400 that says which field, never
    the 500 and traceback they were (an outside review)."""
    (row,) = park(sqlite_url, [{"message_id": "m"}], NO_ROUTE)
    users = users_file(tmp_path)
    env = console_env(sqlite_url, RELAY_CONSOLE_AUTH="users", RELAY_CONSOLE_USERS_FILE=str(users))
    with ConsoleProcess(env, tmp_path / "console.log") as console, browser() as chromium:
        page = chromium.page()
        log_in(page, console.url, "ada")
        cookie = session_cookie(chromium)
        huge = str(2**64)
        for path, field in [
            (f"/rows/{huge}", "id"),
            (f"/archive?after={huge}", "after"),
            ("/audit?after=%C2%B2", "after"),  # a superscript two: a digit, not an id
            (f"/rows?after_t=2026-01-01T00:00:00%2B00:00&after_id={huge}", "after_id"),
            ("/rows?parked_for=99999999999999999999d", "parked_for"),
        ]:
            status, shown = call(console.url, "GET", path, cookie)
            assert (status, field in shown) == (400, True), (path, status, shown[-300:])
        status, _ = call(console.url, "GET", f"/rows/{2**63 - 1}", cookie)
        assert status == 404
        assert call(console.url, "GET", f"/rows/{row}", cookie)[0] == 200
        assert "Traceback" not in (tmp_path / "console.log").read_text()
