"""A broken destination costs a few log lines, not a connection storm, and stalls nothing:
6,000 rows to a missing exchange interleaved with 6,000 good ones, through `relay run` on
one RabbitMQ node (the three-node cluster's case is in tests/cluster/test_rabbitmq_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.servers import PostgresServer, RabbitNode
from tests.support.destinations import check

pytestmark = pytest.mark.timeout(300)


def test_a_missing_exchange_parks_its_rows_and_the_good_rows_flow(
    tmp_path: Path, postgres: PostgresServer, rabbit: RabbitNode
) -> None:
    check(tmp_path, rabbit.url, postgres)
