"""Faults on a three-node RabbitMQ cluster with a quorum queue (three replicas).

The relays get every node's address (``RELAY_AMQP_URL`` as a list) and use one at a time;
the harness is the fault suite's (tests/faults/harness.py): writers write throughout, and
each scenario ends with 0 lost, 0 unknown, duplicates within the window per fault, every
row sent, no traceback, and one JSON line with rows, duplicates and the recovery time.
The recovery time is measured from the fault itself where the relay must find its way
while the node is gone (c1, c2), and from the restore otherwise. Run alone with
``scripts/test -m cluster``.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from devtools.outbox import statuses
from devtools.servers import (
    CLI_TIMEOUT_S,
    PostgresServer,
    RabbitCluster,
    RabbitNode,
    port_open,
)
from tests.faults.harness import QUEUE, WINDOW, Fault, FaultRelay, metrics_text, scenario
from tests.support.destinations import check
from tests.support.rabbitmq import RABBITMQ_4, rabbit_cluster

# One process runs them all (tests/support/schedule.py's ONE_PROCESS): the cluster is
# started once, not in every process that draws one of its tests. The limit catches a hang,
# not a slow machine: each node's stop, start and CLI run has a bound of its own, and a
# rolling restart is three node starts and six CLI runs (an Erlang VM each), which beside a
# CPU hog (devtools.burn) took past the 240 s this limit was (34 to 45 s alone).
pytestmark = pytest.mark.timeout(900)
QUORUM: dict[str, object] = {"x-queue-type": "quorum"}
# 4.0 only: a cluster takes about 20 s to start and these scenarios a few minutes, and the
# release production clusters run is 4.x (3.10's single node runs the whole fault suite).
CLUSTER_VERSIONS = (RABBITMQ_4,)
OUTAGE_S = 6.0  # longer than the fault relays' confirm timeout (2 s)
REJOIN_TIMEOUT_S = "90"


@pytest.fixture(scope="module", params=CLUSTER_VERSIONS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RabbitCluster]:
    nodes = rabbit_cluster(request.param, tmp_path_factory, "relay-cluster")
    nodes.start()
    yield nodes
    nodes.kill()


@pytest.fixture
def fresh_cluster(cluster: RabbitCluster) -> RabbitCluster:
    """Every node up and in the cluster, without the scenario queue."""
    for node in cluster.nodes:
        if not node.running:
            node.start()
        node.signal(signal.SIGCONT)
        # Its AMQP listener is closed while its app is stopped (a scenario that stopped it
        # ended early): a look at the port spares a CLI run (seconds, in the Debian root).
        if not port_open("127.0.0.1", node.port):
            node.ctl("start_app")
    with pika.BlockingConnection(pika.URLParameters(cluster.nodes[0].url)) as conn:
        conn.channel().queue_delete(QUEUE)
    return cluster


def relay_node(cluster: RabbitCluster, relay: FaultRelay) -> RabbitNode:
    """The node the relay says (in its metrics) it is connected to."""
    found = re.search(r'relay_broker_node_info\{address="([^"]+)"', metrics_text(relay))
    assert found is not None, "the relay reports no broker node"
    return cluster.node_at(found.group(1))


def leader(cluster: RabbitCluster, asking: RabbitNode) -> str:
    """The name of the node leading the scenario queue, as ``asking`` sees it."""
    listed = json.loads(asking.ctl("list_queues", "name", "leader", "--formatter", "json", "-q"))
    return str(next(q["leader"] for q in listed if q["name"] == QUEUE))


def await_all_replicas(node: RabbitNode) -> None:
    """Until every quorum queue has all its members online again (what an upgrade tool
    waits for before it takes the next node down)."""
    # The command's own limit, and a CLI run's on top: the call's limit was 60 s, under the
    # command's 90, and a busy run's wait ended there.
    limit = float(REJOIN_TIMEOUT_S) + CLI_TIMEOUT_S
    node.tool(
        "rabbitmq-upgrade", "await_online_quorum_plus_one", "-t", REJOIN_TIMEOUT_S, timeout=limit
    )


def on_cluster(
    name: str, url: str, cluster: RabbitCluster, tmp: Path, fault: Fault, **options: Any
) -> None:
    """The fault suite's scenario, with relays given every node and a quorum queue."""
    scenario(name, url, cluster.url, tmp, fault, queue_arguments=QUORUM, **options)


def test_c1_the_node_the_relay_uses_killed_the_relay_moves_on(
    postgresql_url: str, fresh_cluster: RabbitCluster, tmp_path: Path
) -> None:
    killed: list[RabbitNode] = []

    def kill(relays: list[FaultRelay]) -> float:
        node = relay_node(fresh_cluster, relays[0])
        node.kill()
        killed.append(node)
        return time.time()  # the node stays down while the recovery is measured

    def restart() -> None:
        killed[0].start()
        await_all_replicas(killed[0])

    on_cluster("c1-node-sigkill", postgresql_url, fresh_cluster, tmp_path, kill, after=restart)


def test_c2_the_queue_leader_stopped_while_the_relay_is_on_a_follower(
    postgresql_url: str, fresh_cluster: RabbitCluster, tmp_path: Path
) -> None:
    first, _, last = fresh_cluster.nodes
    # A quorum queue's first leader is the node that declares it: declared on the last
    # node, while the relays use the first.
    with pika.BlockingConnection(pika.URLParameters(last.url)) as conn:
        conn.channel().queue_declare(QUEUE, durable=True, arguments=QUORUM)
    assert leader(fresh_cluster, first) == last.name

    def stop_leader(relays: list[FaultRelay]) -> float:
        assert relay_node(fresh_cluster, relays[0]) is first
        last.ctl("stop_app")
        return time.time()

    def restart() -> None:
        assert leader(fresh_cluster, first) != last.name  # a follower was elected
        last.ctl("start_app")
        await_all_replicas(last)

    on_cluster(
        "c2-leader-stopped", postgresql_url, fresh_cluster, tmp_path, stop_leader, after=restart
    )


def test_c3_no_majority_nothing_is_marked_sent_or_parked_until_a_node_returns(
    postgresql_url: str, fresh_cluster: RabbitCluster, tmp_path: Path
) -> None:
    first, *others = fresh_cluster.nodes

    def lose_majority(relays: list[FaultRelay]) -> float:
        assert relay_node(fresh_cluster, relays[0]) is first
        for node in others:
            node.ctl("stop_app")
        sent = statuses(postgresql_url).get("sent", 0)
        time.sleep(OUTAGE_S)
        during = statuses(postgresql_url)
        # What the majority took before it went may be confirmed and marked after: at most
        # what each relay had in flight (its window) and acked awaiting a settle, however
        # late a loaded machine lets it come; without a majority, nothing more.
        late = during.get("sent", 0) - sent
        assert late <= 2 * WINDOW * len(relays), f"{late} rows marked sent without a majority"
        assert during.get("pending", 0) > 0
        others[0].ctl("start_app")  # one is enough for a majority
        return time.time()

    def restart() -> None:
        others[1].ctl("start_app")
        await_all_replicas(first)

    # Each confirm timeout (or nack) while the majority is gone may resend a window.
    on_cluster(
        "c3-no-majority",
        postgresql_url,
        fresh_cluster,
        tmp_path,
        lose_majority,
        after=restart,
        faults=round(OUTAGE_S / 2) + 1,
    )


def test_c4_a_rolling_restart_of_every_node_under_load(
    postgresql_url: str, fresh_cluster: RabbitCluster, tmp_path: Path
) -> None:
    def rolling_restart(_relays: list[FaultRelay]) -> float:
        for node in fresh_cluster.nodes:
            await_all_replicas(node)
            node.stop()
            node.start()
        return time.time()

    on_cluster(
        "c4-rolling-restart",
        postgresql_url,
        fresh_cluster,
        tmp_path,
        rolling_restart,
        faults=len(fresh_cluster.nodes),
    )


def test_c5_the_relays_node_frozen_longer_than_the_confirm_timeout_then_resumed(
    postgresql_url: str, fresh_cluster: RabbitCluster, tmp_path: Path
) -> None:
    """The relay gives up on the frozen node after its confirm timeout and connects to the
    next, but the other nodes hold operations on the queue until they declare the frozen
    one down (``net_ticktime``, 60 s by default): the frozen node is resumed before."""

    def freeze(relays: list[FaultRelay]) -> float:
        node = relay_node(fresh_cluster, relays[0])
        node.signal(signal.SIGSTOP)
        time.sleep(OUTAGE_S)
        node.signal(signal.SIGCONT)
        return time.time()

    on_cluster("c5-node-sigstop", postgresql_url, fresh_cluster, tmp_path, freeze)


def test_c6_a_missing_exchange_beside_a_good_one_costs_no_connection(
    postgres: PostgresServer, fresh_cluster: RabbitCluster, tmp_path: Path
) -> None:
    """tests/e2e/test_destinations.py's scenario, with the relay given every node."""
    check(tmp_path, fresh_cluster.url, postgres)
