"""The relay's database sessions are bounded on the server and kept alive on both ends.

What they bound is shown by the fault scenarios (a relay frozen inside its turn: its
transaction ended, its buckets taken over); this holds each session to the constants, on the
socket the driver really uses."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
import sqlalchemy as sa

from relay.constants import (
    DB_IDLE_IN_TRANSACTION_S,
    DB_KEEPALIVE_COUNT,
    DB_KEEPALIVE_IDLE_S,
    DB_KEEPALIVE_INTERVAL_S,
    DB_LOCK_TIMEOUT_MS,
    DB_STATEMENT_TIMEOUT_MS,
    DB_TCP_USER_TIMEOUT_S,
)
from relay.db.engine import create_engine

pytestmark = pytest.mark.databases("postgresql", "mariadb")

KEPT_ALIVE = {
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE): 1,
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE): DB_KEEPALIVE_IDLE_S,
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL): DB_KEEPALIVE_INTERVAL_S,
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT): DB_KEEPALIVE_COUNT,
    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT): DB_TCP_USER_TIMEOUT_S * 1000,
}


def _socket_options(fd: int) -> dict[tuple[int, int], int]:
    with socket.socket(fileno=os.dup(fd)) as sock:
        return {option: sock.getsockopt(*option) for option in KEPT_ALIVE}


def _session(conn: sa.Connection) -> tuple[dict[str, Any], int]:
    """The session's limits as the server reports them, and the driver's socket."""
    raw: Any = conn.connection.dbapi_connection
    names: tuple[str, ...]
    if conn.dialect.name == "postgresql":
        names = (
            "statement_timeout",
            "lock_timeout",
            "idle_in_transaction_session_timeout",
            "tcp_keepalives_idle",
            "tcp_keepalives_interval",
            "tcp_keepalives_count",
        )
        shown = {n: conn.scalar(sa.text(f"SELECT current_setting('{n}')")) for n in names}
        return shown, raw.pgconn.socket
    names = (
        "max_statement_time",
        "innodb_lock_wait_timeout",
        "lock_wait_timeout",
        "idle_transaction_timeout",
    )
    values = conn.execute(sa.text(f"SELECT @@{', @@'.join(names)}")).one()
    shown = dict(zip(names, values, strict=True))
    return shown, raw.fileno()


def test_the_relays_sessions_are_bounded_and_kept_alive(database_url: str) -> None:
    engine = create_engine(database_url, relay_session=True)
    try:
        with engine.connect() as conn:
            shown, fd = _session(conn)
            assert _socket_options(fd) == KEPT_ALIVE
    finally:
        engine.dispose()
    if engine.dialect.name == "postgresql":
        assert shown == {
            "statement_timeout": f"{DB_STATEMENT_TIMEOUT_MS // 1000}s",
            "lock_timeout": f"{DB_LOCK_TIMEOUT_MS // 1000}s",
            "idle_in_transaction_session_timeout": f"{DB_IDLE_IN_TRANSACTION_S}s",
            "tcp_keepalives_idle": str(DB_KEEPALIVE_IDLE_S),
            "tcp_keepalives_interval": str(DB_KEEPALIVE_INTERVAL_S),
            "tcp_keepalives_count": str(DB_KEEPALIVE_COUNT),
        }
    else:
        assert shown == {
            "max_statement_time": DB_STATEMENT_TIMEOUT_MS / 1000,
            "innodb_lock_wait_timeout": DB_LOCK_TIMEOUT_MS // 1000,
            "lock_wait_timeout": DB_LOCK_TIMEOUT_MS // 1000,
            "idle_transaction_timeout": DB_IDLE_IN_TRANSACTION_S,
        }


def test_writers_sessions_are_left_as_the_server_sets_them(database_url: str) -> None:
    """Bounds are the relay's own: a writer's long transaction is the writer's business."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            shown, _ = _session(conn)
    finally:
        engine.dispose()
    idle = shown.get("idle_in_transaction_session_timeout", shown.get("idle_transaction_timeout"))
    assert idle in ("0", 0)
