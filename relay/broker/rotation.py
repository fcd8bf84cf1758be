"""An inbox consumer's way through the broker's nodes: the next node after each session that
failed, after a back-off that grows with the failures in a row. Pure: the blocking consumer
and the asyncio one (``consumer``, ``aio_consumer``) each run their sessions through it, and
the publisher's connector (``connection.Connector``) keeps its own, which tries every node
within one connect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

from relay.backoff import Backoff

Node = TypeVar("Node")


class Rotation(Generic[Node]):
    """The node to consume from next, and how long to wait before."""

    def __init__(self, nodes: Sequence[Node], backoff: Backoff) -> None:
        if not nodes:
            raise ValueError("a rotation needs a node")
        self._nodes = nodes
        self._backoff = backoff
        self._at = 0
        self.failures = 0  # sessions failed in a row

    @property
    def node(self) -> Node:
        return self._nodes[self._at]

    def worked(self) -> None:
        """A session ended without failing (the consumer was stopped)."""
        self.failures = 0

    def failed(self) -> float:
        """A session on ``node`` failed: the next node's turn; returns the seconds to wait."""
        self.failures += 1
        self._at = (self._at + 1) % len(self._nodes)
        return self._backoff.delay(self.failures)
