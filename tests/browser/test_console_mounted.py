"""The console mounted in a host ASGI application under a path of its own: its links, forms
and cookies follow the mount's path."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from devtools.servers import free_port, port_open, wait_until
from relay.console.app import create_app, load_console
from relay.errors import ConfigError
from relay.settings import ConsoleSettings, Settings
from tests.support.console import SECRET, browser, follow, log_in, park, users_file


def test_the_console_mounted_under_a_path_serves_its_pages_there(
    sqlite_url: str, tmp_path: Path
) -> None:
    park(sqlite_url, [{"message_id": "mounted"}], "nacked")
    config = ConsoleSettings.load(
        {
            "RELAY_CONSOLE_AUTH": "users",
            "RELAY_CONSOLE_USERS_FILE": str(users_file(tmp_path)),
            "RELAY_CONSOLE_SESSION_SECRET": SECRET,
        }
    )
    console = create_app(load_console(Settings.load({"RELAY_DATABASE_URL": sqlite_url}), config))
    host = Starlette(
        routes=[
            Route("/", lambda _request: PlainTextResponse("the host's own page")),
            Mount("/ops/outbox", app=console),
        ]
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(host, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: port_open("127.0.0.1", port), 30, "the host application")
        base = f"http://127.0.0.1:{port}/ops/outbox"
        with browser() as chromium:
            page = chromium.page()
            page.goto(base + "/")
            assert page.url == base + "/login"
            log_in(page, base, "vera")
            assert page.url == base + "/"
            follow(page, "text=Parked rows")
            assert page.url == base + "/rows"
            assert page.locator("#rows tbody tr").count() == 1
            cookies = {c["name"]: c for c in chromium.context.cookies()}
            assert cookies["relay_console"]["path"] == "/ops/outbox"
            assert cookies["relay_console"]["secure"] and cookies["relay_console"]["httpOnly"]
            assert chromium.dialogs == [] and chromium.errors == []
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_proxy_mode_refuses_to_be_mounted(sqlite_url: str) -> None:
    """Mounted, the console cannot see the transport peer (a host's uvicorn, with its default
    proxy headers, puts a client's ``X-Forwarded-For`` in its place: an outside review was
    admin from anywhere so), and proxy mode believes identity headers by that address: it
    is refused, with the modes that work mounted."""
    config = ConsoleSettings.load(
        {
            "RELAY_CONSOLE_AUTH": "proxy",
            "RELAY_CONSOLE_PROXY_ADDRESSES": "127.0.0.1",
            "RELAY_CONSOLE_SESSION_SECRET": SECRET,
        }
    )
    console = load_console(Settings.load({"RELAY_DATABASE_URL": sqlite_url}), config)
    try:
        with pytest.raises(ConfigError, match=r"relay console` only.*use oidc or users"):
            create_app(console)
    finally:
        console.reads.close()
        console.actions.close()
