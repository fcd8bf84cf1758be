"""The documentation's examples run as written: each is taken from its page, not copied."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pika
import sqlalchemy as sa

from devtools.broker import names
from devtools.relayproc import RelayProcess, relay_env
from devtools.servers import RabbitNode, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs"


def first_python_block(page: str) -> str:
    text = (DOCS / page).read_text()
    found = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert found is not None, f"{page} has no python example"
    return found.group(1)


def test_the_inbox_pages_first_example_consumes_and_stops_on_sigterm(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    script = tmp_path / "consumer.py"
    script.write_text(first_python_block("inbox.md"))
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE payments (message_id TEXT PRIMARY KEY, body BLOB)"))
    _exchange, queue = names("docs")
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for n in range(3):
        properties = pika.BasicProperties(message_id=f"pay-{n}", delivery_mode=2)
        channel.basic_publish("", queue, f"{n}".encode(), properties)
    channel.basic_publish("", queue, b"0", pika.BasicProperties(message_id="pay-0"))  # again
    connection.close()
    env = relay_env(
        RELAY_DATABASE_URL=sqlite_url, RELAY_AMQP_URL=rabbit.url, RELAY_INBOX_QUEUE=queue
    )

    def paid() -> list[tuple[str, bytes]]:
        with engine.connect() as conn:
            query = sa.text("SELECT message_id, body FROM payments ORDER BY message_id")
            return [(m, bytes(b)) for m, b in conn.execute(query)]

    consumer = RelayProcess(env, tmp_path / "consumer.log", [sys.executable, str(script)])
    consumer.start()
    try:
        wait_until(lambda: len(paid()) == 3, 30, "three payments")
    finally:
        code = consumer.stop(30)
    assert code == 0, consumer.log()
    assert consumer.tracebacks() == []
    engine.dispose()
    assert paid() == [(f"pay-{n}", f"{n}".encode()) for n in range(3)]
