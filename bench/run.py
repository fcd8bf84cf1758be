"""Benchmark: the relay against a bare publisher and a naive relay, same broker, same run,
and where each row's CPU time goes.

    .venv/bin/python -m bench.run [--rows 100000] [--naive-rows 5000] [--backlog-rows 1000000]
                                  [--scaling] [--rounds 1] [--profile DIR]
                                  [--broker 3.10|4.0|4.0-cluster] [--quorum] [--tracing]
                                  [--payload-bytes 200] [--database postgresql|mariadb]
                                  [--also CHECKOUT ...]

Starts a private RabbitMQ node and a private PostgreSQL, or with --database mariadb a private
MariaDB (default durability settings either way), and
measures, with 200-byte persistent messages into one durable queue and the same window:
  (a) a bare pika asynchronous publisher with confirms (no database at all), twice: with
      lean messages (delivery mode and content type), and (a2) with the messages the
      relay sends (also a message id, a timestamp, and ``mandatory``): c/a2 is what the
      relay itself costs, c/a also what its messages cost the broker,
  (b) a naive relay: claim one row, publish, wait for its confirm, mark it sent,
  (c) ``relay run`` end to end, from committed outbox rows to rows marked sent, on
      that database and on SQLite; with --scaling also 2 and 3 relays on it; with
      --backlog-rows also one relay over a backlog that large, with its peak RSS, and the
      bare publisher of the relay's messages with as many messages (the queue, which no
      one consumes, grows as large and costs the broker more per message).
Each relay case starts the relays on an empty outbox, waits until they are ready, then
commits the whole backlog in one transaction: the clock runs from that commit to the last
row's ``sent_at`` (recorded after its ack), as the bare publisher's runs from its open
channel to its last confirm; neither counts start-up.

For each case the table shows CPU seconds per 1,000 rows (from /proc) of the publishing
process (the relays, or this process for (a) and (b)), the broker and the database server
(every process of each server, its exited children included). --rounds N measures every case N
times, interleaved, and shows the median (these machines' speed drifts by 20% within
minutes). --profile DIR then records one more PostgreSQL relay case with py-spy (``pip
install py-spy``) into DIR and prints the functions holding most samples. The last line is
one JSON object with every figure. By hand only: these machines are shared and noisy.

The broker is Debian 12's RabbitMQ 3.10 unless --broker says 4.0 (one node) or 4.0-cluster
(three nodes; the relays get every node's URL, and every publisher starts with the first);
both run from the Debian 13 root the tests build (``devtools.debian13``, root only).
--quorum makes the queue a quorum queue (three replicas on the cluster). The broker's CPU is
every node's.

--also CHECKOUT (repeatable) adds the PostgreSQL relay case run from another checkout (a git
worktree of an earlier commit, say) to the same interleaved rounds: a change's effect, measured
against its base in one run.

--payload-bytes sets the messages' size (200 by default). Every relay case then reports MB/s,
its peak RSS (VmHWM) and the rows it published more than once (``relay_republished_total``:
none is due without faults). The bare publishers keep as many bytes outstanding as the
relay's default byte budget allows (``RELAY_MAX_INFLIGHT_BYTES``), at most WINDOW messages:
the same flow control, or 1,000 messages of 1.5 MiB would be 1.5 GB in their buffers.

--tracing measures what OpenTelemetry tracing costs instead: the PostgreSQL relay case with
tracing off, then with OTLP/HTTP export to a receiver in this process (which reads each
request and answers, decoding nothing: a collector's work is not the relay's). Every row of
the three cases carries a writer's ``traceparent``: ``traced_all`` samples every row (the writers'
contexts are all sampled), ``traced_1pct`` samples parent-based at 1% (1% of the writers'
contexts are sampled, and rows without one at a ratio of 0.01).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pika
import sqlalchemy as sa
from pika.adapters.asyncio_connection import AsyncioConnection

from devtools import debian13
from devtools.broker import fresh_queue
from devtools.otlp import OtlpReceiver
from devtools.outbox import empty, owners
from devtools.procfs import peak_rss_mb, thread_cpu_seconds, tree_cpu_seconds
from devtools.profiling import Profiler
from devtools.relayproc import RELAY, RelayProcess, relay_env, relay_from
from devtools.scrape import answers_ok, http_get, metric
from devtools.servers import (
    MariaDBServer,
    PostgresServer,
    RabbitCluster,
    RabbitNode,
    free_port,
    wait_until,
)
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.db.schema import outbox, outbox_sent
from relay.settings import Settings

BODY = b"x" * 200
WINDOW = 1000
QUEUE = "bench"
FILL_CHUNK = 20_000  # rows per INSERT statement while filling the backlog
FILL_CHUNK_BYTES = 64 * 1024**2  # and payload bytes per statement, for big messages


BROKERS = ("3.10", "4.0", "4.0-cluster")
DATABASES = ("postgresql", "mariadb")
QUORUM: dict[str, object] = {"x-queue-type": "quorum"}


@dataclass
class Servers:
    nodes: list[RabbitNode]
    db: PostgresServer | MariaDBServer
    queue_arguments: dict[str, object] | None = None

    @property
    def url(self) -> str:
        """Where every publisher starts: the first node."""
        return self.nodes[0].url

    def fresh_queue(self) -> None:
        fresh_queue(self.url, QUEUE, self.queue_arguments)

    def cpu(self, publisher: Callable[[], float]) -> dict[str, float]:
        return {
            "publisher": publisher(),
            "broker": sum(tree_cpu_seconds(node.beam_pid()) for node in self.nodes),
            "database": tree_cpu_seconds(self.db.pid()),
        }


def broker(kind: str, base: Path) -> tuple[list[RabbitNode], Callable[[], None]]:
    """The nodes of ``kind`` (one of BROKERS), not started, and how to start them."""
    if kind == "3.10":
        node = RabbitNode(base / "rabbit", name="relay-bench")
        return [node], node.start
    if (reason := debian13.unavailable()) is not None:
        raise SystemExit(f"--broker {kind}: {reason}")
    root = debian13.ensure_root()
    if kind == "4.0":
        node = RabbitNode(base / "rabbit", name="relay-bench", root=root)
        return [node], node.start
    cluster = RabbitCluster(base / "cluster", name="relay-bench", root=root)
    return cluster.nodes, cluster.start


@dataclass
class Case:
    rows: int
    seconds: float
    cpu: dict[str, float]  # CPU seconds per 1,000 rows, by process
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


@contextmanager
def metered(
    servers: Servers, publisher: Callable[[], float], rows: int
) -> Iterator[dict[str, float]]:
    """CPU seconds per 1,000 rows used between entering and leaving, filled in on leaving."""
    per_1k: dict[str, float] = {}
    before = servers.cpu(publisher)
    yield per_1k
    after = servers.cpu(publisher)
    per_1k.update({k: (after[k] - before[k]) * 1000 / rows for k in before})


def own_cpu() -> float:
    return time.process_time()


def bare_publisher(
    servers: Servers,
    count: int,
    *,
    relay_messages: bool = False,
    body: bytes = BODY,
    budget: int | None = None,
) -> Case:
    """(a) pika's asynchronous API, confirm mode, up to WINDOW confirms outstanding (fewer
    for big messages: see the module docstring); with ``relay_messages`` (a2), each message
    has the properties and flag the relay publishes."""
    budget = budget or Settings.load({}).max_inflight_bytes
    window = min(WINDOW, max(1, budget // len(body)))

    async def run() -> Case:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        opened: asyncio.Future[object] = loop.create_future()
        state = {"sent": 0, "confirmed": 0}
        lean = pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream")
        channel: list[object] = []

        def props(n: int) -> pika.BasicProperties:
            if not relay_messages:
                return lean
            return pika.BasicProperties(
                delivery_mode=2,
                content_type="application/octet-stream",
                message_id=f"b-{n}",
                timestamp=int(time.time()),
            )

        def pump() -> None:
            ch = channel[0]
            while state["sent"] < count and state["sent"] - state["confirmed"] < window:
                state["sent"] += 1
                ch.basic_publish(  # type: ignore[attr-defined]
                    "", QUEUE, body, props(state["sent"]), mandatory=relay_messages
                )

        def on_confirm(frame: object) -> None:
            method = frame.method  # type: ignore[attr-defined]
            if method.multiple:
                state["confirmed"] = method.delivery_tag
            else:
                state["confirmed"] += 1
            if state["confirmed"] >= count and not done.done():
                done.set_result(None)
            pump()

        def on_channel(ch: object) -> None:
            channel.append(ch)
            ch.confirm_delivery(on_confirm, callback=lambda _f: opened.set_result(ch))  # type: ignore[attr-defined]

        conn = AsyncioConnection(
            pika.URLParameters(servers.url),
            on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
            custom_ioloop=loop,
        )
        await opened
        with metered(servers, own_cpu, count) as cpu:
            start = time.perf_counter()
            pump()
            await done
            elapsed = time.perf_counter() - start
        conn.close()
        return Case(count, elapsed, cpu)

    return asyncio.run(run())


def fill(engine: sa.Engine, count: int, sampled_every: int = 0, body: bytes = BODY) -> datetime:
    """Commit ``count`` due rows in one transaction; the moment it committed. With
    ``sampled_every``, each row has a writer's traceparent, sampled on every n-th row."""
    now = datetime.now(UTC)
    chunk = max(1, min(FILL_CHUNK, FILL_CHUNK_BYTES // len(body)))
    with engine.begin() as conn:
        for start in range(0, count, chunk):
            rows = [
                {
                    "message_id": f"b-{i}",
                    "routing_key": QUEUE,
                    "payload": body,
                    "content_type": "application/octet-stream",
                    "created_at": now,
                    "next_attempt_at": now,
                    "headers": _traceparent(i, sampled_every) if sampled_every else None,
                }
                for i in range(start, min(count, start + chunk))
            ]
            conn.execute(sa.insert(outbox), rows)
    return datetime.now(UTC)


def _traceparent(i: int, sampled_every: int) -> str:
    flags = "01" if i % sampled_every == 0 else "00"
    return json.dumps({"traceparent": f"00-{i + 1:032x}-{i + 1:016x}-{flags}"})


def naive_relay(servers: Servers, database_url: str, count: int, body: bytes = BODY) -> Case:
    """(b) one row at a time: claim, publish, block until its confirm, mark sent."""
    engine = create_engine(database_url)
    empty(engine)
    fill(engine, count, body=body)
    conn = pika.BlockingConnection(pika.URLParameters(servers.url))
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    with metered(servers, own_cpu, count) as cpu:
        start = time.perf_counter()
        while True:
            with engine.begin() as db:
                row = db.execute(
                    sa.select(outbox.c.id, outbox.c.payload, outbox.c.message_id)
                    .where(outbox.c.status == "pending")
                    .order_by(outbox.c.id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                ).first()
                if row is None:
                    break
                ch.basic_publish("", QUEUE, row.payload, props, mandatory=True)
                db.execute(
                    sa.update(outbox)
                    .where(outbox.c.id == row.id)
                    .values(status="sent", sent_at=datetime.now(UTC))
                )
        elapsed = time.perf_counter() - start
    conn.close()
    engine.dispose()
    return Case(count, elapsed, cpu)


def drained(engine: sa.Engine) -> bool:
    """No pending row left: a probe of the partial index, cheap enough to poll while
    measuring (a count over the whole table would load the database under test)."""
    with engine.connect() as conn:
        q = sa.select(outbox.c.id).where(outbox.c.status == "pending").limit(1)
        return conn.execute(q).first() is None


def this_relay(
    servers: Servers,
    database_url: str,
    count: int,
    *,
    relays: int = 1,
    profile: Path | None = None,
    tracing: dict[str, str] | None = None,
    sampled_every: int = 0,
    body: bytes = BODY,
    budget: int | None = None,
    tree: Path | None = None,
) -> Case:
    """(c) ``relay run`` as ``relays`` subprocesses, from the backlog's commit to its last
    row's ``sent_at``; with the first relay's peak RSS and the rows republished. ``tree``:
    the relay of that checkout instead of this one (``--also``)."""
    engine = create_engine(database_url)
    empty(engine)
    ports = [free_port() for _ in range(relays)]
    env = relay_env(
        RELAY_DATABASE_URL=database_url,
        RELAY_AMQP_URL=",".join(node.url for node in servers.nodes),
        RELAY_WINDOW=str(WINDOW),
        RELAY_LOG_LEVEL="warning",
        **({"RELAY_MAX_INFLIGHT_BYTES": str(budget)} if budget else {}),
        **(tracing or {}),
    )
    command = (*RELAY, "run") if tree is None else relay_from(tree)
    procs = [
        RelayProcess(
            {**env, "RELAY_NAME": f"bench-{n}", "RELAY_METRICS_PORT": str(port)},
            command=command,
        ).start()
        for n, port in enumerate(ports)
    ]
    try:
        for port in ports:
            ready = f"http://127.0.0.1:{port}/readyz"
            wait_until(functools.partial(answers_ok, ready), 60, "the relay ready")
        # Relays that start together share the buckets out over two turns (relay.buckets).
        wait_until(lambda: len(owners(engine)) == relays, 60, "the buckets shared out")
        profiler = Profiler(procs[0].pid, profile) if profile is not None else None
        relay_cpu = lambda: sum(tree_cpu_seconds(p.pid) for p in procs)  # noqa: E731
        committed = fill(engine, count, sampled_every, body)
        threads_before = thread_cpu_seconds(procs[0].pid)
        with metered(servers, relay_cpu, count) as cpu:
            while not drained(engine):
                if not all(p.running for p in procs):
                    raise RuntimeError("a relay exited")
                time.sleep(0.1)
        threads = {
            tid: (seconds - threads_before.get(tid, 0.0)) * 1000 / count
            for tid, seconds in thread_cpu_seconds(procs[0].pid).items()
        }
        with engine.connect() as conn:
            # Acked rows leave the outbox for the sent log (RELAY_KEEP_SENT=ids).
            last = conn.execute(sa.select(sa.func.max(outbox_sent.c.sent_at))).scalar_one()
            # The rows one settle statement acks share its time (the statement's, to the
            # microsecond): about how many settles there were.
            settle_times = sa.select(sa.func.count(sa.distinct(outbox_sent.c.sent_at)))
            settles = conn.execute(settle_times).scalar_one()
        republished = sum(
            metric(http_get(f"http://127.0.0.1:{port}/metrics")[1], "relay_republished_total")
            for port in ports
        )
        extra = {
            "peak_rss_mb": peak_rss_mb(procs[0].pid),
            "republished": republished,
            # The first relay's CPU s per 1,000 rows: its event loop's thread (the publisher,
            # the loop) and the others (the database calls' worker threads, the metrics).
            "loop_cpu": threads.pop(procs[0].pid, 0.0),
            "other_threads_cpu": sum(threads.values()),
            "rows_per_settle": count / max(1, settles),
        }
        if profiler is not None:
            print(f"\nrelay profile (py-spy, {profile}): % of samples on top / anywhere")
            for function, top, anywhere in profiler.stop():
                print(f"  {top:5.1f} {anywhere:5.1f}  {function}")
    finally:
        for proc in procs:
            proc.stop()
        engine.dispose()
    return Case(count, (last - committed).total_seconds(), cpu, extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--naive-rows", type=int, default=5_000)
    parser.add_argument(
        "--backlog-rows",
        type=int,
        default=0,
        help="also drain a backlog this large on PostgreSQL and report peak RSS",
    )
    parser.add_argument(
        "--scaling", action="store_true", help="also drain --rows with 2 and 3 relays"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure every case this often; medians shown"
    )
    parser.add_argument(
        "--profile", type=Path, help="then record one PostgreSQL relay case with py-spy into DIR"
    )
    parser.add_argument("--broker", choices=BROKERS, default=BROKERS[0])
    parser.add_argument("--quorum", action="store_true", help="into a quorum queue")
    parser.add_argument(
        "--tracing", action="store_true", help="measure tracing's cost instead (see above)"
    )
    parser.add_argument(
        "--payload-bytes", type=int, default=len(BODY), help="the messages' size (see above)"
    )
    parser.add_argument(
        "--database", choices=DATABASES, default=DATABASES[0], help="the outbox's server"
    )
    parser.add_argument(
        "--max-inflight-bytes",
        type=int,
        help="the relays' RELAY_MAX_INFLIGHT_BYTES, and the bare publishers' byte window",
    )
    parser.add_argument(
        "--also",
        type=Path,
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="also the relay of that checkout (a git worktree), in the same interleaved rounds",
    )
    args = parser.parse_args()
    if args.tracing and args.database != "postgresql":
        parser.error("--tracing measures the PostgreSQL relay only")
    body = b"x" * args.payload_bytes
    load = {"body": body, "budget": args.max_inflight_bytes}
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[Case]] = {}
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp, ExitStack() as stack:
        base = Path(tmp)
        nodes, start_broker = broker(args.broker, base)
        db = args.database
        server = PostgresServer(base / "pg") if db == "postgresql" else MariaDBServer(base / "db")
        servers = Servers(nodes, server, QUORUM if args.quorum else None)
        start_broker()
        server.start()
        try:
            server.create_database("bench")
            db_url = server.url("bench")
            sqlite_url = f"sqlite:///{base / 'bench.db'}"
            for url in (db_url, sqlite_url):
                migrate(url)
            cases: dict[str, Callable[[], Case]] = {
                "bare_publisher": lambda: bare_publisher(servers, args.rows, **load),
                "bare_publisher_relay_messages": lambda: bare_publisher(
                    servers, args.rows, relay_messages=True, **load
                ),
                f"naive_relay_{db}": lambda: naive_relay(servers, db_url, args.naive_rows, body),
                f"relay_{db}": lambda: this_relay(servers, db_url, args.rows, **load),
                "relay_sqlite": lambda: this_relay(servers, sqlite_url, args.rows, **load),
            }
            for tree in args.also:
                cases[f"relay_{db}@{tree.name}"] = functools.partial(
                    this_relay, servers, db_url, args.rows, tree=tree, **load
                )
            if args.tracing:
                cases = tracing_cases(servers, db_url, args.rows, stack)
            for relays in (2, 3) if args.scaling else ():
                cases[f"relay_{db}_{relays}_relays"] = functools.partial(
                    this_relay, servers, db_url, args.rows, relays=relays, **load
                )
            for _ in range(args.rounds):
                for name, measure in cases.items():
                    servers.fresh_queue()
                    results.setdefault(name, []).append(measure())
            if args.profile is not None:
                servers.fresh_queue()
                this_relay(servers, db_url, args.rows, profile=args.profile / "relay.txt", **load)
            if args.backlog_rows:
                servers.fresh_queue()
                results["bare_publisher_relay_messages_backlog"] = [
                    bare_publisher(servers, args.backlog_rows, relay_messages=True, **load)
                ]
                servers.fresh_queue()
                results[f"relay_{db}_backlog"] = [
                    this_relay(servers, db_url, args.backlog_rows, **load)
                ]
        finally:
            for node in servers.nodes:
                node.stop()
            server.stop()
    report(results, args)
    return 0


def tracing_cases(
    servers: Servers, database_url: str, rows: int, stack: ExitStack
) -> dict[str, Callable[[], Case]]:
    """The relay with tracing off, sampling everything, and sampling 1% (parent-based)."""
    receiver = OtlpReceiver(decode=False)
    stack.callback(receiver.stop)
    otlp = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint,
    }
    one_percent = {
        **otlp,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    }
    relay = functools.partial(this_relay, servers, database_url, rows)
    return {
        "bare_publisher": lambda: bare_publisher(servers, rows),
        "bare_publisher_relay_messages": lambda: bare_publisher(servers, rows, relay_messages=True),
        "naive_relay_postgresql": lambda: naive_relay(servers, database_url, 1000),
        "relay_postgresql": lambda: relay(sampled_every=100),  # the same rows, tracing off
        "relay_postgresql_traced_all": lambda: relay(tracing=otlp, sampled_every=1),
        "relay_postgresql_traced_1pct": lambda: relay(tracing=one_percent, sampled_every=100),
    }


def median_case(cases: list[Case]) -> Case:
    """The median rate's case (the lower of two middle ones), with the median CPU of each
    process over every round."""
    chosen = sorted(cases, key=lambda c: c.rate)[(len(cases) - 1) // 2]
    cpu = {k: statistics.median(c.cpu[k] for c in cases) for k in chosen.cpu}
    return Case(chosen.rows, chosen.seconds, cpu, chosen.extra)


def report(measured: dict[str, list[Case]], args: argparse.Namespace) -> None:
    results = {name: median_case(cases) for name, cases in measured.items()}
    db = args.database
    a, b = results["bare_publisher"].rate, results[f"naive_relay_{db}"].rate
    a2 = results["bare_publisher_relay_messages"].rate
    print(
        f"\n{'measure':<32} {'rows':>8} {'rows/s':>8} {'MB/s':>7} {'c/a':>5} {'c/a2':>5} "
        f"{'c/b':>6}   CPU s per 1k rows: publisher broker   database   peak RSS MB, republished"
    )
    queue = "quorum" if args.quorum else "classic"
    summary: dict[str, object] = {
        "window": WINDOW,
        "body_bytes": args.payload_bytes,
        "rounds": args.rounds,
        "broker": args.broker,
        "queue": queue,
        "database": db,
    }
    for name, case in results.items():
        relay = name.startswith("relay_")
        ratios = (
            f"{case.rate / a:>5.2f} {case.rate / a2:>5.2f} {case.rate / b:>6.1f}"
            if relay
            else " " * 18
        )
        cpu = case.cpu
        mb_per_s = case.rate * args.payload_bytes / 1e6
        held = (
            f"   {case.extra['peak_rss_mb']:>6.0f} {case.extra['republished']:>6.0f}"
            if relay
            else ""
        )
        print(
            f"{name:<32} {case.rows:>8} {case.rate:>8.0f} {mb_per_s:>7.1f} {ratios}   "
            f"{cpu['publisher']:>9.3f} {cpu['broker']:>6.3f} {cpu['database']:>10.3f}{held}"
        )
        entry: dict[str, object] = {
            "rows": case.rows,
            "rows_per_s": round(case.rate, 1),
            "mb_per_s": round(mb_per_s, 2),
            "rows_per_s_each_round": [round(c.rate, 1) for c in measured[name]],
            "cpu_s_per_1k_rows": {k: round(v, 4) for k, v in cpu.items()},
            **{k: round(v, 4 if k.endswith("_cpu") else 1) for k, v in case.extra.items()},
        }
        if relay:
            entry.update(
                over_bare=round(case.rate / a, 3),
                over_bare_relay_messages=round(case.rate / a2, 3),
                over_naive=round(case.rate / b, 1),
            )
        summary[name] = entry
    for name, case in results.items():
        if "loop_cpu" in case.extra:
            loop, others = case.extra["loop_cpu"], case.extra["other_threads_cpu"]
            print(
                f"{name}: CPU s per 1k rows in its event loop's thread {loop:.3f}, "
                f"in its other threads {others:.3f} (the first relay's); "
                f"{case.extra['rows_per_settle']:.0f} rows per settle"
            )
    print(
        f"(medians of {args.rounds} round(s); window {WINDOW}; {args.payload_bytes}-byte "
        "persistent "
        f"messages into one durable {queue} queue on RabbitMQ {args.broker}; publisher: the "
        "relays, or this process for the bare publisher and the naive relay)"
    )
    if "relay_postgresql_traced_all" in results:
        off = results["relay_postgresql"].rate
        for name in ("relay_postgresql_traced_all", "relay_postgresql_traced_1pct"):
            ratio = results[name].rate / off
            print(f"{name} over tracing off: {ratio:.2f}")
            summary[name]["over_tracing_off"] = round(ratio, 3)  # type: ignore[index]
    if f"relay_{db}_backlog" in results:
        backlog = results[f"relay_{db}_backlog"]
        over_rows = backlog.rate / results[f"relay_{db}"].rate
        over_bare = backlog.rate / results["bare_publisher_relay_messages_backlog"].rate
        print(
            f"draining {args.backlog_rows} rows: {over_rows:.2f} of the relay's rate over "
            f"{args.rows}, {over_bare:.2f} of the bare publisher's over as many messages; "
            f"peak RSS {backlog.extra['peak_rss_mb']:.0f} MB"
        )
        summary[f"relay_{db}_backlog"].update(  # type: ignore[attr-defined]
            over_relay=round(over_rows, 3), over_bare_backlog=round(over_bare, 3)
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
