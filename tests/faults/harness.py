"""The fault-injection harness: writers that keep inserting during a fault, relays as real
`relay run` subprocesses, a consumer that records every delivery, and the final check.

The ground truth is the outbox itself: every row in it was committed (a write whose commit
failed left nothing). A run passes when every row was consumed at least once, nothing was
consumed that is not a row, every row is sent, the duplicates stay within the bound, and
no relay logged a traceback.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pika
import pika.exceptions
import sqlalchemy as sa

from devtools.broker import write_topology
from devtools.outbox import fates, sent_logged, statuses
from devtools.relayproc import RELAY, RelayProcess, no_leaks, relay_env
from devtools.scrape import http_get, metric
from devtools.servers import ServerError, free_port, wait_until, wait_while_progressing
from relay.broker.topology import Binding, Exchange, Queue, Topology
from relay.db.schema import outbox
from relay.records import PENDING

EXCHANGE = "faults"
QUEUE = "faults.all"
WINDOW = 200
# Seconds: more than twice what a publish may take with the confirm timeout below
# (relay.lease.margin_for(1.5): 3.4 s), and short, since relays dead or frozen hold their
# buckets for a lease.
LEASE = 8.0
CONFIRM_TIMEOUT = 1.5
KEYS = 100  # ordering keys each writer spreads its rows over (each advances a row per round trip)
# Rows pending at most while the writers write: they wait while the outbox holds more, as an
# application with back-pressure would. Without it, on a busy machine the writers outran three
# ordered relays (300 keys, a row per key per round trip: 150 rows/s on MariaDB beside a CPU
# hog, against 550 written), the backlog never ended, and the test measured the machine.
BACKLOG = 25 * WINDOW
# How long the relays may make no progress at all on a backlog before a wait for it fails: a
# dead or frozen relay's buckets are another's a lease after its last turn, taken at a turn
# (a third of a lease) later. Waits on work itself have no deadline (``wait_while_progressing``).
STALL_S = 3 * LEASE


UNBOUND = "faults.nowhere"  # an exchange with no binding: everything sent there returns


def topology(queue_arguments: Mapping[str, object] | None = None) -> Topology:
    return Topology(
        exchanges=(Exchange(EXCHANGE, type="topic"), Exchange(UNBOUND, type="topic")),
        queues=(Queue(QUEUE, arguments=dict(queue_arguments or {})),),
        bindings=(Binding(EXCHANGE, QUEUE, "#"),),
    )


class FaultRelay(RelayProcess):
    """One `relay run` subprocess with settings fast enough for a bounded test; ``command``
    runs it otherwise (``tests/faults/frozen_turn.py``)."""

    def __init__(
        self,
        name: str,
        directory: Path,
        database_url: str,
        amqp_url: str,
        *,
        queue_arguments: Mapping[str, object] | None = None,
        command: Sequence[str] = (*RELAY, "run"),
        **settings: str,
    ) -> None:
        self.name = name
        self.metrics_port = free_port()
        topology_path = write_topology(directory / "topology.toml", topology(queue_arguments))
        env = relay_env(
            RELAY_DATABASE_URL=database_url,
            RELAY_AMQP_URL=amqp_url,
            RELAY_NAME=name,
            RELAY_TOPOLOGY_FILE=str(topology_path),
            RELAY_WINDOW=str(WINDOW),
            RELAY_CONFIRM_TIMEOUT=str(CONFIRM_TIMEOUT),
            RELAY_LEASE=str(LEASE),
            RELAY_BACKOFF_INITIAL="0.1",
            RELAY_BACKOFF_MAX="1",
            RELAY_RECONNECT_MAX="1",
            RELAY_POLL_INTERVAL="0.1",
            RELAY_MAX_ATTEMPTS="1000",
            RELAY_DRAIN_TIMEOUT="10",
            RELAY_STATS_INTERVAL="1",
            RELAY_METRICS_HOST="127.0.0.1",
            RELAY_METRICS_PORT=str(self.metrics_port),
            RELAY_LOG_FORMAT="json",
        )
        env.update({f"RELAY_{k.upper()}": v for k, v in settings.items()})
        super().__init__(env, directory / f"{name}.log", command)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def published(self) -> float:
        """Rows this relay has published (its counter)."""
        return metric(metrics_text(self), "relay_published_total")

    def stopped(self) -> bool:
        """Frozen: the kernel reports it stopped (SIGSTOP)."""
        assert self.proc is not None
        state = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "T"


class Writers:
    """``count`` threads, each inserting ``batch`` rows per transaction every ``pause``
    seconds until stopped, while fewer than ``backlog`` rows are pending; failed
    transactions are retried after a moment (the database may be down). Rows carry an
    ordering key, so that ordering can be checked."""

    def __init__(
        self,
        url: str,
        count: int = 3,
        batch: int = 10,
        pause: float = 0.02,
        backlog: int = BACKLOG,
    ) -> None:
        self.engine = sa.create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 2})
        self.count, self.batch, self.pause, self.backlog = count, batch, pause, backlog
        self._stop = threading.Event()
        self._room = threading.Event()
        self._room.set()
        self._threads = [
            threading.Thread(target=self._write, args=(n,), daemon=True) for n in range(count)
        ] + [threading.Thread(target=self._watch, daemon=True)]
        self.failures = 0
        self.run = uuid.uuid4().hex[:6]  # ids unique to this run, whatever a queue still holds

    def _write(self, writer: int) -> None:
        number = 0
        insert = sa.text(
            "INSERT INTO outbox (message_id, exchange, routing_key, payload, "
            "ordering_key) VALUES (:m, :x, 'k', :p, :key)"
        )
        while not self._stop.is_set():
            if not self._room.wait(0.1):
                continue
            rows = [
                {
                    "m": f"{self.run}.w{writer}-{number + i}",
                    "x": EXCHANGE,
                    "p": b"x" * 100,
                    "key": f"key-{(number + i) % KEYS}-{writer}",
                }
                for i in range(self.batch)
            ]
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert, rows)
                number += self.batch
            except sa.exc.SQLAlchemyError:
                self.failures += 1
                number += self.batch  # the ids may or may not have committed: never reuse
                time.sleep(0.2)
            time.sleep(self.pause)

    def _watch(self) -> None:
        """Lets the writers write while fewer than ``backlog`` rows are pending (and while
        the count fails: the database may be down, and their inserts fail anyway)."""
        pending = sa.select(sa.func.count()).where(outbox.c.status == PENDING)
        while not self._stop.is_set():
            try:
                with self.engine.connect() as conn:
                    room = conn.execute(pending).scalar_one() < self.backlog
            except sa.exc.SQLAlchemyError:
                room = True
            if room:
                self._room.set()
            else:
                self._room.clear()
            self._stop.wait(0.1)

    def __enter__(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.engine.dispose()


# The message id of ``Consumer.barrier``'s own messages, never a writer's.
BARRIER = "harness-barrier"


class Consumer:
    """Consumes the queue with manual acks into a record, reconnecting through outages."""

    def __init__(self, amqp_url: str, delay: float = 0.0) -> None:
        """``amqp_url``: one node, or several, comma-separated (the first that answers is
        used); ``delay``: seconds spent on each message (a slow consumer)."""
        self.nodes = [pika.URLParameters(u) for u in amqp_url.split(",")]
        self.delay = delay
        self.deliveries: list[tuple[str, bool]] = []  # (message_id, redelivered)
        self.barriers: set[str] = set()  # ``barrier``'s messages delivered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn = pika.BlockingConnection(self.nodes)
            except pika.exceptions.AMQPError:
                time.sleep(0.3)
                continue
            try:
                channel = conn.channel()
                channel.queue_declare(QUEUE, passive=True)  # as the relays declared it
                channel.basic_qos(prefetch_count=500)
                for method, props, _body in channel.consume(QUEUE, inactivity_timeout=0.2):
                    if self._stop.is_set():
                        break
                    if method is None:
                        continue
                    if props.message_id.startswith(BARRIER):
                        self.barriers.add(props.message_id)
                    else:
                        self.deliveries.append((props.message_id, method.redelivered))
                    if self.delay:
                        time.sleep(self.delay)
                    channel.basic_ack(method.delivery_tag)
            except pika.exceptions.AMQPError:
                time.sleep(0.3)
            finally:
                with contextlib.suppress(Exception):
                    conn.close()

    def __enter__(self) -> Consumer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def seen(self) -> set[str]:
        return {m for m, _ in list(self.deliveries)}

    def barrier(self, stall: float) -> None:
        """Until every message the queue took before now was delivered here: a message of
        the harness's own, published to the queue after them and confirmed, comes last (one
        queue, one consumer, in order). Fails once no delivery came for ``stall`` seconds."""
        marker = f"{BARRIER}-{uuid.uuid4().hex}"
        conn = pika.BlockingConnection(self.nodes)
        try:
            channel = conn.channel()
            channel.confirm_delivery()
            channel.basic_publish("", QUEUE, b"", pika.BasicProperties(message_id=marker))
        finally:
            conn.close()

        def left() -> int:  # fewer as deliveries come; none once the marker came
            return 0 if marker in self.barriers else 1_000_000_000 - len(self.deliveries)

        wait_while_progressing(left, stall, "every message before the barrier delivered")


@dataclass
class Outcome:
    scenario: str
    rows: int
    lost: int
    unknown: int
    duplicates: int
    recovery_s: float | None
    statuses: dict[str, int] = field(default_factory=dict)

    def report(self) -> None:
        line = json.dumps(self.__dict__)
        print(line)
        target = os.environ.get("FAULT_REPORT")
        if target:
            with open(target, "a") as f:
                f.write(line + "\n")


def recovered_at(url: str, since: float, before: float, stall: float = STALL_S) -> float:
    """Seconds after ``since`` (time.time()) until no row created before ``before`` is
    pending any more: however long draining them takes while they keep being sent (a busy
    machine's relays are slower, not stuck); failing once none has been for ``stall``
    seconds."""
    engine = sa.create_engine(url)
    pending = sa.select(sa.func.count()).where(
        outbox.c.status == PENDING, outbox.c.created_at < datetime.fromtimestamp(before, UTC)
    )
    what = "the rows written before the fault ended sent"
    try:

        def left() -> int:
            with engine.connect() as conn:
                return int(conn.execute(pending).scalar_one())

        wait_while_progressing(left, stall, what)
        return round(time.time() - since, 1)
    finally:
        engine.dispose()


def finish(
    scenario: str,
    url: str,
    consumer: Consumer,
    relays: list[FaultRelay],
    *,
    bound: int,
    recovery: float | None,
    parked: dict[str, str] | None = None,
    history: int = 0,
) -> Outcome:
    """Wait until no row is pending (with a deadline), then check everything. ``parked``:
    the rows that must end parked (never sent, never consumed), with a part of their
    reason; every other row must be sent and consumed. ``history``: sent log entries of
    messages sent before the run (a log aged by SQL), which nobody consumes."""
    wait_while_progressing(lambda: statuses(url).get("pending", 0), STALL_S, "rows pending")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        table = list(conn.execute(sa.text("SELECT message_id, status, last_error FROM outbox")))
    engine.dispose()
    parked = parked or {}
    ended_parked = {m: error for m, status, error in table if status == "parked"}
    assert set(ended_parked) == set(parked), sorted(set(ended_parked) ^ set(parked))[:10]
    for message_id, reason in parked.items():
        assert reason in ended_parked[message_id], (message_id, ended_parked[message_id])
    # Acked rows left the outbox for the sent log, which keeps their ids' keys only: the ids
    # the consumer saw are looked up there, and the log's entries nobody saw are lost rows.
    kept = {m for m, _, _ in table} - set(parked)
    logged = sent_logged(url) - history

    def sent(ids: set[str]) -> set[str]:
        return {m for m, status in fates(url, ids).items() if status == "sent"}

    def unseen() -> int:
        seen = consumer.seen()
        return len(kept - seen) + max(0, logged - len(sent(seen - kept)))

    with contextlib.suppress(ServerError):  # what was never consumed is reported below
        wait_while_progressing(unseen, STALL_S, "every row consumed", poll=1.0)
    # Late duplicates count too: once no relay has a publish unanswered, every copy it
    # published is in the queue, before the barrier's message.
    for relay in relays:
        if relay.running:
            answered = functools.partial(nothing_in_flight, relay)
            wait_until(answered, STALL_S, f"{relay.name}'s publishes answered")
    consumer.barrier(STALL_S)
    counts = collections.Counter(m for m, redelivered in consumer.deliveries if not redelivered)
    seen = consumer.seen()
    sent_seen = sent(seen - kept)
    rows = kept | sent_seen
    outcome = Outcome(
        scenario,
        len(kept) + logged + len(parked),
        len(kept - seen) + logged - len(sent_seen),
        len(seen - rows),
        sum(n - 1 for n in counts.values()),
        recovery,
        statuses(url),
    )
    outcome.report()
    assert outcome.lost == 0, sorted(rows - seen)[:10]
    assert outcome.unknown == 0, sorted(seen - rows)[:10]
    assert outcome.duplicates <= bound, outcome
    for relay in relays:
        code = relay.stop()
        if not relay.killed:
            assert code == 0, f"{relay.name} exited {code}"
        assert relay.tracebacks() == [], f"{relay.name} logged a traceback"
    return outcome


def out_of_key_order(consumer: Consumer) -> dict[str, list[int]]:
    """The keys whose deliveries (every one, duplicates included, but for the broker's own
    redeliveries to the consumer) went back in the key's order: a row after a later row of
    its key (A, B, A). A duplicate right after its first (A, A, B) is in order."""
    delivered: dict[str, list[int]] = collections.defaultdict(list)
    for message_id, redelivered in list(consumer.deliveries):
        if not redelivered:
            writer, number = message_id.split(".", 1)[1][1:].split("-")
            delivered[f"key-{int(number) % KEYS}-{writer}"].append(int(number))
    return {key: numbers for key, numbers in delivered.items() if numbers != sorted(numbers)}


def order_by_key(consumer: Consumer) -> dict[str, list[int]]:
    """Per writer and ordering key, the sequence numbers in the order first delivered."""
    firsts: dict[str, list[int]] = collections.defaultdict(list)
    done: set[str] = set()
    for message_id, _ in list(consumer.deliveries):
        if message_id in done:
            continue
        done.add(message_id)
        writer, number = message_id.split(".", 1)[1][1:].split("-")
        firsts[f"key-{int(number) % KEYS}-{writer}"].append(int(number))
    return firsts


Fault = Callable[[list[FaultRelay]], float]  # injects; returns when the recovery clock starts


def scenario(
    name: str,
    url: str,
    broker_url: str,
    tmp: Path,
    fault: Fault,
    *,
    relays: int = 1,
    faults: int = 1,
    relay_url: str = "",
    consumer_delay: float = 0.0,
    parked: dict[str, str] | None = None,
    after: Callable[[], None] | None = None,
    queue_arguments: Mapping[str, object] | None = None,
    duplicates: int | None = None,
    first_command: Sequence[str] | None = None,
    stall: float = STALL_S,
    history: int = 0,
    **settings: str,
) -> tuple[Consumer, list[FaultRelay]]:
    """Relays on the outbox at ``url`` and ``broker_url`` (one node, or several as
    ``RELAY_AMQP_URL`` takes them; ``relay_url`` instead for the relays only), writers and a
    consumer; ``fault`` while they run (once rows flow), the time until every row written
    before it returned is sent (for as long as they keep being sent: the wait fails once
    none has been for ``stall`` seconds), then ``after`` (while the writers still write),
    then the check. Duplicates are
    bounded by ``duplicates``, by default a window per fault and relay. ``first_command`` runs
    the first relay, the one under test: it then connects before the others start, so that it
    owns every bucket first and keeps the lowest, where the writers' first rows lie.
    ``history``: as ``finish`` takes it."""
    plain = (*RELAY, "run")
    commands = [first_command or plain, *[plain] * (relays - 1)]
    running = [
        FaultRelay(
            f"{name}-{n}",
            tmp,
            url,
            relay_url or broker_url,
            queue_arguments=queue_arguments,
            command=command,
            **settings,
        )
        for n, command in enumerate(commands)
    ]
    try:
        if first_command is not None:
            running[0].start()
            wait_until(functools.partial(connected, running[0]), 60, "the relay under test")
        for relay in running:
            if not relay.running:
                relay.start()
        for relay in running:
            wait_until(functools.partial(connected, relay), 60, f"{relay.name} connected")
        with Consumer(broker_url, consumer_delay) as consumer:
            with Writers(url) as writers:
                flowing = writers.count * writers.batch
                wait_until(lambda: len(consumer.deliveries) >= flowing, 60, "rows flowing")
                restored = fault(running)
                recovery = recovered_at(url, restored, restored, stall)
                if after is not None:
                    after()
                # And still flowing after: as many rows delivered again as at the start.
                after_at = len(consumer.deliveries) + flowing
                wait_while_progressing(
                    lambda: max(0, after_at - len(consumer.deliveries)),
                    STALL_S,
                    "rows flowing after",
                )
            finish(
                name,
                url,
                consumer,
                running,
                bound=faults * relays * WINDOW if duplicates is None else duplicates,
                recovery=recovery,
                parked=parked,
                history=history,
            )
    finally:
        for relay in running:
            if relay.running:
                relay.end()
    for relay in running:
        no_leaks(relay.command, relay.log())
    return consumer, running


def scrape(relay: FaultRelay) -> tuple[int, str]:
    """(status, text) of ``relay``'s /metrics; status 0 when it does not answer."""
    return http_get(f"http://127.0.0.1:{relay.metrics_port}/metrics")


def metrics_text(relay: FaultRelay) -> str:
    return scrape(relay)[1]


def nothing_in_flight(relay: FaultRelay) -> bool:
    """No row ``relay`` published is waiting for the broker's answer (its gauge); False
    while its /metrics does not answer (a loaded machine's slow scrape), to look again."""
    status, text = scrape(relay)
    return status == 200 and metric(text, "relay_in_flight") == 0


def connected(relay: FaultRelay) -> bool:
    return "relay_broker_connected 1.0" in metrics_text(relay)
