"""Fault injection against the real servers: nothing committed is ever lost.

Each scenario runs relays as `relay run` subprocesses on a PostgreSQL outbox while three
writers keep inserting, injects its fault, restores, and checks (tests/faults/harness.py):
0 lost, 0 unknown, duplicates within the relays' window per fault, every row sent, no
traceback. Each prints one JSON line (rows, lost, duplicates, recovery seconds); set
FAULT_REPORT=path to collect them. Run alone with `scripts/test -m faults`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pika
import pytest
import sqlalchemy as sa

from devtools.outbox import age_sent_log, fates, insert, sent_ids
from devtools.procfs import rss_mb
from devtools.scrape import metric
from devtools.servers import MariaDBServer, PostgresServer, RabbitNode, ServerError, wait_until
from relay.constants import DB_TCP_USER_TIMEOUT_S
from relay.db.migrate import migrate
from relay.db.schema import (
    outbox,
    outbox_buckets,
    outbox_sent,
    outbox_sent_legacy,
    outbox_sent_runs,
)
from relay.db.sentlog import SentLogRebuild
from relay.db.sentruns import SentRuns
from relay.sentlog import SentLogState
from tests.faults.harness import (
    LEASE,
    QUEUE,
    STALL_S,
    UNBOUND,
    WINDOW,
    FaultRelay,
    connected,
    metrics_text,
    order_by_key,
    out_of_key_order,
    scenario,
)
from tests.faults.silence import Silenced, port_of
from tests.faults.silence import unavailable as silence_unavailable
from tests.support.proxy import TcpProxy
from tests.support.rabbitmq import RABBITMQ_3, RABBITMQ_4, RABBITMQ_VERSIONS, rabbit_node

# A hang detector, not a speed limit: the waits on the relays' work last while it progresses
# (tests/faults/harness.py), and a busy machine's scenario takes two or three times a quiet
# one's.
pytestmark = pytest.mark.timeout(420)
MAX_MESSAGE = 1024 * 1024  # the fault node's max_message_size
# Test 6c: how long the relay may send none of the rows written before its database's
# connections went silent. Its calls on them wait out the keepalives' and the unacknowledged
# data's limits (DB_TCP_USER_TIMEOUT_S, 11 s) before they are retried on new connections, a
# pause on top of what any relay may take (STALL_S). Without those limits the calls waited for
# the kernel's own (a quarter of an hour to hours), and nothing moved meanwhile.
SILENT_STALL_S = STALL_S + DB_TCP_USER_TIMEOUT_S


def frozen(point: str, armed: Path) -> list[str]:
    """The command of a relay that freezes itself at ``point`` once ``armed`` exists
    (tests/faults/frozen.py)."""
    return [sys.executable, "-m", "tests.faults.frozen", point, str(armed)]


# Scenarios whose fault is in the database or in the relays, with the broker a bystander:
# on one version only (the suite's time budget); the broker's own faults run on both.
broker_bystander = pytest.mark.parametrize("broker", [RABBITMQ_3], indirect=True)


@pytest.fixture(scope="session")
def fault_nodes() -> Iterator[dict[str, RabbitNode]]:
    """The fault nodes of this test process, by version, each started when first asked for
    and kept until the session ends: the suite hands its processes the slowest tests first,
    whatever their module, and a module's node would be started again at each return."""
    nodes: dict[str, RabbitNode] = {}
    yield nodes
    for node in nodes.values():
        node.kill()


@pytest.fixture(params=RABBITMQ_VERSIONS)
def broker(
    request: pytest.FixtureRequest,
    fault_nodes: dict[str, RabbitNode],
    tmp_path_factory: pytest.TempPathFactory,
) -> RabbitNode:
    """A node of its own, of each version: these tests stop, kill and freeze it."""
    if request.param not in fault_nodes:
        # A name per version: both nodes may run at once in one process.
        name = {RABBITMQ_3: "relay-faults", RABBITMQ_4: "relay-faults-4"}[request.param]
        node = rabbit_node(
            request.param, tmp_path_factory, name, f"max_message_size = {MAX_MESSAGE}\n"
        )
        node.start()
        fault_nodes[request.param] = node
    return fault_nodes[request.param]


@pytest.fixture
def fresh_broker(broker: RabbitNode) -> RabbitNode:
    """The fault node, running and responsive, without the scenario queue (each scenario's
    relays declare it, with the arguments the scenario wants)."""
    if broker.running:
        broker.signal(signal.SIGCONT)
    else:
        broker.start()
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        conn.channel().queue_delete(QUEUE)
    return broker


@broker_bystander
def test_0_a_late_commit_with_a_low_id_is_relayed_and_a_rollback_stalls_nothing(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    engine = sa.create_engine(postgresql_url)
    insert = sa.text(
        "INSERT INTO outbox (message_id, exchange, routing_key, payload) "
        "VALUES (:m, 'faults', 'k', 'late') RETURNING id"
    )

    def hold_open(_relays: list[FaultRelay]) -> float:
        late, rolled_back = engine.connect(), engine.connect()
        late.begin()
        low = late.execute(insert, {"m": "late-1"}).scalar_one()  # takes an id now
        rolled_back.begin()
        low = max(low, rolled_back.execute(insert, {"m": "rolled-back"}).scalar_one())
        # The writers commit higher ids meanwhile: the gap has formed once the relays have
        # sent one of those, these two still open.
        wait_until(
            lambda: max(sent_ids(engine), default=0) > low,
            STALL_S,
            "a row with a higher id sent",
            poll=0.2,
        )
        rolled_back.rollback()
        late.commit()
        committed = time.time()
        late.close()
        rolled_back.close()
        return committed

    scenario("0-commit-order-gap", postgresql_url, fresh_broker.url, tmp_path, hold_open, faults=0)
    assert fates(engine, ["late-1"]) == {"late-1": "sent"}
    engine.dispose()


def test_1_broker_stopped_gracefully_and_restarted(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def restart(_relays: list[FaultRelay]) -> float:
        fresh_broker.stop()
        time.sleep(3)
        fresh_broker.start()
        return time.time()

    scenario("1-broker-stop", postgresql_url, fresh_broker.url, tmp_path, restart)


def test_2_broker_killed_and_restarted(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def kill(_relays: list[FaultRelay]) -> float:
        fresh_broker.kill()
        time.sleep(2)
        fresh_broker.start()
        return time.time()

    scenario("2-broker-sigkill", postgresql_url, fresh_broker.url, tmp_path, kill)


def test_3_connections_closed_under_the_relay_again_and_again_keeps_per_key_order(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def close_all(_relays: list[FaultRelay]) -> float:
        for _ in range(3):
            fresh_broker.ctl("close_all_connections", "fault test")
            time.sleep(1.5)
        return time.time()

    consumer, _ = scenario(
        "3-close-connections",
        postgresql_url,
        fresh_broker.url,
        tmp_path,
        close_all,
        faults=3,
        ordering="true",
    )
    assert all(v == sorted(v) for v in order_by_key(consumer).values())


@broker_bystander
def test_3b_a_proxy_that_resets_delays_and_black_holes_the_link(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """Through a loopback proxy: connections reset (RST) mid-stream, 50 ms added to every
    chunk, then a half-open link (nothing passes, both sockets stay open), which heartbeats
    would notice only after a minute: the relay's confirm timeout must act first. The fault
    is the link's: the broker sees a connection drop or go quiet, the same on both versions."""
    with TcpProxy(fresh_broker.port) as proxy:

        def misbehave(_relays: list[FaultRelay]) -> float:
            proxy.reset()
            time.sleep(2)
            proxy.delay = 0.05
            time.sleep(3)
            proxy.delay, proxy.mode = 0.0, "blackhole"
            time.sleep(6)  # confirm timeout 1.5 s, then the close that never completes
            proxy.mode = "pass"
            return time.time()

        scenario(
            "3b-proxy",
            postgresql_url,
            fresh_broker.url,
            tmp_path,
            misbehave,
            faults=3,
            relay_url=proxy.url(),
        )


def test_4_broker_frozen_longer_than_the_confirm_timeout(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def freeze(_relays: list[FaultRelay]) -> float:
        fresh_broker.signal(signal.SIGSTOP)
        time.sleep(5)  # confirm timeout is 1.5 s
        fresh_broker.signal(signal.SIGCONT)
        return time.time()

    scenario("4-broker-sigstop", postgresql_url, fresh_broker.url, tmp_path, freeze)


@broker_bystander
def test_5_relay_killed_mid_batch_and_restarted_keeps_per_key_order(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def kill_relay(relays: list[FaultRelay]) -> float:
        relays[0].kill()
        relays.append(
            FaultRelay(
                "5-relay-restarted", tmp_path, postgresql_url, fresh_broker.url, ordering="true"
            ).start()
        )
        return time.time()

    consumer, _ = scenario(
        "5-relay-sigkill", postgresql_url, fresh_broker.url, tmp_path, kill_relay, ordering="true"
    )
    assert {k: v == sorted(v) for k, v in order_by_key(consumer).items()} == {
        k: True for k in order_by_key(consumer)
    }


@broker_bystander
def test_6_database_stopped_locked_and_its_connections_killed(
    postgresql_url: str, postgres: PostgresServer, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """PostgreSQL stopped with -m immediate while acks arrive; then the outbox held by
    LOCK TABLE (the relays' claims hit statement_timeout or wait); then every relay
    backend terminated. Acks that could not be recorded leave rows due again, not lost."""
    database = sa.make_url(postgresql_url).database or ""
    # The tests' server commits asynchronously (tuned for speed), and a crash loses its last
    # commits: a writer's row the relay had already published was then gone from the
    # outbox, and its message counted as one nobody wrote (seen in CI: 10 of 6,510). A
    # writer's commit is durable in production; make it so here. The relay's own sessions
    # keep asynchronous commits: their startup options override the database's default.
    postgres.psql(f"ALTER DATABASE {database} SET synchronous_commit = on")

    def database_faults(_relays: list[FaultRelay]) -> float:
        postgres.stop("immediate")
        time.sleep(3)
        postgres.start()
        time.sleep(2)
        postgres.psql(
            "BEGIN; LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT",
            database=database,
        )
        time.sleep(1)
        postgres.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'outbox-relay'"
        )
        return time.time()

    scenario(
        "6-database-faults", postgresql_url, fresh_broker.url, tmp_path, database_faults, faults=3
    )


@broker_bystander
def test_6b_mariadb_killed_locked_and_its_connections_killed(
    mariadb_url: str, mariadb: MariaDBServer, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """The same on MariaDB: the server killed (SIGKILL) while acks arrive and restarted; then
    the outbox held by LOCK TABLES (the relays' statements wait out their lock timeout or
    the lock); then every connection to the outbox's database killed."""
    database = sa.make_url(mariadb_url).database or ""
    # The tests' server writes its log at commit but flushes it once a second (tuned for
    # speed): a crash would lose a writer's last commits (see test 6). Durable until the
    # restart, which brings the tuned setting back.
    mariadb.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1")

    def database_faults(_relays: list[FaultRelay]) -> float:
        mariadb.stop(signal.SIGKILL)
        time.sleep(3)
        mariadb.start()
        time.sleep(2)
        mariadb.sql("LOCK TABLES outbox WRITE; SELECT SLEEP(4); UNLOCK TABLES", database)
        time.sleep(1)
        connections = mariadb.sql(
            "SELECT id FROM information_schema.processlist "
            f"WHERE db = '{database}' AND id <> CONNECTION_ID()"
        ).split()
        for connection in connections:
            with contextlib.suppress(ServerError):  # it may have ended meanwhile
                mariadb.sql(f"KILL CONNECTION {connection}")
        return time.time()

    scenario(
        "6b-mariadb-faults", mariadb_url, fresh_broker.url, tmp_path, database_faults, faults=3
    )


@broker_bystander
@pytest.mark.databases("postgresql", "mariadb")
def test_6c_connections_to_a_vanished_database_host_are_found_dead_in_seconds(
    database_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """Every connection the relay has to the database goes silent, for good: its packets are
    dropped both ways (tests/faults/silence.py), as when the database's host vanishes without
    a reset or a failover moves its address; new connections get through. TCP keepalives
    and the timeout for unacknowledged data find them dead in seconds, not the kernel's
    hours: the calls under way fail, are retried on new connections, and the rows written
    before the fault are sent, with no pause longer than ``SILENT_STALL_S``."""
    if (why := silence_unavailable()) is not None:
        # Never skipped: the suite runs as root where `scripts/bootstrap test` installed
        # nftables, and nothing short of the kernel's packet filter silences a connection.
        pytest.fail(f"cannot silence the relay's connections: {why}", pytrace=False)
    port = port_of(database_url)
    with contextlib.ExitStack() as silenced:

        def go_silent(relays: list[FaultRelay]) -> float:
            silenced.enter_context(Silenced(relays[0].pid, port))
            return time.time()

        scenario(
            "6c-database-silent",
            database_url,
            fresh_broker.url,
            tmp_path,
            go_silent,
            after=silenced.close,
            stall=SILENT_STALL_S,
        )


@broker_bystander
def test_10_three_relays_share_the_outbox_without_publishing_a_row_twice(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    def nothing(_relays: list[FaultRelay]) -> float:
        time.sleep(4)
        return time.time()

    scenario(
        "10-three-relays", postgresql_url, fresh_broker.url, tmp_path, nothing, relays=3, faults=0
    )


@broker_bystander
@pytest.mark.databases("postgresql", "mariadb")
def test_11_three_relays_one_killed_the_others_take_over_in_key_order(
    database_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """The killed relay's buckets are taken over once their leases end by the database's
    clock, and each key's rows go out in order: on PostgreSQL and on MariaDB (where buckets
    are taken by SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE)."""

    def kill_one(relays: list[FaultRelay]) -> float:
        relays[1].kill()
        return time.time()

    consumer, _ = scenario(
        "11-three-relays-one-killed",
        database_url,
        fresh_broker.url,
        tmp_path,
        kill_one,
        relays=3,
        ordering="true",
    )
    assert all(v == sorted(v) for v in order_by_key(consumer).values())


@broker_bystander
def test_12_sigterm_under_load_drains_and_a_new_relay_sends_the_rest(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    exit_codes: list[int] = []

    def terminate(relays: list[FaultRelay]) -> float:
        stopping = threading.Thread(target=lambda: exit_codes.append(relays[0].stop(30)))
        stopping.start()
        stopping.join(40)
        relays.append(
            FaultRelay("12-relay-next", tmp_path, postgresql_url, fresh_broker.url).start()
        )
        return time.time()

    scenario("12-sigterm-under-load", postgresql_url, fresh_broker.url, tmp_path, terminate)
    assert exit_codes == [0]


def test_7_nack_storm_from_a_full_queue_delivers_every_row_and_parks_none(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """A queue of at most 100 messages that refuses more (reject-publish: basic.nack), and
    a consumer slower than the writers."""

    def storm(relays: list[FaultRelay]) -> float:
        wait_until(
            lambda: 'outcome="nacked"} 0.0' not in metrics_text(relays[0]), 30, "the broker nacking"
        )
        time.sleep(3)
        return time.time()

    scenario(
        "7-nack-storm",
        postgresql_url,
        fresh_broker.url,
        tmp_path,
        storm,
        consumer_delay=0.001,  # about 1,000 a second: the writers write about 1,400
        queue_arguments={"x-max-length": 100, "x-overflow": "reject-publish"},
        max_attempts="50",
    )


def test_8_an_unroutable_flood_is_parked_and_good_rows_keep_flowing(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    parked: dict[str, str] = {}

    def flood(_relays: list[FaultRelay]) -> float:
        for burst in range(3):
            rows = [
                {
                    "message_id": f"unroutable-{burst}-{i}",
                    "exchange": UNBOUND,
                    "routing_key": "k",
                    "payload": b"lost?",
                }
                for i in range(100)
            ]
            insert(postgresql_url, rows)
            parked.update({str(r["message_id"]): "312 NO_ROUTE" for r in rows})
            time.sleep(1)
        return time.time()

    scenario(
        "8-unroutable-flood",
        postgresql_url,
        fresh_broker.url,
        tmp_path,
        flood,
        parked=parked,
        max_attempts="3",
    )


def test_9_poison_rows_are_parked_with_their_reason_and_the_rest_flows(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    parked: dict[str, str] = {}
    poison = [
        ("bad-headers-0", "faults", b"p", "not json", "rejected"),
        ("bad-headers-1", "faults", b"p", "[1, 2]", "rejected"),
        ("too-large-0", "faults", b"x" * (2 * MAX_MESSAGE), None, "larger than configured max"),
        ("too-large-1", "faults", b"x" * (2 * MAX_MESSAGE), None, "larger than configured max"),
        ("no-exchange-0", "faults.missing", b"p", None, "404 NOT_FOUND"),
        ("no-exchange-1", "faults.missing", b"p", None, "404 NOT_FOUND"),
    ]

    def poison_rows(relays: list[FaultRelay]) -> float:
        for message_id, exchange, payload, headers, reason in poison:
            row = {"message_id": message_id, "exchange": exchange, "routing_key": "k"}
            insert(postgresql_url, [row | {"payload": payload, "headers": headers}])
            parked[message_id] = reason
            time.sleep(0.5)
        return time.time()

    # Each oversized or misaddressed attempt closes the channel: 4 rows x 3 attempts.
    _, relays = scenario(
        "9-poison-rows",
        postgresql_url,
        fresh_broker.url,
        tmp_path,
        poison_rows,
        parked=parked,
        faults=12,
        max_attempts="3",
    )
    assert not relays[0].killed  # the first relay lived through every poison row


def test_13_a_memory_alarm_pauses_publishing_without_errors(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    peak: list[float] = []

    def alarm(relays: list[FaultRelay]) -> float:
        assert relays[0].proc is not None
        fresh_broker.ctl("set_vm_memory_high_watermark", "0.0000001")
        try:
            for _ in range(20):  # 5 s blocked while the writers go on
                peak.append(rss_mb(relays[0].proc.pid))
                time.sleep(0.25)
        finally:
            fresh_broker.ctl("set_vm_memory_high_watermark", "0.4")
        return time.time()

    _, relays = scenario("13-memory-alarm", postgresql_url, fresh_broker.url, tmp_path, alarm)
    assert max(peak) < 200, f"relay RSS {max(peak):.0f} MB while blocked"
    logged = relays[0].log()
    actions = [json.loads(line)["action"] for line in logged.splitlines()]
    assert "broker_blocked" in actions and "confirm_timeout" not in actions


def test_14_poison_rows_of_every_kind_while_three_relays_run(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """Rows that once spun, crashed or stalled a relay, one of each kind every second or so,
    twice over, while the writers write and three relays share the outbox: none exits, each
    bad row is parked with its reason, the doubles are delivered, and each row that made the
    broker close a channel took one window of good rows down with it at most."""
    parked: dict[str, str] = {}
    deep = '{"a": ' * 600 + "1" + "}" * 600
    kinds: list[tuple[str, dict[str, object], str | None]] = [
        ("long-key", {"routing_key": "k" * 300}, "rejected: routing_key is 300 bytes"),
        ("deep", {"headers": deep}, "rejected: headers are nested deeper than 32"),
        ("header-key", {"headers": json.dumps({"h" * 300: 1})}, "rejected: header key"),
        ("huge-int", {"headers": '{"n": 99999999999999999999}'}, "rejected: header 'n'"),
        ("internal", {"exchange": "amq.rabbitmq.trace"}, "403 ACCESS_REFUSED"),
        ("doubles", {"headers": '{"r": 0.30000000000000004, "pi": 3.141592653589793}'}, None),
    ]
    engine = sa.create_engine(postgresql_url)

    def poison_rows(_relays: list[FaultRelay]) -> float:
        for round_ in range(2):
            for name, columns, reason in kinds:
                message_id = f"{name}-{round_}"
                values = {
                    "message_id": message_id,
                    "exchange": "faults",
                    "routing_key": "k",
                    "payload": b"p",
                } | columns
                insert(engine, [values])
                if reason is not None:
                    parked[message_id] = reason
                time.sleep(0.5)
        return time.time()

    try:
        consumer, relays = scenario(
            "14-poison-every-kind",
            postgresql_url,
            fresh_broker.url,
            tmp_path,
            poison_rows,
            relays=3,
            parked=parked,
            max_attempts="3",
        )
    finally:
        engine.dispose()
    assert not any(relay.killed for relay in relays)
    assert {"doubles-0", "doubles-1"} <= consumer.seen()
    first = [m for m, redelivered in consumer.deliveries if not redelivered]
    duplicates = len(first) - len(set(first))
    assert duplicates <= 2 * WINDOW, f"{duplicates} duplicates for two channel-closing rows"


@broker_bystander
@pytest.mark.databases("postgresql", "mariadb")
def test_15_a_relay_frozen_two_leases_mid_stream_publishes_nothing_out_of_key_order(
    database_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """Three relays, ordering on; one frozen (SIGSTOP) for two leases mid-stream, then
    resumed. The others take its buckets and publish its rows; on waking it publishes none of
    the rows it had claimed (their buckets are the others' now): no row of a key arrives
    after a later row of that key, and duplicates stay within one window (the rows it had in
    flight, published again by the others). It freezes itself right after a claim found rows
    (tests/faults/frozen.py), so that it holds rows claimed and not yet published, as a
    busy relay does at any moment."""
    armed = tmp_path / "freeze"

    def freeze(relays: list[FaultRelay]) -> float:
        # Once it has published (rows flow through it), at its next claim that finds rows.
        wait_until(lambda: relays[0].published() > 0, 60, "the relay under test publishing")
        armed.touch()
        wait_until(relays[0].stopped, 60, "the relay frozen after a claim")
        time.sleep(2 * LEASE)
        relays[0].signal(signal.SIGCONT)
        return time.time()

    consumer, _ = scenario(
        "15-relay-frozen",
        database_url,
        fresh_broker.url,
        tmp_path,
        freeze,
        relays=3,
        duplicates=WINDOW,
        first_command=frozen("claim", armed),
        ordering="true",
    )
    assert out_of_key_order(consumer) == {}


# Test 16: rows the three relays publish while their rate before the freeze is measured.
RATE_ROWS = 10 * WINDOW


@broker_bystander
@pytest.mark.databases("postgresql", "mariadb")
def test_16_a_relay_frozen_inside_its_turn_stalls_no_other_and_loses_its_buckets(
    database_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """Three relays; one freezes itself inside a turn (tests/faults/frozen_turn.py), its
    presence and its buckets locked by an open transaction. The database ends that
    transaction (idle too long); the others' turns wait for none of its locks, their rate
    during the freeze is at least half the three relays' rate before it, and they take its
    buckets within two leases. It resumes, rejoins, and nothing is lost. The rate before is
    measured over the time the three take to publish ``RATE_ROWS`` rows, and the freeze is
    armed then (at a fixed time after the start, a busy machine froze it before the rows had
    flowed two seconds)."""
    engine = sa.create_engine(database_url)
    seen: dict[str, float] = {}
    armed = tmp_path / "freeze"

    def frozen_turn(relays: list[FaultRelay]) -> float:
        frozen, others = relays[0], relays[1:]
        counts: list[tuple[float, float]] = []  # (monotonic time, rows all three published)
        armed_at = float("inf")
        while not frozen.stopped():
            sampled, text = time.monotonic(), metrics_text(frozen)
            if text:  # else it froze meanwhile
                mine = metric(text, "relay_published_total")
                counts.append((sampled, mine + sum(r.published() for r in others)))
                if not armed.exists() and counts[-1][1] - counts[0][1] >= RATE_ROWS:
                    armed.touch()  # it freezes at its next turn (a third of a lease)
                    armed_at = sampled
            assert sampled - armed_at < 2 * LEASE, "the relay never froze in its turn"
            time.sleep(0.2)
        frozen_at = time.monotonic()
        (first, _), (last, _) = counts[0], counts[-1]
        seen["rate_before"] = (counts[-1][1] - counts[0][1]) / (last - first)
        published_at_freeze = sum(r.published() for r in others)
        owned = sa.select(sa.func.count()).where(outbox_buckets.c.owner == frozen.name)
        while time.monotonic() - frozen_at < 2 * LEASE:
            with engine.connect() as conn:
                if conn.execute(owned).scalar_one() == 0 and "taken_s" not in seen:
                    seen["taken_s"] = time.monotonic() - frozen_at
            time.sleep(0.2)
        during = sum(r.published() for r in others) - published_at_freeze
        seen["rate_during"] = during / (time.monotonic() - frozen_at)
        frozen.signal(signal.SIGCONT)
        return time.time()

    try:
        scenario(
            "16-frozen-in-turn",
            database_url,
            fresh_broker.url,
            tmp_path,
            frozen_turn,
            relays=3,
            first_command=frozen("turn", armed),
        )
    finally:
        engine.dispose()
    print(json.dumps({"scenario": "16-frozen-in-turn", **seen}))
    assert "taken_s" in seen, f"its buckets were not taken over within {2 * LEASE:g} s"
    assert seen["rate_during"] >= 0.5 * seen["rate_before"], seen


# The release before relays said their protocol (``relay.buckets.fence``): the last commit
# without it, run from its own source (``git archive``) on this suite's dependencies.
PREVIOUS_RELEASE = "17fbdee"
ROOT = Path(__file__).resolve().parents[2]


# The release of migration 0013 (protocol 2): the last before this release's sent log.
RELEASE_OF_0013 = "39f4e7b"


def release_command(commit: str, directory: Path) -> list[str]:
    """The command that runs ``relay run`` of the release at ``commit``."""
    source = directory / f"release-{commit}"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "relay"],
        check=False,  # said below
        capture_output=True,
        timeout=60,
    )
    assert archive.returncode == 0, f"needs the repository's history: {archive.stderr!r}"
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    run = f"import runpy, sys; sys.path.insert(0, {str(source)!r}); runpy.run_module('relay')"
    return [sys.executable, "-c", run, "run"]


@pytest.fixture
def previous_release(tmp_path: Path) -> list[str]:
    """The command that runs ``relay run`` of the release before protocols."""
    return release_command(PREVIOUS_RELEASE, tmp_path)


def fenced(relay: FaultRelay) -> bool:
    text = metrics_text(relay)
    return bool(text) and metric(text, "relay_fenced") == 1


@broker_bystander
def test_17_relays_of_this_release_wait_for_the_release_before_through_the_migration(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path, previous_release: list[str]
) -> None:
    """A relay of the release before runs on its schema (0011) under the writers; migrations
    0012 and 0013 run under it; two relays of this release start and claim nothing while it
    holds buckets (relay_fenced); it stops (SIGTERM, a rolling update's), the rest of the
    migrations run, and they take the whole outbox over: nothing lost, nothing published
    twice, each key in order."""
    migrate(postgresql_url, "0011", downgrade=True)
    published_while_fenced: list[float] = []
    new_relays: list[FaultRelay] = []
    engine = sa.create_engine(postgresql_url)

    def shared_out() -> bool:
        """Every bucket owned, by the new relays alone, each its share."""
        with engine.connect() as conn:
            owners = collections.Counter(conn.scalars(sa.select(outbox_buckets.c.owner)))
        return set(owners) == {r.name for r in new_relays} and min(owners.values()) >= 16

    def upgrade(relays: list[FaultRelay]) -> float:
        migrate(postgresql_url, "0013")
        for n in (1, 2):
            relays.append(
                FaultRelay(
                    f"17-new-{n}", tmp_path, postgresql_url, fresh_broker.url, ordering="true"
                ).start()
            )
        new_relays.extend(relays[1:])
        for relay in new_relays:
            wait_until(functools.partial(fenced, relay), 30, f"{relay.name} waiting")
        time.sleep(2 * LEASE / 3)  # a turn each more, the writers writing
        published_while_fenced.extend(r.published() for r in relays[1:])
        assert relays[0].stop(30) == 0
        migrate(postgresql_url)
        wait_until(lambda: not any(fenced(r) for r in relays[1:]), 2 * LEASE, "taken over")
        return time.time()

    consumer, _ = scenario(
        "17-upgrade",
        postgresql_url,
        fresh_broker.url,
        tmp_path,
        upgrade,
        first_command=previous_release,
        after=lambda: wait_until(shared_out, 3 * LEASE, "the outbox shared out"),
        ordering="true",
    )
    engine.dispose()
    assert published_while_fenced == [0.0, 0.0]
    assert out_of_key_order(consumer) == {}


def longest_pause(url: str, since: float, until: float) -> float:
    """The longest time, between ``since`` and ``until`` (time.time()), in which no message
    was acked: the sent times of both sent logs' entries (this release's and the release
    before's), with the window's ends."""
    logged = sa.union_all(
        *(sa.select(log.c.sent_at) for log in (outbox_sent, outbox_sent_legacy))
    ).subquery()
    window = sa.select(logged.c.sent_at).where(
        logged.c.sent_at > datetime.fromtimestamp(since, UTC),
        logged.c.sent_at < datetime.fromtimestamp(until, UTC),
    )
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            times = sorted(t.timestamp() for t in conn.scalars(window))
    finally:
        engine.dispose()
    edges = [since, *times, until]
    return float(max(b - a for a, b in itertools.pairwise(edges)))


@broker_bystander
def test_19_a_live_stream_rolls_from_the_release_of_0013_to_this_one_without_a_stop(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """A relay of the release of migration 0013 (protocol 2) publishes under the writers.
    `relay migrate` takes the schema to this release's while it runs (it refused before,
    and every relay had to stop); relays of this release then start one by one, the old one
    stopped after the first is up, as a rolling update does. Nothing lost, nothing published
    twice, ids the old relay acked and written again after the switch dropped, and acks
    never stopped for a lease."""
    migrate(postgresql_url, "0013", downgrade=True)
    old_release = release_command(RELEASE_OF_0013, tmp_path)
    engine = sa.create_engine(postgresql_url)
    rewritten: list[str] = []
    pause: list[float] = []

    def roll(relays: list[FaultRelay]) -> float:
        (old,) = relays
        with engine.connect() as conn:  # rows the old relay is about to ack
            chosen = list(conn.scalars(sa.select(outbox.c.message_id).limit(50)))
        migrate(postgresql_url)  # beside it, under the writers
        wait_until(
            lambda: set(fates(postgresql_url, chosen).values()) == {"sent"}, 60, "acked by it"
        )
        began = time.time()
        first, second = (
            FaultRelay(f"19-new-{n}", tmp_path, postgresql_url, fresh_broker.url) for n in (1, 2)
        )
        relays.append(first.start())
        wait_until(functools.partial(connected, first), 60, "the first connected")
        wait_until(lambda: not fenced(first) and first.published() > 0, 3 * LEASE, "taken over")
        stopped = old.stop(30)
        # Stopped as a rolling update stops it (SIGTERM: drained, 0), or already retiring on
        # its own: the first relay of this release raised the least protocol, and the old
        # one gives its buckets up, drains and exits 1; a SIGTERM in that exit, after its
        # loop had closed, kills it (a CI run under load: -15, its log drained and retired).
        retired = "this relay's buckets are given up, and it stops" in old.log()
        assert stopped in ((0, 1, -signal.SIGTERM) if retired else (0,)), old.log()[-3000:]
        assert old.tracebacks() == [], "the old relay logged a traceback"
        # Its end is judged here: the harness's, which wants 0 of every relay it ends, failed
        # one that had retired on its own (a CI check of this stop: exit 1, its log retired).
        relays.remove(old)
        relays.append(second.start())
        wait_until(functools.partial(connected, second), 60, "the second connected")
        ended = time.time() + 2 * LEASE
        time.sleep(2 * LEASE)  # both new relays at work, the writers writing
        pause.append(longest_pause(postgresql_url, began, ended))
        rewritten.extend(chosen)
        rows = [{"message_id": m, "exchange": "faults", "payload": b"x"} for m in chosen]
        insert(postgresql_url, rows)
        return time.time()

    try:
        scenario(
            "19-roll-0013",
            postgresql_url,
            fresh_broker.url,
            tmp_path,
            roll,
            first_command=old_release,
            duplicates=0,
        )
    finally:
        engine.dispose()
    # As many of 50 as the outbox held at that moment: under load the old relay kept up with
    # the writers (a run beside other work found 30).
    assert rewritten, "no id the old relay acked was written again"
    assert pause[0] < LEASE, f"no ack for {pause[0]:.1f} s"
    print(json.dumps({"scenario": "19-roll-0013", "longest_pause_s": round(pause[0], 2)}))


# Test 20: entries of a sent log aged by plain SQL (six days of acks), sealed into runs.
AGED_ENTRIES = 1_000_000
# How long after PostgreSQL accepts connections again new rows may wait (issue 68).
CRASH_PAUSE_S = 10.0


@broker_bystander
def test_20_a_crash_under_a_live_stream_pauses_delivery_seconds_whatever_the_logs_age(
    postgresql_url: str, postgres: PostgresServer, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """PostgreSQL crashes (an immediate stop, and a start) under the writers, with a sent
    log of six days sealed into runs (the relays' upkeep, run here until done): its unlogged log
    comes back empty. New rows are delivered within seconds of the server accepting
    connections, while the whole journal is still being copied back: claims look the
    journal's unsealed tail and the runs up until the tail is copied back, then the runs.
    Ids acked six days ago and ids acked just before the crash, written again after it, are
    dropped; nothing is lost."""
    database = sa.make_url(postgresql_url).database or ""
    postgres.psql(f"ALTER DATABASE {database} SET synchronous_commit = on")  # as test 6
    age_sent_log(postgresql_url, AGED_ENTRIES)
    keeper = SentRuns(postgresql_url, settle_s=0.0)
    try:
        keeper.maintain()
    finally:
        keeper.close()
    engine = sa.create_engine(postgresql_url)
    try:
        with engine.connect() as conn:
            kept = conn.execute(sa.select(sa.func.sum(outbox_sent_runs.c.entries))).scalar()
    finally:
        engine.dispose()
    assert kept == AGED_ENTRIES, "six days as runs of level 1, merged into level 2"
    aged = [f"aged-{n}" for n in range(0, AGED_ENTRIES, AGED_ENTRIES // 50)]
    chosen: list[str] = []
    pause: list[float] = []
    states: list[SentLogState] = []

    def crash(_relays: list[FaultRelay]) -> float:
        engine = sa.create_engine(postgresql_url)
        try:
            with engine.connect() as conn:  # rows the relay is about to ack
                chosen.extend(conn.scalars(sa.select(outbox.c.message_id).limit(50)))
        finally:
            engine.dispose()
        wait_until(lambda: set(fates(postgresql_url, chosen).values()) == {"sent"}, 60, "acked")
        postgres.psql("CHECKPOINT")  # their acks durable (the relay commits asynchronously)
        postgres.stop("immediate")
        postgres.start()  # returns once it accepts connections
        accepting = time.time()
        marker = [{"message_id": "after-crash", "exchange": "faults", "payload": b"x"}]
        insert(postgresql_url, marker)
        sent = {"after-crash": "sent"}
        wait_until(lambda: fates(postgresql_url, ["after-crash"]) == sent, 120, "delivered")
        pause.append(time.time() - accepting)
        rebuild = SentLogRebuild(postgresql_url)
        try:  # delivered before the journal's million entries were copied back (seconds)
            states.append(rebuild.state())
        finally:
            rebuild.close()
        again = [*chosen, *aged]
        insert(
            postgresql_url,
            [{"message_id": m, "exchange": "faults", "payload": b"x"} for m in again],
        )
        return accepting

    def whole() -> None:  # the journal copied back: the log's entries are counted then
        rebuild = SentLogRebuild(postgresql_url)
        try:
            wait_until(rebuild.complete, 120, "the whole journal copied back")
        finally:
            rebuild.close()

    consumer, _ = scenario(
        "20-crash-aged-log",
        postgresql_url,
        fresh_broker.url,
        tmp_path,
        crash,
        after=whole,
        history=AGED_ENTRIES,
    )
    assert not any(m.startswith("aged-") for m in consumer.seen()), "an aged id published again"
    copies = collections.Counter(m for m, redelivered in consumer.deliveries if not redelivered)
    assert {m: copies[m] for m in chosen} == dict.fromkeys(chosen, 1), "published again"
    print(json.dumps({"scenario": "20-crash-aged-log", "pause_s": round(pause[0], 2)}))
    # Delivered while the tail was being copied back (incomplete: claims look it up) or
    # after (recovering), never only once the whole journal was.
    assert states != [SentLogState.COMPLETE], "new rows waited for the whole journal"
    assert pause[0] < CRASH_PAUSE_S, f"new rows waited {pause[0]:.1f} s after the crash"


@broker_bystander
def test_18_a_rolling_restart_of_three_relays_never_leaves_a_bucket_unowned_for_a_lease(
    postgresql_url: str, fresh_broker: RabbitNode, tmp_path: Path
) -> None:
    """Each of three relays stopped (SIGTERM) and replaced, one at a time, under the writers:
    nothing lost, nothing published twice, each key in order, and every bucket owned again
    within a lease of being given up."""
    engine = sa.create_engine(postgresql_url)
    owners = sa.select(outbox_buckets.c.bucket, outbox_buckets.c.owner)
    unowned_since: dict[int, float] = {}
    longest = [0.0]

    def watch_while(busy: threading.Thread) -> None:
        while busy.is_alive():
            now = time.monotonic()
            with engine.connect() as conn:
                for bucket, owner in conn.execute(owners):
                    if owner is None:
                        since = unowned_since.setdefault(bucket, now)
                        longest[0] = max(longest[0], now - since)
                    else:
                        unowned_since.pop(bucket, None)
            time.sleep(0.1)

    def roll(relays: list[FaultRelay]) -> float:
        def restart_each() -> None:
            for n in range(3):
                assert relays[n].stop(30) == 0
                relays.append(
                    FaultRelay(
                        f"18-next-{n}", tmp_path, postgresql_url, fresh_broker.url, ordering="true"
                    ).start()
                )
                wait_until(functools.partial(connected, relays[-1]), 30, "the new relay")
                time.sleep(1)

        rolling = threading.Thread(target=restart_each)
        rolling.start()
        watch_while(rolling)
        rolling.join()
        return time.time()

    consumer, _ = scenario(
        "18-rolling-restart",
        postgresql_url,
        fresh_broker.url,
        tmp_path,
        roll,
        relays=3,
        faults=0,
        ordering="true",
    )
    engine.dispose()
    assert out_of_key_order(consumer) == {}
    assert longest[0] < LEASE, f"a bucket unowned for {longest[0]:.1f} s"
