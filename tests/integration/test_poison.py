"""No row can stop the relay: each shape of bad row that once crashed, spun or stalled it, with
good rows around it, on SQLite and PostgreSQL against the real broker.

For each: the relay keeps running and drains cleanly, the bad row is parked with the reason
within a bounded time, every good row is consumed, duplicates stay within the bound, and the
relay did not spin (its "lost" outcomes, which a spinning row would pile up by the thousand,
stay at zero).
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from devtools.broker import drain, names, simple_topology
from devtools.outbox import fates, insert, rows, statuses
from devtools.procfs import cpu_seconds
from devtools.relayproc import RelayProcess, relay_on_new_queue
from devtools.servers import RabbitNode, wait_until
from relay.db.migrate import migrate
from relay.records import NewMessage
from tests.support.inprocess import Running, enqueue, settings, wait_for
from tests.support.metrics import sample_value

WINDOW = 20
GOOD = 30  # good rows written before and after each bad one


def around(exchange: str, tag: str) -> list[NewMessage]:
    return [
        NewMessage(f"{tag}-{i}".encode(), exchange, "k", message_id=f"{tag}-{i}")
        for i in range(GOOD)
    ]


def relay_with_a_bad_row(
    database_url: str, amqp_url: str, bad: dict[str, Any], *, reason: str, **overrides: Any
) -> tuple[Any, list[str], dict[str, Any]]:
    """Good rows, then the bad row (as plain SQL), then good rows, through a relay with
    three attempts; returns (the parked row, the delivered message ids, the metrics)."""
    exchange, queue = names("poison")
    config = settings(database_url, amqp_url, max_attempts=3, window=WINDOW, **overrides)
    running = Running(config, simple_topology(exchange, queue))

    async def scenario() -> dict[str, Any]:
        async with running as parts:
            enqueue(parts, around(exchange, "before"))
            insert(
                database_url, [{"message_id": "bad", "exchange": exchange, "payload": b"x"} | bad]
            )
            enqueue(parts, around(exchange, "after"))

            good = [m.message_id or "" for tag in ("before", "after") for m in around("", tag)]

            def settled() -> bool:
                ended = fates(database_url, [*good, "bad"])
                return ended == dict.fromkeys(good, "sent") | {"bad": "parked"}

            await wait_for(settled, 60, "good rows sent and the bad row parked")
            metrics = parts.metrics
            return {
                "lost": sample_value(metrics, "relay_outcomes_total", outcome="lost"),
                "published": sample_value(metrics, "relay_published_total"),
            }

    counts = asyncio.run(scenario())
    assert running.drained is True, "the relay did not drain cleanly"
    (parked,) = [r for r in rows(database_url) if r.message_id == "bad"]
    assert parked.status == "parked"
    assert reason in (parked.last_error or ""), parked.last_error
    delivered = [d.message_id for d in drain(amqp_url, queue, expect=2 * GOOD)]
    assert set(delivered) == {f"{t}-{i}" for t in ("before", "after") for i in range(GOOD)}
    return parked, delivered, counts


# The bad row's columns -> a part of the reason it is parked with (at once: no attempt can
# succeed). These spun forever, crashed the relay, or were parked for no good reason.
DEEP = '{"a": ' * 600 + "1" + "}" * 600
REJECTED = {
    "routing key over 255 bytes": ({"routing_key": "r" * 300}, "routing_key is 300 bytes"),
    "content type over 255 bytes": ({"content_type": "c" * 300}, "content_type is 300 bytes"),
    "header key over 255 bytes": ({"headers": json.dumps({"k" * 300: 1})}, "header key 'kkk"),
    "headers nested 600 deep": ({"headers": DEEP}, "headers are nested deeper"),
    "integer beyond 64 bits": (
        {"headers": '{"n": 99999999999999999999}'},
        "header 'n': the integer",
    ),
}


@pytest.mark.parametrize(("bad", "reason"), REJECTED.values(), ids=list(REJECTED))
def test_a_row_that_can_never_be_published_is_parked_at_once_and_the_rest_flow(
    database_url: str, rabbit: RabbitNode, bad: dict[str, Any], reason: str
) -> None:
    if database_url.startswith("mysql") and {"routing_key", "content_type"} & set(bad):
        # MySQL's columns for AMQP short strings hold 255 characters: the writer is told.
        with pytest.raises(sa.exc.DataError, match="Data too long"):
            insert(database_url, [{"message_id": "bad", "payload": b"x"} | bad])
        return
    parked, delivered, counts = relay_with_a_bad_row(
        database_url, rabbit.url, bad, reason=f"rejected: {reason}"
    )
    assert parked.attempts == 1
    assert Counter(delivered).most_common(1)[0][1] == 1, "a good row was delivered twice"
    assert counts["lost"] == 0 and counts["published"] == 2 * GOOD


def test_a_row_the_broker_closes_the_channel_for_is_blamed_and_parked(
    database_url: str, rabbit: RabbitNode
) -> None:
    """amq.rabbitmq.trace is internal: "403 ACCESS_REFUSED - cannot publish to internal
    exchange", a close text that names no row. Its rows are found by publishing alone."""
    parked, delivered, counts = relay_with_a_bad_row(
        database_url,
        rabbit.url,
        {"exchange": "amq.rabbitmq.trace"},
        reason="failed: channel closed by the broker: 403 ACCESS_REFUSED",
    )
    assert parked.attempts == 3
    duplicates = len(delivered) - len(set(delivered))
    assert duplicates <= WINDOW, f"{duplicates} duplicates: more than one window"
    # Lost (due again, no attempt counted): the rows of the first closed channel, suspects
    # still waiting when a later close came, and at each close the rows claimed ahead (at
    # most a window). A row lost again and again would be thousands.
    assert counts["lost"] <= 2 * WINDOW + parked.attempts * WINDOW


@pytest.mark.parametrize(
    ("column", "stored", "reason"),
    [
        ("payload", 42, "unreadable row: payload is an INTEGER"),
        ("created_at", "not a time", "unreadable row: created_at 'not a time' is not an ISO"),
    ],
)
def test_on_sqlite_a_value_of_another_storage_class_parks_its_row_only(
    sqlite_url: str, rabbit: RabbitNode, column: str, stored: object, reason: str
) -> None:
    """SQLite keeps whatever a writer stores; the claim of the batch around it must not fail."""
    exchange, queue = names("storage")
    config = settings(sqlite_url, rabbit.url, max_attempts=3)
    running = Running(config, simple_topology(exchange, queue))
    values = {"message_id": "bad", "exchange": exchange, "payload": b"x", column: stored}
    engine = sa.create_engine(sqlite_url)

    async def scenario() -> None:
        async with running as parts:
            enqueue(parts, around(exchange, "before"))
            insert(sqlite_url, [values])  # plain SQL, past SQLAlchemy's types
            enqueue(parts, around(exchange, "after"))
            await wait_for(
                lambda: statuses(sqlite_url) == {"sent": 2 * GOOD, "parked": 1},
                60,
                "good rows sent, the bad one parked",
            )

    asyncio.run(scenario())
    assert running.drained is True
    with engine.connect() as conn:  # the row as stored (its created_at may be no time)
        query = sa.text("SELECT message_id, last_error FROM outbox WHERE status = 'parked'")
        ((message_id, last_error),) = conn.execute(query).all()
    engine.dispose()
    assert message_id == "bad" and reason in last_error, last_error
    assert len({d.message_id for d in drain(rabbit.url, queue, expect=2 * GOOD)}) == 2 * GOOD


# (An ordering key is never read by the relay, only compared by the database: such a row is
# published like any other.)
@pytest.mark.parametrize("column", ["routing_key", "headers", "content_type", "message_id"])
def test_on_sqlite_text_that_is_not_utf8_parks_its_row_only(
    sqlite_url: str, rabbit: RabbitNode, column: str
) -> None:
    """A C or Go writer's bytes in a TEXT column (here ``CAST(X'FF41' AS TEXT)``): Python's
    sqlite3 raised on them while fetching, so one such row failed every claim around it."""
    exchange, queue = names("utf8")
    running = Running(settings(sqlite_url, rabbit.url), simple_topology(exchange, queue))
    engine = sa.create_engine(sqlite_url)
    values = {"message_id": "'bad'", "exchange": ":exchange", "payload": "X'00'"}
    values[column] = "CAST(X'FF41' AS TEXT)"

    async def scenario() -> None:
        async with running as parts:
            enqueue(parts, around(exchange, "before"))
            with engine.begin() as conn:
                names_, given = ", ".join(values), ", ".join(values.values())
                query = sa.text(f"INSERT INTO outbox ({names_}) VALUES ({given})")
                conn.execute(query.bindparams(exchange=exchange))
            enqueue(parts, around(exchange, "after"))
            await wait_for(
                lambda: statuses(sqlite_url) == {"sent": 2 * GOOD, "parked": 1},
                60,
                "good rows sent, the bad one parked",
            )
            assert parts.relay.ready()

    asyncio.run(scenario())
    assert running.drained is True
    with engine.connect() as conn:
        query = sa.text("SELECT last_error FROM outbox WHERE status = 'parked'")
        last_error = conn.execute(query).scalar_one()
    engine.dispose()
    assert f"{column} is not UTF-8 text (byte 0xff at 0)" in last_error, last_error
    assert len({d.message_id for d in drain(rabbit.url, queue, expect=2 * GOOD)}) == 2 * GOOD


# A payload as SQLite stores it (SQL of the value) -> the body published: the writer's bytes,
# exactly, whatever its storage class, or the row parked naming why.
STORED_PAYLOADS = {
    "text not UTF-8": ("CAST(X'FF41C3A9' AS TEXT)", b"\xffA\xc3\xa9"),
    "text with a NUL inside": ("CAST(X'6100FF62' AS TEXT)", b"a\x00\xffb"),
    "text, UTF-8": ("'h\u00e9llo'", "h\u00e9llo".encode()),
    "empty text": ("''", b""),
    "blob": ("X'FF00C3A920'", b"\xff\x00\xc3\xa9 "),
    "empty blob": ("X''", b""),
    "integer": ("42", "unreadable row: payload is an INTEGER, not bytes"),
    "real": ("4.5", "unreadable row: payload is a REAL, not bytes"),
}


def test_on_sqlite_a_payload_is_published_as_its_stored_bytes_whatever_its_storage_class(
    sqlite_url: str, rabbit: RabbitNode
) -> None:
    """A TEXT payload that is not UTF-8 (a C writer's, or ``CAST(X'FF41C3A9' AS TEXT)``) was
    published as other bytes (``ED B3 BF 41 C3 A9``: its lone surrogate's), acked and
    deleted. Each storage class a payload can have, written as plain SQL: published as the
    bytes stored, or parked saying why; NULL is refused to the writer."""
    exchange, queue = names("payloads")
    running = Running(settings(sqlite_url, rabbit.url), simple_topology(exchange, queue))
    engine = sa.create_engine(sqlite_url)
    published = {
        name: body for name, (_, body) in STORED_PAYLOADS.items() if isinstance(body, bytes)
    }
    parked = {name: why for name, (_, why) in STORED_PAYLOADS.items() if isinstance(why, str)}

    async def scenario() -> None:
        async with running as parts:
            enqueue(parts, around(exchange, "before"))
            with engine.begin() as conn:
                for name, (stored, _) in STORED_PAYLOADS.items():
                    values = f"VALUES (:m, :e, {stored})"
                    query = f"INSERT INTO outbox (message_id, exchange, payload) {values}"
                    conn.execute(sa.text(query), {"m": name, "e": exchange})
            with pytest.raises(sa.exc.IntegrityError, match="NOT NULL"), engine.begin() as conn:
                query = (
                    "INSERT INTO outbox (message_id, exchange, payload) VALUES ('null', :e, NULL)"
                )
                conn.execute(sa.text(query), {"e": exchange})
            enqueue(parts, around(exchange, "after"))
            await wait_for(
                lambda: (
                    statuses(sqlite_url)
                    == {"sent": 2 * GOOD + len(published), "parked": len(parked)}
                ),
                60,
                "good rows sent, the bad ones parked",
            )

    asyncio.run(scenario())
    assert running.drained is True
    with engine.connect() as conn:
        query = sa.text("SELECT message_id, last_error FROM outbox WHERE status = 'parked'")
        reasons = {m: e for m, e in conn.execute(query)}
    engine.dispose()
    assert set(reasons) == set(parked)
    for name, why in parked.items():
        assert f"rejected: {why}" in reasons[name], reasons[name]
    delivered = drain(rabbit.url, queue, expect=2 * GOOD + len(published))
    bodies = {d.message_id: d.body for d in delivered if d.message_id in published}
    assert bodies == published


# A payload in a SQLite database whose encoding is UTF-16 (SQL of the value) -> the body
# published: SQLite converted the writer's text to UTF-16 when it stored it, so its text is
# published as UTF-8; a BLOB as stored; a TEXT that holds no text parked.
UTF16_PAYLOADS = {
    "json": ("'{\"order_id\": 1042}'", b'{"order_id": 1042}'),
    "text, not ASCII": ("'h\u00e9llo'", "h\u00e9llo".encode()),
    "empty text": ("''", b""),
    "blob": ("X'FF00C3A920'", b"\xff\x00\xc3\xa9 "),
    "a lone surrogate": ("CAST(X'00D8' AS TEXT)", "payload is not UTF-8 text (byte 0xed at 0)"),
    # Under the largest message in UTF-8, over it in UTF-16: counted in UTF-16, it was parked.
    "700 ASCII characters": ("'" + "a" * 700 + "'", b"a" * 700),
    # Over it in UTF-8 alone: counted from below unread, parked by its exact size once read.
    "600 two-byte characters": ("'" + "\u00e9" * 600 + "'", "headers are 1200 bytes, more"),
}
# Headers (JSON text, so stored in UTF-16 too) beside a BLOB payload: a BLOB of 400 bytes and
# 400 three-byte characters (1,609 bytes in all, 1,209 counted from below) was read by the fast
# path, which checked no size, and published past the largest message.
UTF16_HEADERS = {"beside a blob": ("X'" + "01" * 400 + "'", '{"h": "' + "\u4e2d" * 400 + '"}')}
UTF16_HEADERS_PARKED = "headers are 1609 bytes, more"
# The largest message in the UTF-16 case: between a payload's UTF-8 bytes and its UTF-16.
UTF16_MAX_MESSAGE = 1000


def test_on_a_utf16_sqlite_database_a_text_payload_is_published_as_its_text(
    tmp_path: Path, rabbit: RabbitNode
) -> None:
    """Read as its BLOB, a TEXT payload of a database created with ``PRAGMA encoding =
    'UTF-16le'`` went out as UTF-16 (the README's JSON as ``{\\0"\\0o\\0...``), acked and
    deleted. Its text is published as UTF-8, a BLOB as stored, and a TEXT that is no text
    (a lone surrogate) parked; the largest message is in the bytes published, payload and
    headers, not the UTF-16 stored."""
    url = f"sqlite:///{tmp_path / 'utf16.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA encoding = 'UTF-16le'")
        conn.exec_driver_sql("CREATE TABLE encoded (x)")  # the encoding holds from here
    migrate(url)
    exchange, queue = names("utf16")
    limited = settings(url, rabbit.url, max_message_size=UTF16_MAX_MESSAGE)
    running = Running(limited, simple_topology(exchange, queue))
    published = {n: body for n, (_, body) in UTF16_PAYLOADS.items() if isinstance(body, bytes)}
    parked = {n: why for n, (_, why) in UTF16_PAYLOADS.items() if isinstance(why, str)}
    parked |= {n: UTF16_HEADERS_PARKED for n in UTF16_HEADERS}

    async def scenario() -> None:
        async with running:
            with engine.begin() as conn:
                for name, (stored, _) in UTF16_PAYLOADS.items():
                    values = f"VALUES (:m, :e, {stored})"
                    query = f"INSERT INTO outbox (message_id, exchange, payload) {values}"
                    conn.execute(sa.text(query), {"m": name, "e": exchange})
                for name, (stored, headers) in UTF16_HEADERS.items():
                    values = f"VALUES (:m, :e, {stored}, :h)"
                    query = f"INSERT INTO outbox (message_id, exchange, payload, headers) {values}"
                    conn.execute(sa.text(query), {"m": name, "e": exchange, "h": headers})
            await wait_for(
                lambda: statuses(url) == {"sent": len(published), "parked": len(parked)},
                60,
                "the text rows sent, the one holding no text parked",
            )

    asyncio.run(scenario())
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA encoding").scalar_one() == "UTF-16le"
        query = sa.text("SELECT message_id, last_error FROM outbox WHERE status = 'parked'")
        reasons = {m: e for m, e in conn.execute(query)}
    engine.dispose()
    assert set(reasons) == set(parked)
    for name, why in parked.items():
        assert why in reasons[name], reasons[name]
    delivered = drain(rabbit.url, queue, expect=len(published))
    assert {d.message_id: d.body for d in delivered} == published


# TEXT payloads longer in bytes than SQLite's length() counts: a NUL inside (length() stops
# there) and characters of two bytes each (it counts characters).
UNDERCOUNTED = {
    "a NUL inside": "a\x00" + "b" * 1500,
    "two bytes a character": "\u00e9" * 751,
}


@pytest.mark.parametrize("payload", UNDERCOUNTED.values(), ids=list(UNDERCOUNTED))
def test_on_sqlite_a_text_payload_over_the_largest_message_is_parked_unread(
    sqlite_url: str, rabbit: RabbitNode, payload: str
) -> None:
    """The claim asks the database for a row's size before reading it: a TEXT payload's is
    its bytes, not its characters before the first NUL (such a row was read and published,
    larger than RELAY_MAX_MESSAGE_SIZE)."""
    size = len(payload.encode())
    parked, _, counts = relay_with_a_bad_row(
        sqlite_url,
        rabbit.url,
        {"payload": payload},
        reason=f"row not read: its payload and headers are {size} bytes",
        max_message_size=1000,
    )
    assert parked.attempts == 1 and counts["published"] == 2 * GOOD


def test_a_payload_is_published_as_the_writers_bytes(database_url: str, rabbit: RabbitNode) -> None:
    """Bytes that are no text, NULs and trailing spaces included, bound as a writer binds
    them: the body is those bytes, on every database."""
    exchange, queue = names("exact")
    running = Running(settings(database_url, rabbit.url), simple_topology(exchange, queue))
    payloads = {
        "not utf-8": b"\xffA\xc3\xa9",
        "nul inside": b"a\x00\xffb\x00",
        "trailing spaces": b"x  ",
        "every byte": bytes(range(256)),
        "empty": b"",
    }

    async def scenario() -> None:
        async with running:
            insert(
                database_url,
                [
                    {"message_id": m, "exchange": exchange, "payload": p}
                    for m, p in payloads.items()
                ],
            )
            await wait_for(
                lambda: statuses(database_url) == {"sent": len(payloads)}, 30, "every row sent"
            )

    asyncio.run(scenario())
    assert running.drained is True
    delivered = drain(rabbit.url, queue, expect=len(payloads))
    assert {d.message_id: d.body for d in delivered} == payloads


def test_on_sqlite_an_epoch_created_at_is_read_as_unix_seconds(
    sqlite_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("epoch")
    running = Running(settings(sqlite_url, rabbit.url), simple_topology(exchange, queue))

    async def scenario() -> None:
        async with running as parts:
            epoch = {"message_id": "epoch", "exchange": exchange, "payload": "text payload"}
            insert(sqlite_url, [epoch | {"created_at": 1767225600}])
            await wait_for(lambda: statuses(sqlite_url) == {"sent": 1}, 30, "the row sent")
            assert parts.relay.ready()

    asyncio.run(scenario())
    (message,) = drain(rabbit.url, queue, expect=1)
    assert message.body == b"text payload"
    assert running.drained is True


def test_doubles_in_headers_are_published_exactly(
    database_url: str, rabbit: RabbitNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.30000000000000004, pi and 1.5e10 fit no AMQP decimal: they go as AMQP doubles, bit
    for bit. (pika's own decoder truncates doubles to integers, so the raw properties the
    broker delivered are read here.)"""
    exchange, queue = names("doubles")
    headers = {"r": 0.30000000000000004, "pi": 3.141592653589793, "big": 1.5e10, "price": 19.99}
    running = Running(settings(database_url, rabbit.url), simple_topology(exchange, queue))

    async def scenario() -> None:
        async with running:
            row = {"message_id": "doubles", "exchange": exchange, "payload": b"d"}
            insert(database_url, [row | {"headers": json.dumps(headers)}])
            await wait_for(lambda: statuses(database_url) == {"sent": 1}, 30, "sent")

    asyncio.run(scenario())
    delivered_properties: list[bytes] = []
    decode = pika.spec.BasicProperties.decode

    def recording(self: pika.spec.BasicProperties, encoded: bytes, offset: int = 0) -> int:
        delivered_properties.append(bytes(encoded[offset:]))
        return decode(self, encoded, offset)  # type: ignore[no-any-return]

    monkeypatch.setattr(pika.spec.BasicProperties, "decode", recording)
    (message,) = drain(rabbit.url, queue, expect=1)
    assert message.headers is not None and message.headers["price"] == Decimal("19.99")
    (raw,) = [p for p in delivered_properties if b"doubles" in p]
    for key in ("r", "pi", "big"):
        assert bytes([len(key)]) + key.encode() + b"d" + struct.pack(">d", headers[key]) in raw, key
    assert running.drained is True


def test_a_row_being_retried_costs_the_relay_almost_no_cpu(
    postgresql_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    """A row that closes the channel on every attempt, retried about once a second, and
    nothing else to do: the relay waits, it does not spin (a spinning row burns a core)."""
    _, _, env = relay_on_new_queue(
        tmp_path,
        "idle",
        postgresql_url,
        rabbit.url,
        RELAY_METRICS_PORT="0",
        RELAY_MAX_ATTEMPTS="1000",
        RELAY_BACKOFF_INITIAL="0.5",
        RELAY_BACKOFF_MAX="1",
    )
    insert(
        postgresql_url, [{"message_id": "bad", "exchange": "amq.rabbitmq.trace", "payload": b"x"}]
    )
    with RelayProcess(env, tmp_path / "relay.log") as relay:

        def attempts() -> int:
            (row,) = [r for r in rows(postgresql_url) if r.message_id == "bad"]
            return int(row.attempts)

        wait_until(lambda: attempts() >= 2, 60, "the bad row retried")
        cpu, started, first = cpu_seconds(relay.pid), time.monotonic(), attempts()
        wait_until(lambda: attempts() >= first + 3, 60, "three more attempts")
        used, waited = cpu_seconds(relay.pid) - cpu, time.monotonic() - started
        assert relay.running
        assert relay.stop() == 0
    assert used < 0.25 * waited, f"{used:.2f} s of CPU in {waited:.1f} s"
    assert relay.tracebacks() == []
