"""An in-process relay against the real servers, and waiting for conditions on the outbox."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from devtools.outbox import rows, statuses
from relay.broker.topology import Topology
from relay.daemon import assemble
from relay.db.claims import ClaimStore
from relay.db.outbox import OutboxWriter
from relay.metrics import Metrics
from relay.records import NewMessage
from relay.relay import Relay
from relay.settings import Settings
from relay.tracing import NoTracing

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


@dataclass(frozen=True)
class Parts:
    """What a test holds while an in-process relay runs."""

    relay: Relay
    store: ClaimStore
    metrics: Metrics
    writer: OutboxWriter


def rows_by_status(parts: Parts) -> dict[str, int]:
    return statuses(parts.writer.engine)


def table(parts: Parts) -> list[Any]:
    return rows(parts.writer.engine)


def enqueue(parts: Parts, messages: Sequence[NewMessage]) -> list[str]:
    return parts.writer.enqueue(messages)


def logged(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    """The records ``caplog`` holds that carry this ``action`` (the relay's log lines each
    carry one)."""
    return [record for record in caplog.records if getattr(record, "action", "") == action]


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """``devtools.servers.wait_until`` for a test's event loop (the condition in a thread):
    fails once a look begun after ``timeout`` seconds finds it false."""
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        if await asyncio.to_thread(condition):
            return
        if began > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


class Running:
    """``async with Running(settings, topology) as parts``: a relay task for the block."""

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self.drained: bool | None = None

    async def __aenter__(self) -> Parts:
        built = assemble(self.settings, self.topology, NoTracing())
        writer = OutboxWriter(self.settings.database_url)
        self.parts = Parts(built.relay, built.store, built.metrics, writer)
        self.task = asyncio.create_task(self.parts.relay.run())
        return self.parts

    async def __aexit__(self, *exc: object) -> None:
        self.parts.relay.stop()
        self.drained = await asyncio.wait_for(self.task, 60)
        self.parts.store.close()
        self.parts.writer.close()
