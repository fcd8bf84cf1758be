"""/readyz says whether a relay can work. A pod that is ready but cannot work stops a rollout
short: the Deployment retires an old relay for it, and nothing is published."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from devtools.broker import drain
from devtools.outbox import fates, insert
from devtools.relayproc import RelayProcess, relay, relay_on_new_queue
from devtools.scrape import answers_ok, http_get, metric
from devtools.servers import RabbitNode, free_port, wait_until
from relay.db.migrate import migrate


def scraped(base: str, name: str) -> float:
    """An unlabelled metric of the relay serving on ``base``."""
    return metric(http_get(f"{base}/metrics")[1], name)


def test_a_relay_on_a_schema_it_needs_migrated_is_not_ready_until_it_is_migrated(
    database_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    """On the schema of the release before (0012), every turn of a relay of this release
    fails ("run `relay migrate`") and it owns nothing, while its claims, of no bucket, worked
    (before 0015; now they fail too, on the sent log's new tables): /readyz answered 200. It
    answers 503 with the reason, the first of the two kinds of call to fail, and 200 once
    the schema is migrated, after which the relay publishes without a restart."""
    migrate(database_url, "0012", downgrade=True)
    port = free_port()
    exchange, queue, env = relay_on_new_queue(
        tmp_path,
        "unmigrated",
        database_url,
        rabbit.url,
        RELAY_METRICS_PORT=str(port),
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_RECONNECT_MAX="1",
    )
    readyz = f"http://127.0.0.1:{port}/readyz"
    with RelayProcess(env, tmp_path / "relay.log") as proc:

        def logged(text: str) -> Callable[[], bool]:
            return lambda: text in proc.log()

        for attempt in (1, 2):  # other calls of the relay's work in between
            failed = logged(f"(attempt {attempt}), retrying in")
            wait_until(failed, 60, f"turn attempt {attempt} failing")
            status, body = http_get(readyz)
            assert status == 503, body
            # The turns', the claims', the sent log's looks' (PostgreSQL): whichever failed first
            missing = ("outbox_protocol", "outbox_sent_log", "outbox_sent_state")
            assert any(f"the {table} table does not exist" in body for table in missing), body
            assert body.rstrip().endswith("run `relay migrate`"), body
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200  # alive: not restarted
        migrated = relay("migrate", env=env)
        assert migrated.returncode == 0, migrated.stderr
        wait_until(lambda: answers_ok(readyz), 60, "the relay ready once migrated")
        insert(database_url, [{"message_id": "after", "exchange": exchange, "payload": b"x"}])
        wait_until(lambda: fates(database_url, ["after"]) == {"after": "sent"}, 60, "sent")
        assert proc.stop() == 0
    assert [d.message_id for d in drain(rabbit.url, queue, 1)] == ["after"]


def test_a_relay_that_cannot_claim_for_a_lease_while_the_sent_log_is_incomplete_is_not_ready(
    postgresql_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    """The sent log's state row is lost (as a crash loses it) and held by another session, as
    a relay rebuilding a week's log holds it: the relay claims nothing. Ready within a lease
    of the loss (a rollout does not flap on a short rebuild), then 503 naming the sent log,
    with ``relay_sent_log_complete`` 0 and ``relay_ready`` 0; once the log is whole again,
    ready, and the row written meanwhile is published."""
    port = free_port()
    exchange, queue, env = relay_on_new_queue(
        tmp_path,
        "sentlog",
        postgresql_url,
        rabbit.url,
        RELAY_METRICS_PORT=str(port),
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_CONFIRM_TIMEOUT="1",
        RELAY_LEASE="12",
    )
    base = f"http://127.0.0.1:{port}"
    engine = sa.create_engine(postgresql_url)
    try:
        with RelayProcess(env, tmp_path / "relay.log"):
            wait_until(lambda: answers_ok(f"{base}/readyz"), 60, "the relay ready")
            wait_until(lambda: scraped(base, "relay_sent_log_complete") == 1, 30, "a look")
            with engine.connect() as holder:
                with holder.begin():
                    holder.execute(sa.text("DELETE FROM outbox_sent_state"))
                    holder.execute(sa.text("INSERT INTO outbox_sent_state VALUES (1, false)"))
                holder.begin()
                holder.execute(sa.text("SELECT * FROM outbox_sent_state FOR UPDATE"))
                lost = time.monotonic()
                insert(postgresql_url, [{"message_id": "m", "exchange": exchange, "payload": b"x"}])
                wait_until(lambda: scraped(base, "relay_sent_log_complete") == 0, 30, "seen")
                status, body = http_get(f"{base}/readyz")
                if time.monotonic() - lost < 11:
                    assert status == 200, "unready before a lease had passed"
                wait_until(lambda: http_get(f"{base}/readyz")[0] == 503, 60, "unready")
                status, body = http_get(f"{base}/readyz")
                assert "the sent log has been incomplete for" in body, body
                assert scraped(base, "relay_ready") == 0
                assert fates(postgresql_url, ["m"]) == {"m": "pending"}, "claimed nothing"
                holder.rollback()
            wait_until(lambda: answers_ok(f"{base}/readyz"), 60, "ready once it is whole")
            wait_until(lambda: fates(postgresql_url, ["m"]) == {"m": "sent"}, 60, "sent")
            assert scraped(base, "relay_ready") == 1
    finally:
        engine.dispose()
    assert [d.message_id for d in drain(rabbit.url, queue, 1)] == ["m"]
