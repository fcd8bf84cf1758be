"""Run an in-process relay against the real servers and wait for conditions on the outbox."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from relay.cli import Assembled, assemble
from relay.records import NewMessage
from relay.relay import utcnow
from relay.schema import outbox
from relay.settings import Settings
from relay.topology import Topology

FAST = {
    "poll_interval": "0.05",
    "backoff_initial": "0.05",
    "backoff_max": "0.2",
    "reconnect_max": "1",
    "stats_interval": "0.2",
    "metrics_port": "0",
}


def settings(database_url: str, amqp_url: str, **overrides: Any) -> Settings:
    values = {**FAST, "database_url": database_url, "amqp_url": amqp_url}
    values.update({k: str(v) for k, v in overrides.items()})
    return Settings.load({}, values)


def rows_by_status(parts: Assembled) -> dict[str, int]:
    with parts.store.engine.connect() as conn:
        q = sa.select(outbox.c.status, sa.func.count()).group_by(outbox.c.status)
        return {status: count for status, count in conn.execute(q)}


def table(parts: Assembled) -> list[Any]:
    with parts.store.engine.connect() as conn:
        return list(conn.execute(sa.select(outbox).order_by(outbox.c.id)))


def enqueue(parts: Assembled, messages: list[NewMessage]) -> list[str]:
    return parts.store.enqueue(messages, utcnow())


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


class Running:
    """``async with Running(settings, topology) as parts``: a relay task for the block."""

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self.drained: bool | None = None

    async def __aenter__(self) -> Assembled:
        self.parts = assemble(self.settings, self.topology)
        self.task = asyncio.create_task(self.parts.relay.run())
        return self.parts

    async def __aexit__(self, *exc: object) -> None:
        self.parts.relay.stop()
        self.drained = await asyncio.wait_for(self.task, 60)
        self.parts.store.close()
