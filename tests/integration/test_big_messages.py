"""Big messages, close to the broker's ``max_message_size``, and a mix of big and small: the
relay's memory is bounded by its byte budget, not by the backlog, and a healthy broker that
is slow only because the messages are big sets off no time-out and so no duplicate.

Seen before the byte budget: 600 rows of 1.5 MiB had the relay at 4.3 GB (claims of 500
rows fetched 750 MB at once), and two confirm time-outs republished 524 of them."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.broker import drain
from devtools.outbox import insert, statuses
from devtools.procfs import peak_rss_mb, rss_mb
from devtools.relayproc import RelayProcess, relay_on_new_queue
from devtools.scrape import answers_ok, http_get, metric
from devtools.servers import RabbitNode, free_port, wait_until
from tests.support.rabbitmq import RABBITMQ_3, rabbit_node, running

MIB = 1024**2
MAX_MESSAGE_SIZE = 4 * MIB
BIG = MAX_MESSAGE_SIZE - 64 * 1024  # close to the limit, with room for the properties
BIG_ROWS = 40  # 156 MiB in all: many times any budget below
SMALL_ROWS = 400


@pytest.fixture(scope="module")
def small_limit_rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A 3.10 node whose max_message_size is 4 MiB, so that "close to the limit" stays a
    test-sized amount of data (the defaults are 128 MiB on 3.10, 16 MiB on 4.0)."""
    node = rabbit_node(
        RABBITMQ_3, tmp_path_factory, "big", config=f"max_message_size = {MAX_MESSAGE_SIZE}\n"
    )
    yield from running(node)


def write_mixed(url: str, exchange: str) -> list[str]:
    """Big rows, each followed by ten small ones, in statements of a few rows (the writer's
    own memory stays small); returns the message ids."""
    ids: list[str] = []
    for b in range(BIG_ROWS):
        batch = [
            {
                "message_id": f"big-{b}",
                "exchange": exchange,
                "routing_key": "k",
                "payload": bytes([b]) * BIG,
            }
        ]
        batch += [
            {
                "message_id": f"small-{b}-{s}",
                "exchange": exchange,
                "routing_key": "k",
                "payload": b"s" * 200,
            }
            for s in range(SMALL_ROWS // BIG_ROWS)
        ]
        insert(url, batch)
        ids += [str(r["message_id"]) for r in batch]
    return ids


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param(2 * MIB, id="budget-below-one-row"),
        pytest.param(16 * MIB, id="budget-of-four-rows"),
    ],
)
def test_big_messages_are_relayed_once_each_within_the_memory_the_budget_allows(
    small_limit_rabbit: RabbitNode, postgresql_url: str, tmp_path: Path, budget: int
) -> None:
    rabbit = small_limit_rabbit
    port = free_port()
    exchange, queue, env = relay_on_new_queue(
        tmp_path,
        "big",
        postgresql_url,
        rabbit.url,
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_METRICS_PORT=str(port),
        RELAY_MAX_INFLIGHT_BYTES=str(budget),
        RELAY_LOG_FORMAT="json",
    )
    total = BIG_ROWS + SMALL_ROWS
    consumed: list[str] = []
    with RelayProcess(env, tmp_path / "relay.log") as relay:
        wait_until(lambda: answers_ok(f"http://127.0.0.1:{port}/readyz"), 60, "the relay ready")
        idle = rss_mb(relay.pid)
        # Consumed while it runs: 156 MiB left in a queue would raise the broker's memory
        # alarm on a small machine, and a blocked broker is not this test's subject.
        consumer = threading.Thread(
            target=lambda: consumed.extend(
                d.message_id for d in drain(rabbit.url, queue, expect=total, timeout=300)
            )
        )
        consumer.start()
        ids = write_mixed(postgresql_url, exchange)
        wait_until(lambda: statuses(postgresql_url).get("sent") == total, 240, "every row sent")
        exported = http_get(f"http://127.0.0.1:{port}/metrics")[1]
        peak = peak_rss_mb(relay.pid)
        assert relay.stop() == 0
        consumer.join()
    counts = Counter(consumed)
    duplicates = sum(counts.values()) - len(counts)
    timed_out = [line for line in relay.log().splitlines() if '"action": "confirm_timeout"' in line]
    print(
        f"budget {budget / MIB:g} MiB: relay RSS {idle:.0f} MiB idle, {peak:.0f} MiB peak; "
        f"{duplicates} duplicates; {len(timed_out)} confirm time-outs"
    )
    assert set(counts) == set(ids), "a row was not delivered"
    assert (duplicates, timed_out) == (0, [])
    assert metric(exported, "relay_held_bytes_limit") == budget
    # What the relay holds at once: the rows it claimed, up to the budget, and a claim's
    # worth on its way in (the driver's hex text, then the bytes): three budgets; and the
    # row on its way through (a claim's copies, pika's frames, the socket's buffer): a few
    # copies of the largest row, eight at most. Measured: 2 MiB, +24 MiB; 16 MiB, +48 MiB.
    bound = idle + (3 * budget + 8 * BIG) / MIB
    assert peak < bound, f"peak RSS {peak:.0f} MiB, bound {bound:.0f} MiB (idle {idle:.0f})"
    assert relay.tracebacks() == []
