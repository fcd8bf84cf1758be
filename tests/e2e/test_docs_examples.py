"""The documentation's examples run as written: each is taken from its page, not copied."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pika
import pytest
import sqlalchemy as sa

from devtools.broker import names
from devtools.relayproc import RelayProcess, relay_env
from devtools.servers import RabbitNode, ServerError, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)


# The inbox page's examples, in their order: the blocking inbox, the asyncio one, FastStream.
INBOX_EXAMPLES = ("blocking", "asyncio", "faststream")


def test_the_inbox_page_has_its_examples() -> None:
    assert len(python_blocks("inbox.md")) == len(INBOX_EXAMPLES)


@pytest.mark.parametrize("example", INBOX_EXAMPLES)
def test_each_inbox_example_consumes_once_and_stops_on_sigterm(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path, example: str
) -> None:
    script = tmp_path / "consumer.py"
    script.write_text(python_blocks("inbox.md")[INBOX_EXAMPLES.index(example)])
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE payments (message_id TEXT PRIMARY KEY, body BLOB)"))
    _exchange, queue = names("docs")
    with pika.BlockingConnection(pika.URLParameters(rabbit.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for n in range(3):
            properties = pika.BasicProperties(message_id=f"pay-{n}", delivery_mode=2)
            channel.basic_publish("", queue, f"{n}".encode(), properties)
        again = pika.BasicProperties(message_id="pay-0")
        channel.basic_publish("", queue, b"0", again)
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
        try:
            wait_until(lambda: len(paid()) == 3, 30, "three payments")
        except ServerError as exc:  # the example's own log says why
            raise AssertionError(consumer.log()) from exc
    finally:
        code = consumer.stop(30)
    assert code == 0, consumer.log()
    assert consumer.tracebacks() == []
    engine.dispose()
    assert paid() == [(f"pay-{n}", f"{n}".encode()) for n in range(3)]
