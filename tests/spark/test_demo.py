"""The README's first command, minus installing: the demo's Spark job, relay and inbox
consumer."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.servers import RabbitNode
from examples.demo import run_demo

# A Spark job and a relay of its own, started in the test: as long as a driver may take.
pytestmark = pytest.mark.timeout(900)


def test_the_demo_relays_every_message_its_spark_job_wrote(
    rabbit: RabbitNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_demo(rabbit.url, 2, tmp_path) == 0
    out = capsys.readouterr().out
    assert "6 new messages in the outbox" in out  # 2 orders, 3 events each
    assert out.count(" sent ") == 6
    assert "All 6 messages were confirmed by the broker, marked sent, and consumed once." in out
    # Each order's three events counted once, though every message was delivered twice.
    assert out.count(": 3 events, paid ") == 2
