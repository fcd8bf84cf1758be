"""Fault injection against the real servers: nothing committed is ever lost.

Each scenario runs relays as `relay run` subprocesses on a PostgreSQL outbox while three
writers keep inserting, injects its fault, restores, and checks (tests/faults/harness.py):
0 lost, 0 unknown, duplicates within the relays' window per fault, every row sent, no
traceback. Each prints one JSON line (rows, lost, duplicates, recovery seconds); set
RELAY_FAULT_REPORT=path to collect them. Run alone with `scripts/test -m faults`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from relay.localservers import PostgresServer, RabbitNode, ServerError, wait_until
from tests.faults.harness import (
    QUEUE,
    WINDOW,
    Consumer,
    RelayProcess,
    Writers,
    connected,
    finish,
    order_by_key,
    recovered_at,
)
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A node of its own: these tests stop, kill and freeze it."""
    node = RabbitNode(tmp_path_factory.mktemp("fault-rabbit"), name="relay-faults")
    node.start()
    yield node
    node.kill()


@pytest.fixture
def fresh_broker(broker: RabbitNode) -> RabbitNode:
    """The fault node, running and responsive, with the scenario queue emptied."""
    if broker.running:
        broker.signal(signal.SIGCONT)
    else:
        broker.start()
    with contextlib.suppress(ServerError):  # the queue does not exist yet
        broker.ctl("purge_queue", QUEUE)
    return broker


Fault = Callable[[list[RelayProcess]], float]  # injects and restores; returns restore time


def scenario(name: str, url: str, broker: RabbitNode, tmp: Path, fault: Fault, *,
             relays: int = 1, faults: int = 1, amqp_url: str = "",
             **settings: str) -> tuple[Consumer, list[RelayProcess]]:  # fmt: skip
    running = [RelayProcess(f"{name}-{n}", tmp, url, amqp_url or broker.url, **settings).start()
               for n in range(relays)]  # fmt: skip
    for relay in running:
        wait_until(lambda r=relay: connected(r), 60, f"{relay.name} connected")
    with Consumer(broker.url) as consumer:
        with Writers(url):
            time.sleep(2)  # rows flowing
            restored = fault(running)
            recovery = recovered_at(url, restored, restored)
            time.sleep(1)  # and still flowing after
        finish(name, url, consumer, running, bound=faults * relays * WINDOW, recovery=recovery)
    return consumer, running


def test_0_a_late_commit_with_a_low_id_is_relayed_and_a_rollback_stalls_nothing(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    engine = sa.create_engine(postgresql_url)
    insert = sa.text("INSERT INTO outbox (message_id, exchange, routing_key, payload) "
                     "VALUES (:m, 'faults', 'k', 'late')")  # fmt: skip

    def hold_open(_relays: list[RelayProcess]) -> float:
        late, rolled_back = engine.connect(), engine.connect()
        late.begin()
        late.execute(insert, {"m": "late-1"})  # takes an id now, commits in 4 s
        rolled_back.begin()
        rolled_back.execute(insert, {"m": "rolled-back"})
        time.sleep(4)  # writers commit many higher ids meanwhile; the relays send them
        rolled_back.rollback()
        late.commit()
        committed = time.time()
        late.close(), rolled_back.close()
        return committed

    scenario("0-commit-order-gap", postgresql_url, fresh_broker, tmp_path, hold_open, faults=0)
    with engine.connect() as conn:
        status = conn.execute(sa.text("SELECT status FROM outbox WHERE message_id = 'late-1'"))
        assert status.scalar() == "sent"
    engine.dispose()


def test_1_broker_stopped_gracefully_and_restarted(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def restart(_relays: list[RelayProcess]) -> float:
        fresh_broker.stop()
        time.sleep(3)
        fresh_broker.start()
        return time.time()

    scenario("1-broker-stop", postgresql_url, fresh_broker, tmp_path, restart)


def test_2_broker_killed_and_restarted(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def kill(_relays: list[RelayProcess]) -> float:
        fresh_broker.kill()
        time.sleep(2)
        fresh_broker.start()
        return time.time()

    scenario("2-broker-sigkill", postgresql_url, fresh_broker, tmp_path, kill)


def test_3_connections_closed_under_the_relay_again_and_again(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def close_all(_relays: list[RelayProcess]) -> float:
        for _ in range(3):
            fresh_broker.ctl("close_all_connections", "fault test")
            time.sleep(1.5)
        return time.time()

    scenario("3-close-connections", postgresql_url, fresh_broker, tmp_path, close_all, faults=3)


def test_3b_a_proxy_that_resets_delays_and_black_holes_the_link(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """Through a loopback proxy: connections reset (RST) mid-stream, 50 ms added to every
    chunk, then a half-open link (nothing passes, both sockets stay open), which heartbeats
    would notice only after a minute: the relay's confirm timeout must act first."""
    with TcpProxy(fresh_broker.port) as proxy:

        def misbehave(_relays: list[RelayProcess]) -> float:
            proxy.reset()
            time.sleep(2)
            proxy.delay = 0.05
            time.sleep(3)
            proxy.delay, proxy.mode = 0.0, "blackhole"
            time.sleep(6)  # confirm timeout 2 s, then the close that never completes
            proxy.mode = "pass"
            return time.time()

        scenario("3b-proxy", postgresql_url, fresh_broker, tmp_path, misbehave, faults=3,
                 amqp_url=proxy.url())  # fmt: skip


def test_4_broker_frozen_longer_than_the_confirm_timeout(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def freeze(_relays: list[RelayProcess]) -> float:
        fresh_broker.signal(signal.SIGSTOP)
        time.sleep(5)  # confirm timeout is 2 s
        fresh_broker.signal(signal.SIGCONT)
        return time.time()

    scenario("4-broker-sigstop", postgresql_url, fresh_broker, tmp_path, freeze)


def test_5_relay_killed_mid_batch_and_restarted_keeps_per_key_order(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def kill_relay(relays: list[RelayProcess]) -> float:
        relays[0].kill()
        relays.append(RelayProcess("5-relay-restarted", tmp_path, postgresql_url,
                                   fresh_broker.url, ordering="true").start())  # fmt: skip
        return time.time()

    consumer, _ = scenario("5-relay-sigkill", postgresql_url, fresh_broker, tmp_path,
                           kill_relay, ordering="true")  # fmt: skip
    assert {k: v == sorted(v) for k, v in order_by_key(consumer).items()} == {
        k: True for k in order_by_key(consumer)
    }


def test_6_database_stopped_immediately_and_restarted(
    postgresql_url: str, postgres: PostgresServer, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def stop_database(_relays: list[RelayProcess]) -> float:
        postgres.stop("immediate")
        time.sleep(3)
        postgres.start()
        return time.time()

    scenario("6-database-down", postgresql_url, fresh_broker, tmp_path, stop_database)


def test_10_three_relays_share_the_outbox_without_publishing_a_row_twice(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def nothing(_relays: list[RelayProcess]) -> float:
        time.sleep(4)
        return time.time()

    scenario("10-three-relays", postgresql_url, fresh_broker, tmp_path, nothing, relays=3,
             faults=0)  # fmt: skip


def test_11_three_relays_one_killed_the_others_take_over_in_key_order(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def kill_one(relays: list[RelayProcess]) -> float:
        relays[1].kill()
        return time.time()

    consumer, _ = scenario("11-three-relays-one-killed", postgresql_url, fresh_broker,
                           tmp_path, kill_one, relays=3, ordering="true")  # fmt: skip
    assert all(v == sorted(v) for v in order_by_key(consumer).values())


def test_12_sigterm_under_load_drains_and_a_new_relay_sends_the_rest(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    exit_codes: list[int] = []

    def terminate(relays: list[RelayProcess]) -> float:
        stopping = threading.Thread(target=lambda: exit_codes.append(relays[0].stop(30)))
        stopping.start()
        stopping.join(40)
        relays.append(RelayProcess("12-relay-next", tmp_path, postgresql_url,
                                   fresh_broker.url).start())  # fmt: skip
        return time.time()

    scenario("12-sigterm-under-load", postgresql_url, fresh_broker, tmp_path, terminate)
    assert exit_codes == [0]
