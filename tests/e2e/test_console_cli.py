"""`relay console` as users run it: closed by default (exit 2 with one line, before it
listens), and `relay console hash-password` for a users file."""

from __future__ import annotations

import secrets
from pathlib import Path

from devtools.relayproc import relay, relay_env
from relay.console.passwords import verify_password


def test_the_console_refuses_to_start_without_an_authentication_mode(sqlite_url: str) -> None:
    done = relay("console", env=relay_env(RELAY_DATABASE_URL=sqlite_url), timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "relay: error: RELAY_CONSOLE_AUTH is not set: the console needs one of oidc, proxy, users"
    ]


def test_the_console_refuses_a_mode_without_what_it_needs(sqlite_url: str, tmp_path: Path) -> None:
    env = relay_env(
        RELAY_DATABASE_URL=sqlite_url,
        RELAY_CONSOLE_AUTH="users",
        RELAY_CONSOLE_SESSION_SECRET=secrets.token_urlsafe(48),
        RELAY_CONSOLE_USERS_FILE=str(tmp_path / "missing"),
    )
    done = relay("console", env=env, timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "RELAY_CONSOLE_USERS_FILE=" in done.stderr and "cannot read" in done.stderr
    short = relay("console", env={**env, "RELAY_CONSOLE_SESSION_SECRET": "short"}, timeout=60)
    assert short.returncode == 2 and "at least 32 characters" in short.stderr
    assert "short" not in short.stderr.replace("at least", "")  # the secret itself is never said


def test_hash_password_prints_a_hash_of_the_password_read() -> None:
    done = relay("console", "hash-password", env=relay_env(), input="s3cret pass\n", timeout=60)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert verify_password("s3cret pass", line) and not verify_password("s3cret", line)


def test_the_console_lists_its_settings_in_its_help() -> None:
    done = relay("console", "--help", env=relay_env(), timeout=60)
    assert done.returncode == 0
    for option in ("--console-auth", "--console-proxy-addresses", "[RELAY_CONSOLE_SESSION_SECRET]"):
        assert option in done.stdout
