"""Topology files: a good file parses; every mistake is one clear error naming its place."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.broker.topology import load_topology
from relay.errors import ConfigError

GOOD = """
[[exchange]]
name = "orders"
type = "topic"
alternate_exchange = "orders.unrouted"

[[exchange]]
name = "orders.unrouted"
type = "fanout"

[[queue]]
name = "orders.created"
arguments = { "x-max-length" = 10, "x-overflow" = "reject-publish" }

[[queue]]
name = "orders.audit"
arguments = { "x-queue-type" = "quorum", "x-delivery-limit" = 20, "x-quorum-initial-group-size" = 1}

[[binding]]
exchange = "orders"
queue = "orders.created"
routing_key = "order.*"
"""


def test_good_file(tmp_path: Path) -> None:
    path = tmp_path / "topology.toml"
    path.write_text(GOOD)
    topology = load_topology(path)
    orders = topology.exchanges[0]
    assert orders.declare_arguments() == {"alternate-exchange": "orders.unrouted"}
    assert topology.queues[0].arguments["x-overflow"] == "reject-publish"
    assert topology.bindings[0].routing_key == "order.*"
    assert topology.queues[1].arguments["x-queue-type"] == "quorum"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[exchange]]\nnmae = 'x'\n", "exchange[0]: unknown key 'nmae'"),
        ("[[exchange]]\nname = 'x'\ntype = 'round-robin'\n", "type must be one of"),
        ("[[queue]]\nname = 'q'\ndurable = 'yes'\n", "queue[0]: durable must be a bool"),
        ("[[queue]]\ndurable = true\n", "queue[0]: name is required"),
        ("[[binding]]\nexchange = 'x'\nqueue = 'q'\n", "binding[0]: queue 'q' is not declared"),
        ("[exchanges]\nname = 'x'\n", "unknown section 'exchanges'"),
        ("exchange = 'x'\n", "exchange must be an array of tables"),
        ("[[exchange]\n", "not valid TOML"),
        (
            "[[queue]]\nname = 'q'\narguments = { 'x-queue-type' = 'qourum' }\n",
            "queue[0] 'q': x-queue-type must be one of classic, quorum, stream",
        ),
        (
            "[[queue]]\nname = 'q'\ndurable = false\narguments = { 'x-queue-type' = 'quorum' }\n",
            "queue[0] 'q': a quorum queue must be durable and not auto_delete",
        ),
        (
            "[[queue]]\nname = 'q'\narguments = { 'x-queue-type' = 'quorum', "
            "'x-delivery-limit' = 0 }\n",
            "queue[0] 'q': x-delivery-limit must be a whole number of at least 1",
        ),
        (
            "[[queue]]\nname = 'q'\narguments = { 'x-quorum-initial-group-size' = '3' }\n",
            "x-quorum-initial-group-size must be a whole number of at least 1",
        ),
    ],
)
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "topology.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_topology(path)
