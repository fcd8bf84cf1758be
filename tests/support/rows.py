"""Builders for rows and messages used across the test layers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from relay.records import OutboxRow
from relay.spark.rows import Chunk


def row(id: int, **fields: Any) -> OutboxRow:
    """A claimed row with plain values (message id ``m-<id>``); ``fields`` override them."""
    plain = OutboxRow(
        id=id,
        message_id=f"m-{id}",
        exchange="ex",
        routing_key="rk",
        payload=b"p",
        content_type="text/plain",
        headers=None,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        attempts=0,
    )
    return plain._replace(**fields)


def sink_chunk(message_ids: list[str]) -> Chunk:
    """The rows of ``message_ids`` as the Spark writer hands them to the sink."""
    body = pa.array([b"body"] * len(message_ids), pa.binary())
    columns = (pa.array(message_ids), "ex", "rk", body, "application/octet-stream", None, None)
    return Chunk(len(message_ids), columns)
