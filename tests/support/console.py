"""The console's tests' helpers: parked rows made as the relay parks them, a users file,
`relay console` as a subprocess, and Debian's chromium driven by Playwright (never a browser
of its own), recording every dialog and console error a page raises."""

from __future__ import annotations

import http.client
import re
import secrets
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from playwright.sync_api import BrowserContext, Dialog, Page, sync_playwright

from devtools.relayproc import no_leaks, relay_env, with_warnings
from devtools.servers import free_port, port_open, wait_until
from relay.causes import stored_cause
from relay.console.passwords import hash_password
from relay.console_constants import CONSOLE_SETTLE_HORIZON_S
from relay.db.clock import database_time
from relay.db.schema import outbox
from relay.records import PARKED

CHROMIUM = "/usr/bin/chromium"
# Headless chromium as root in a container: no sandbox, no GPU, nothing fetched behind the
# test's back (QUIC, component updates, sync, background requests).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A key made at each run: a key written here would be published (and refused).
SECRET = secrets.token_urlsafe(48)
PASSWORD = "correct horse battery staple"
USERS = {"vera": "viewer", "otto": "operator", "ada": "admin"}
# Hostile text: markup and script where a page shows values.
SCRIPT = "<script>alert('xss')</script>"
IMG = '"><img src=x onerror=alert(1)>'
# Parked long enough before a page for a change by filter to take (CONSOLE_SETTLE_HORIZON_S).
SETTLED = 2 * CONSOLE_SETTLE_HORIZON_S


def users_file(directory: Path) -> Path:
    """A users file: a viewer, an operator and an admin, all with ``PASSWORD``."""
    path = directory / "users"
    hashed = hash_password(PASSWORD)
    path.write_text("".join(f"{name}:{role}:{hashed}\n" for name, role in USERS.items()))
    return path


def park(url: str, rows: list[dict[str, Any]], reason: str, ago: float = 0) -> list[int]:
    """``rows`` inserted and parked as the relay parks them (``last_error`` the reason and
    ``cause`` its cause, the parking time the database's now, or ``ago`` seconds before it);
    their ids."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            ids = []
            for row in rows:
                values = {"exchange": "", "routing_key": "", "payload": b"x", **row}
                inserted = conn.execute(sa.insert(outbox).values(values))
                key = inserted.inserted_primary_key
                assert key is not None
                ids.append(int(key[0]))
            conn.execute(
                sa.update(outbox)
                .where(outbox.c.id.in_(ids))
                .values(
                    status=PARKED,
                    attempts=10,
                    last_error=reason,
                    cause=stored_cause(reason),
                    next_attempt_at=database_time(-ago),
                )
            )
        return ids
    finally:
        engine.dispose()


def statuses_of(url: str, ids: list[int]) -> dict[int, str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.select(outbox.c.id, outbox.c.status).where(outbox.c.id.in_(ids))
            )
            return {int(i): s for i, s in found}
    finally:
        engine.dispose()


@dataclass
class ConsoleProcess:
    """`relay console` on a free port of 127.0.0.1, with exactly the settings given."""

    env: dict[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ConsoleProcess:
        env = with_warnings(
            relay_env(
                **{
                    "RELAY_CONSOLE_PORT": str(self.port),
                    "RELAY_CONSOLE_METRICS_PORT": "0",
                    **self.env,
                }
            )
        )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relay", "console"], env=env, stderr=log
            )
        wait_until(
            lambda: port_open("127.0.0.1", self.port) or self.proc.poll() is not None,  # type: ignore[union-attr]
            60,
            "the console listening",
        )
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        """Stopped; on a clean exit, an AssertionError if it left resources unclosed."""
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if exc_type is None:
            no_leaks(["relay", "console"], self.log.read_text())


def console_env(database_url: str, **more: str) -> dict[str, str]:
    return {
        "RELAY_DATABASE_URL": database_url,
        "RELAY_CONSOLE_SESSION_SECRET": SECRET,
        **more,
    }


@dataclass
class Browser:
    """A headless chromium, every dialog it opened (dismissed) and console error it saw."""

    context: BrowserContext
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def page(self) -> Page:
        page = self.context.new_page()

        def dialog(opened: Dialog) -> None:
            self.dialogs.append(opened.message)
            opened.dismiss()

        page.on("dialog", dialog)
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        return page


@contextmanager
def browser(**context: Any) -> Iterator[Browser]:
    """Debian's chromium in a new, empty profile."""
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        launched = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True, **context
        )
        try:
            yield Browser(launched)
        finally:
            launched.close()


@contextmanager
def signed_in(
    database_url: str, tmp_path: Path, name: str, **more: str
) -> Iterator[tuple[ConsoleProcess, Browser, Page]]:
    """A console whose users are ``users_file``'s (``more``: its other settings), and a
    browser page logged in to it as ``name``."""
    env = console_env(
        database_url,
        RELAY_CONSOLE_AUTH="users",
        RELAY_CONSOLE_USERS_FILE=str(users_file(tmp_path)),
        **more,
    )
    with ConsoleProcess(env, tmp_path / "console.log") as console, browser() as chromium:
        page = chromium.page()
        log_in(page, console.url, name)
        yield console, chromium, page


def log_in(page: Page, base: str, name: str, password: str = PASSWORD) -> None:
    page.goto(base + "/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", password)
    follow(page, "form.login button[type=submit]")


def follow(page: Page, selector: str) -> None:
    """A click on a link or a form's button, and the page it leads to loaded: Playwright's
    click waits only for the navigation to start, and a locator's count() does not wait, so
    a count right after a bare click can read a document not yet parsed (seen in CI)."""
    page.click(selector)
    page.wait_for_load_state()


def login_form(base: str) -> tuple[str, str]:
    """A login form's state cookie and CSRF token, as a browser gets them."""
    with urllib.request.urlopen(base + "/login", timeout=60) as answer:
        cookie = answer.headers["Set-Cookie"].split(";")[0]
        page = answer.read().decode()
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return cookie, found[1]


def post_login(base: str, cookie: str, token: str, name: str, password: str) -> tuple[int, str]:
    """The login form posted with ``name`` and ``password``: the status and the page."""
    body = urllib.parse.urlencode({"csrf": token, "name": name, "password": password}).encode()
    request = urllib.request.Request(
        base + "/login",
        data=body,
        headers={"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def announce(base: str, path: str, cookie: str, length: int) -> int:
    """A form posted to ``path`` whose headers say its body is ``length`` bytes, none sent:
    the status. ``cookie``: the Cookie header."""
    connection = http.client.HTTPConnection(urllib.parse.urlsplit(base).netloc, timeout=60)
    try:
        connection.putrequest("POST", path)
        connection.putheader("Cookie", cookie)
        connection.putheader("Content-Type", "application/x-www-form-urlencoded")
        connection.putheader("Content-Length", str(length))
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def call(
    base: str, method: str, path: str, cookie: str, fields: dict[str, str] | None = None
) -> tuple[int, str]:
    """One request with the session cookie ``cookie`` (its value), redirects not followed:
    the status and the page."""
    connection = http.client.HTTPConnection(urllib.parse.urlsplit(base).netloc, timeout=120)
    headers = {"Cookie": f"relay_console={cookie}"}
    body = None
    if fields is not None:
        body = urllib.parse.urlencode(fields)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def session_cookie(chromium: Browser) -> str:
    """The value of the browser's console session cookie."""
    (cookie,) = [c for c in chromium.context.cookies() if c["name"] == "relay_console"]
    return str(cookie["value"])
