"""/readyz says whether a relay can work. A pod that is ready but cannot work stops a rollout
short: the Deployment retires an old relay for it, and nothing is published."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from devtools.broker import drain
from devtools.outbox import fates, insert
from devtools.relayproc import RelayProcess, relay, relay_on_new_queue
from devtools.scrape import answers_ok, http_get
from devtools.servers import RabbitNode, free_port, wait_until
from relay.db.migrate import migrate


def test_a_relay_on_a_schema_it_needs_migrated_is_not_ready_until_it_is_migrated(
    database_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    """On the schema of the release before (0012), every turn of a relay of this release
    fails ("run `relay migrate`") and it owns nothing, while its claims, of no bucket, worked
    (before 0015; now they fail too, on the sent log's new name): /readyz answered 200. It
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
            missing = ("outbox_protocol", "outbox_sent_log")  # the turns', the claims'
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
