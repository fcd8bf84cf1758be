"""A row larger than the relay's memory is parked unread, and the relay keeps going.

`relay run` runs under an address-space limit (``prlimit --as``, util-linux's), beside a row
written by plain SQL that is larger than that limit. Fetching it, the relay could never
claim it nor anything after it (its claims failed for want of memory, retried for ever, the
big row first in line each time). The claim asks the database for the row's size instead, and
the row is parked with it; the rows around it are relayed."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from devtools.broker import drain
from devtools.outbox import fates, insert
from devtools.relayproc import RELAY, RelayProcess, relay_on_new_queue
from devtools.servers import RabbitNode, wait_until
from relay.db.schema import outbox

# The relay's address space (bytes): about 200 MB at rest (VmSize), room for its claims.
ADDRESS_SPACE = 640 * 1024**2
# The row: larger than the whole address space; made by the server, compressible (stored
# small: a TOASTed value's size is its size uncompressed).
BIG_ROW = 700_000_000


def test_a_row_larger_than_the_relays_memory_is_parked_and_the_others_flow(
    postgresql_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    exchange, queue, env = relay_on_new_queue(
        tmp_path,
        "big-row",
        postgresql_url,
        rabbit.url,
        RELAY_METRICS_PORT="0",
        RELAY_POLL_INTERVAL="0.05",
        RELAY_LOG_FORMAT="json",
    )
    small = [f"{when}-{i}" for when in ("before", "after") for i in range(20)]
    engine = sa.create_engine(postgresql_url)

    def write(message_ids: list[str]) -> None:
        insert(
            engine, [{"message_id": m, "exchange": exchange, "payload": b"x"} for m in message_ids]
        )

    write(small[:20])
    with engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL default_toast_compression = lz4"))  # pglz: 10 s more
        conn.execute(
            sa.text(
                "INSERT INTO outbox (message_id, exchange, payload) "
                "VALUES ('huge', :x, convert_to(repeat('x', :n), 'UTF8'))"
            ),
            {"x": exchange, "n": BIG_ROW},
        )
    write(small[20:])
    limited = ["prlimit", f"--as={ADDRESS_SPACE}", "--", *RELAY, "run"]
    parked = sa.select(outbox.c.last_error).where(
        outbox.c.message_id == "huge", outbox.c.status == "parked"
    )

    def done() -> bool:
        with engine.connect() as conn:
            huge_parked = conn.execute(parked).first() is not None
        return huge_parked and set(fates(engine, small).values()) == {"sent"}

    try:
        with RelayProcess(env, tmp_path / "relay.log", limited) as proc:
            wait_until(done, 60, "the small rows sent and the big one parked")
            assert proc.running
            assert proc.stop() == 0
        with engine.connect() as conn:
            reason = conn.execute(parked).scalar_one()
    finally:
        engine.dispose()
    assert f"{BIG_ROW} bytes" in reason and "row not read" in reason, reason
    delivered = drain(rabbit.url, queue, len(small))
    assert sorted(d.message_id for d in delivered) == sorted(small)
