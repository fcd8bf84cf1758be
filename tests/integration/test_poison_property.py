"""Property: whatever a writer puts in the outbox's columns, the row ends sent or parked, it is
parked only if it truly cannot be published, and the relay never dies.

Rows with arbitrary values in every column (lengths around and past every limit, any text,
any bytes, arbitrary JSON headers with deep nesting, huge and tiny numbers, doubles, nulls,
trailing spaces; on SQLite also values of other storage classes and text that is not UTF-8)
are written by plain SQL on each database and relayed by a `relay run` subprocess through
the real broker. The oracle is independent of the relay's code: it knows which values the
generator made past which documented limit. What a database refuses to store (MariaDB's
strict mode and a text over 255 characters) its writer learns at once: such a row never
exists, and the oracle says which do not.

Bounded for CI (a few dozen examples); set POISON_EXAMPLES for a longer run.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pika
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.outbox import fates
from devtools.relayproc import RelayProcess, relay_on_new_queue
from devtools.servers import RabbitNode, wait_until

EXAMPLES = int(os.environ.get("POISON_EXAMPLES", "25"))
SHORT = 255  # AMQP short strings, bytes
DEPTH = 32  # documented header nesting limit


# PostgreSQL and UTF-8 cannot hold a lone surrogate.
SURROGATES: tuple[Literal["Cs"]] = ("Cs",)


def utf8(text: str) -> int:
    return len(text.encode())


def around_limit(min_size: int = 0) -> st.SearchStrategy[str]:
    """Text whose UTF-8 length is often near 255 bytes, or with trailing spaces (one value to
    a PAD SPACE collation); never NUL (PostgreSQL refuses it)."""
    alphabet = st.characters(exclude_categories=SURROGATES, exclude_characters="\x00")
    near = st.integers(240, 270).flatmap(lambda n: st.just("é" * (n // 2) + "x" * (n % 2)))
    spaced = st.text(alphabet, max_size=5).map(lambda t: t + "  ")
    return st.one_of(st.text(alphabet, min_size=min_size, max_size=20), near, spaced)


class AsText(bytes):
    """Bytes a writer stores as SQLite TEXT (``CAST(... AS TEXT)``): not UTF-8, as a C or Go
    program may write them."""


def json_values(depth: int) -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(st.characters(exclude_categories=SURROGATES), max_size=10),
    )
    if depth <= 0:
        return leaves
    keys = st.one_of(st.text(max_size=5), st.just("k" * 256))
    inner = json_values(depth - 1)
    return st.one_of(leaves, st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3))


@dataclass
class Headers:
    text: str | None
    publishable: bool


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def too_deep(value: Any, depth: int = 1) -> bool:
    """Tables and arrays count one level each, the outermost table being level 1."""
    if depth > DEPTH:
        return True
    children = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict | list):
        return any(too_deep(v, depth + 1) for v in children if isinstance(v, dict | list))
    return False


def within_limits(value: Any) -> bool:
    if isinstance(value, bool) or value is None or isinstance(value, float | str):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    if isinstance(value, list):
        return all(within_limits(v) for v in value)
    return all(utf8(k) <= SHORT and within_limits(v) for k, v in value.items())


@st.composite
def headers(draw: st.DrawFn) -> Headers:
    kind = draw(st.sampled_from(["none", "object", "deep", "not json", "not an object"]))
    if kind == "none":
        return Headers(None, True)
    if kind == "not json":
        return Headers(draw(st.sampled_from(["{", "NaN", '{"a": Infinity}', "x"])), False)
    if kind == "not an object":
        return Headers(json.dumps(draw(st.lists(st.integers(), max_size=2))), False)
    if kind == "deep":
        levels = draw(st.integers(DEPTH - 1, DEPTH + 2))
        return Headers(json.dumps(nested(levels)), levels <= DEPTH)
    value = draw(st.dictionaries(st.text(max_size=8), json_values(3), max_size=4))
    return Headers(json.dumps(value), within_limits(value) and not too_deep(value))


@dataclass
class Row:
    tail: str  # the message id after a unique prefix, often near the 255-byte limit
    values: dict[str, Any]
    publishable: bool  # apart from the message id

    def with_id(self, prefix: str) -> tuple[str, dict[str, Any], bool]:
        message_id = f"{prefix}-{self.tail}"
        ok = self.publishable and utf8(message_id) <= SHORT
        return message_id, {**self.values, "message_id": message_id}, ok


def stored(values: dict[str, Any], database: str) -> bool:
    """Whether ``database`` (a backend's name) stores the row: MariaDB's short texts are
    VARCHAR(255) in strict mode, which refuses a longer value."""
    if database != "mysql":
        return True
    short = ("message_id", "exchange", "routing_key", "content_type")
    return all(len(values[c]) <= SHORT for c in short)


def write(engine: sa.Engine, values: dict[str, Any]) -> None:
    """One row by plain SQL (``devtools.outbox.insert``'s way), an ``AsText`` value cast."""
    given = [f"CAST(:{c} AS TEXT)" if type(v) is AsText else f":{c}" for c, v in values.items()]
    statement = f"INSERT INTO outbox ({', '.join(values)}) VALUES ({', '.join(given)})"
    plain = {c: bytes(v) if type(v) is AsText else v for c, v in values.items()}
    with engine.begin() as conn:
        conn.execute(sa.text(statement), plain)


@st.composite
def rows(draw: st.DrawFn, exchange: str, sqlite: bool) -> Row:
    tail = draw(around_limit())
    routing_key = draw(around_limit())
    content_type = draw(around_limit())
    use_exchange = draw(st.sampled_from([exchange, exchange + "x" * 250]))
    payload: Any = draw(st.binary(max_size=2000))
    header = draw(headers())
    values = {
        "exchange": use_exchange,
        "routing_key": routing_key,
        "content_type": content_type,
        "payload": payload,
        "headers": header.text,
    }
    readable = True
    if sqlite:  # SQLite stores any value in any column
        kinds = ["none", "text payload", "integer payload", "epoch", "junk", "blob", "not utf-8"]
        odd = draw(st.sampled_from(kinds))
        texts = ["routing_key", "content_type", "headers"]
        if odd == "text payload":
            values["payload"] = draw(st.text(max_size=20))
        elif odd == "integer payload":
            values["payload"], readable = draw(st.integers(-5, 5)), False
        elif odd == "epoch":
            values["created_at"] = draw(st.integers(0, 2**33))
        elif odd == "junk":
            values["created_at"], readable = "no time at all", False
        elif odd == "blob":  # a BLOB where text belongs
            values[draw(st.sampled_from(texts))], readable = draw(st.binary(max_size=8)), False
        elif odd == "not utf-8":
            bad = draw(st.binary(min_size=1, max_size=8).filter(not_utf8))
            values[draw(st.sampled_from(texts))], readable = AsText(bad), False
    strings = [v for v in (use_exchange, routing_key, content_type) if type(v) is str]
    publishable = readable and header.publishable and all(utf8(s) <= SHORT for s in strings)
    return Row(tail, values, publishable)


def not_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def relayed(
    request: pytest.FixtureRequest, rabbit: RabbitNode, tmp_path: Path
) -> Iterator[tuple[str, str, str, RelayProcess]]:
    """(database URL, exchange, queue, the running relay)."""
    url = str(request.getfixturevalue(f"{request.param}_url"))
    exchange, queue, env = relay_on_new_queue(
        tmp_path,
        "property",
        url,
        rabbit.url,
        RELAY_METRICS_PORT="0",
        RELAY_MAX_ATTEMPTS="2",
        RELAY_BACKOFF_INITIAL="0.05",
        RELAY_BACKOFF_MAX="0.1",
        RELAY_RECONNECT_MAX="0.5",
        RELAY_POLL_INTERVAL="0.05",
        RELAY_WINDOW="50",
    )
    with RelayProcess(env, tmp_path / "relay.log") as relay:
        yield url, exchange, queue, relay
        assert relay.running, "the relay exited"
        assert relay.stop() == 0
    assert relay.tracebacks() == []


def test_every_row_ends_sent_or_parked_and_parked_only_if_it_cannot_be_published(
    relayed: tuple[str, str, str, RelayProcess], rabbit: RabbitNode
) -> None:
    url, exchange, queue, relay = relayed
    engine = sa.create_engine(url)
    consumer = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    channel = consumer.channel()
    database = sa.make_url(url).get_backend_name()
    sqlite = database == "sqlite"
    numbers = itertools.count()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(st.lists(rows(exchange, sqlite), min_size=1, max_size=6))
    def example(batch: list[Row]) -> None:
        made = [row.with_id(f"p{next(numbers)}") for row in batch]  # unique in the outbox
        for _, values, _ in made:  # rows name different columns: one statement each
            if stored(values, database):
                write(engine, values)
            else:
                with pytest.raises(sa.exc.DataError, match="Data too long"):
                    write(engine, values)
        made = [(m, values, ok) for m, values, ok in made if stored(values, database)]
        ids = [message_id for message_id, _, _ in made]
        ended: dict[str, str] = {}

        def settled() -> bool:
            ended.update(fates(engine, ids))
            return all(ended.get(i) in ("sent", "parked") for i in ids)

        wait_until(settled, 60, "every generated row sent or parked")
        assert relay.running, "the relay exited"
        assert {i: ended[i] for i in ids} == {m: "sent" if ok else "parked" for m, _, ok in made}
        expected = {message_id for message_id, _, ok in made if ok}
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        while not expected <= seen and time.monotonic() < deadline:
            method, properties, _body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                consumer.sleep(0.05)
            else:
                seen.add(properties.message_id)
        assert expected <= seen, "a row marked sent was not delivered"

    try:
        example()
    finally:
        consumer.close()
        engine.dispose()
