"""The two RabbitMQ versions the integration and fault suites run against."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import debian13
from devtools.servers import RabbitCluster, RabbitNode

RABBITMQ_3 = "rabbitmq3.10"  # Debian 12's package
RABBITMQ_4 = "rabbitmq4.0"  # Debian 13's package, in its own root
RABBITMQ_VERSIONS = (RABBITMQ_3, RABBITMQ_4)


def _root(version: str) -> Path | None:
    """Where ``version`` is installed (None: on this machine); the 4.0 one fails the test,
    saying why, where it cannot run (a skip would pass a suite that never ran it)."""
    if version == RABBITMQ_3:
        return None
    reason = debian13.unavailable()
    if reason is not None:
        pytest.fail(f"RabbitMQ 4.0 layer: {reason}")
    return debian13.ensure_root()


def rabbit_node(
    version: str,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    config: str = "",
    *,
    management: bool = False,
) -> RabbitNode:
    """A node (not started) of ``version``; with ``management``, its HTTP API."""
    root = _root(version)
    return RabbitNode(
        tmp_path_factory.mktemp(name), name=name, config=config, root=root, management=management
    )


def rabbit_cluster(
    version: str, tmp_path_factory: pytest.TempPathFactory, name: str
) -> RabbitCluster:
    """Three nodes (not started) of ``version``."""
    root = _root(version)
    return RabbitCluster(tmp_path_factory.mktemp(name), name=name, root=root)


def running(node: RabbitNode) -> Iterator[RabbitNode]:
    """``node``, started, for a fixture to yield from; stopped after."""
    node.start()
    yield node
    node.stop()
