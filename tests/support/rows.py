"""Builders for rows and messages used across the test layers."""

from __future__ import annotations

from datetime import UTC, datetime

from relay.records import OutboxRow


def row(
    id: int,
    *,
    exchange: str = "ex",
    attempts: int = 0,
    payload: bytes = b"p",
    headers: str | None = None,
    last_error: str | None = None,
) -> OutboxRow:
    return OutboxRow(
        id=id,
        message_id=f"m-{id}",
        exchange=exchange,
        routing_key="rk",
        payload=payload,
        content_type="text/plain",
        headers=headers,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        attempts=attempts,
        last_error=last_error,
    )
