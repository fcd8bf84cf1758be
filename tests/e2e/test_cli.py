"""The `relay` command as users run it: a subprocess, real servers, signals, HTTP scrapes."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from devtools.broker import declare_bound, drain, names
from devtools.outbox import owners, statuses
from devtools.relayproc import RelayProcess, relay, relay_env, relay_on_new_queue, run_relay_until
from devtools.scrape import answers_ok, http_get, metric
from devtools.servers import MariaDBServer, RabbitNode, free_port, wait_until
from relay.constants import PROTOCOL
from relay.db.engine import create_engine
from relay.db.schema import outbox, outbox_protocol
from relay.settings import InboxSettings, describe, known_env_names


def test_help_lists_every_setting_with_its_variable() -> None:
    result = relay("run", "--help", env=relay_env())
    assert result.returncode == 0
    inbox = {doc.env for doc in describe(InboxSettings)}  # an inbox consumer's, not the relay's
    # The console's (its secret files among them): `relay console --help` lists them.
    console = {name for name in known_env_names() if name.startswith("RELAY_CONSOLE_")}
    relays = [name for name in known_env_names() if name not in inbox | console]
    assert [name for name in relays if f"[{name}]" not in result.stdout] == []
    assert [name for name in inbox | console if f"[{name}]" in result.stdout] == []
    console_help = relay("console", "--help", env=relay_env()).stdout
    assert [name for name in console if f"[{name}]" not in console_help] == []
    for command in ("migrate", "enqueue"):
        text = relay(command, "--help", env=relay_env()).stdout
        assert "[RELAY_DATABASE_URL]" in text and "[RELAY_ENV_FILE]" in text


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["run"], {"RELAY_WINDOW": "-5"}, "RELAY_WINDOW='-5': must be a positive whole number"),
        (["run", "--batch-size", "x"], {}, "RELAY_BATCH_SIZE='x': must be a positive whole number"),
        (
            ["run"],
            {"RELAY_WNDOW": "5"},
            "RELAY_WNDOW: unknown setting (did you mean RELAY_WINDOW?)",
        ),
        (
            ["run"],
            {"RELAY_TOPOLOGY_FILE": "/nonexistent.toml"},
            "RELAY_TOPOLOGY_FILE=/nonexistent.toml: cannot read",
        ),
        (
            ["run"],
            {"RELAY_AMQP_URL": "amqp://u:hunter2@h:notaport/"},
            "RELAY_AMQP_URL=amqp://u:***@h:notaport/",
        ),
        (
            ["run"],
            {"RELAY_DATABASE_URL": "postgresql://app:hunter2@127.0.0.1:notaport/outbox"},
            "RELAY_DATABASE_URL=(hidden): is not a valid URL",
        ),
        (["migrate"], {"RELAY_DATABASE_URL": "postgresql://app:hunter2@[::1/outbox"}, "RELAY_DAT"),
        (["run"], {"RELAY_DATABASE_URL": "sqlite://"}, "RELAY_DATABASE_URL=(hidden): must name"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = relay(*args, env=relay_env(**env))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"relay: error: {message}"), lines
    assert "hunter2" not in result.stderr


def test_unknown_option_exits_2() -> None:
    result = relay("run", "--no-such-option", env=relay_env())
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_enqueue_rejects_a_bad_line_and_inserts_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    env = relay_env(RELAY_DATABASE_URL=url)
    assert relay("migrate", env=env).returncode == 0
    lines = (
        '{"exchange": "x", "payload": "ok"}\n{"exchange": "x", "payload": "a", "headers": [1]}\n'
    )
    result = relay("enqueue", "--file", "-", env=env, input=lines)
    assert result.returncode == 2
    assert "relay: error: <stdin>:2: headers must be a JSON object" in result.stderr
    assert statuses(url) == {}
    ok = relay("enqueue", "--exchange", "x", "--header", "a=b", "hello", env=env)
    assert ok.returncode == 0 and statuses(url) == {"pending": 1}


def test_migrate_on_an_unreachable_database_fails_clearly() -> None:
    port = free_port()
    url = f"postgresql://relay:topsecret@127.0.0.1:{port}/outbox"
    result = relay("migrate", env=relay_env(RELAY_DATABASE_URL=url))
    assert result.returncode == 1
    assert "relay: error: migrate on postgresql://relay:***@127.0.0.1" in result.stderr
    assert "topsecret" not in result.stderr and "Traceback" not in result.stderr


def test_relay_run_relays_serves_metrics_and_drains_on_sigterm(
    tmp_path: Path, rabbit: RabbitNode
) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    port = free_port()
    exchange, queue, env = relay_on_new_queue(
        tmp_path,
        "e2e",
        url,
        rabbit.url,
        RELAY_METRICS_PORT=str(port),
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_POLL_INTERVAL="0.05",
        RELAY_STATS_INTERVAL="0.2",
        RELAY_LOG_FORMAT="json",
    )
    assert relay("migrate", env=env).returncode == 0

    def enqueue(start: int, count: int) -> None:
        lines = "".join(
            json.dumps(
                {
                    "exchange": exchange,
                    "routing_key": "k",
                    "payload": {"n": i},
                    "message_id": f"id-{i}",
                }
            )
            + "\n"
            for i in range(start, start + count)
        )
        result = relay("enqueue", "--file", "-", env=env, input=lines)
        assert result.returncode == 0, result.stderr

    enqueue(0, 500)
    base = f"http://127.0.0.1:{port}"
    with RelayProcess(env, tmp_path / "relay.log") as proc:
        wait_until(functools.partial(answers_ok, base + "/readyz"), 60, "/readyz")
        assert http_get(base + "/healthz")[0] == 200
        wait_until(
            lambda: 'relay_outcomes_total{outcome="acked"} 500.0' in http_get(base + "/metrics")[1],
            60,
            "500 acks on /metrics",
        )
        text = http_get(base + "/metrics")[1]
        assert metric(text, "relay_published_total") == 500
        assert metric(text, "relay_broker_connected") == 1
        assert metric(text, "relay_confirm_latency_seconds_count") == 500
        # Watched while the rows go in: once committed, a relay may send 5,000 rows before
        # `relay enqueue` has even exited.
        writer = threading.Thread(target=enqueue, args=(500, 5000))
        writer.start()
        wait_until(
            lambda: metric(http_get(base + "/metrics")[1], "relay_in_flight") > 0,
            30,
            "publishing under way",
        )
        assert proc.stop() == 0
        writer.join()
    logged = (tmp_path / "relay.log").read_text()
    assert "Traceback" not in logged
    actions = [json.loads(line)["action"] for line in logged.splitlines()]
    assert "drained" in actions
    assert owners(url) == {}, "buckets left owned by a stopped relay"
    after_stop = statuses(url)
    assert after_stop.get("sent", 0) + after_stop.get("pending", 0) == 5500
    # A restarted relay sends what the first one did not, and rows written while no relay
    # ran (so that it has work however far the first one got before its SIGTERM).
    enqueue(5500, 100)
    assert (
        run_relay_until(
            env,
            tmp_path / "relay2.log",
            lambda: statuses(url).get("sent") == 5600,
            "every row sent by the second relay",
        )
        == 0
    )
    delivered = {d.message_id for d in drain(rabbit.url, queue, expect=5600, timeout=60)}
    assert delivered == {f"id-{i}" for i in range(5600)}


def test_relay_run_purges_old_sent_rows_when_retention_is_set(
    tmp_path: Path, rabbit: RabbitNode
) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    env = relay_env(
        RELAY_DATABASE_URL=url,
        RELAY_AMQP_URL=rabbit.url,
        RELAY_METRICS_PORT="0",
        RELAY_RETENTION="86400",
        RELAY_PURGE_INTERVAL="0.2",
        RELAY_LOG_FORMAT="json",
    )
    assert relay("migrate", env=env).returncode == 0
    now = datetime.now(UTC)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(outbox),
            [
                {"message_id": f"old-{i}", "payload": b"p", "status": status, "sent_at": sent}
                for i, (status, sent) in enumerate(
                    [("sent", now - timedelta(days=2))] * 3
                    + [("sent", now - timedelta(hours=1)), ("parked", None)]
                )
            ],
        )
    engine.dispose()
    assert (
        run_relay_until(
            env,
            tmp_path / "relay.log",
            lambda: statuses(url).get("sent") == 1,
            "old sent rows purged",
        )
        == 0
    )
    assert statuses(url) == {"sent": 1, "parked": 1}
    assert owners(url) == {}
    logged = [json.loads(line) for line in (tmp_path / "relay.log").read_text().splitlines()]
    assert any(e["action"] == "purge" and e["message"] == "purged 3 sent rows" for e in logged)


def test_a_committed_row_wakes_the_relay_without_polling(
    tmp_path: Path, rabbit: RabbitNode, database_url: str
) -> None:
    """The relay polls once an hour here: only its probe of the newest id can make it look;
    the writer is a plain INSERT, as any writer (or Spark's JDBC) does it."""
    exchange, queue = names("probe")
    declare_bound(rabbit.url, exchange, queue)
    port = free_port()
    env = relay_env(
        RELAY_DATABASE_URL=database_url,
        RELAY_AMQP_URL=rabbit.url,
        RELAY_POLL_INTERVAL="3600",
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_METRICS_PORT=str(port),
        RELAY_LOG_FORMAT="json",
    )

    def sent(count: int) -> bool:
        return statuses(database_url).get("sent") == count

    insert = sa.text("INSERT INTO outbox (message_id, exchange, payload) VALUES (:m, :e, :p)")
    writer = create_engine(database_url)
    with RelayProcess(env, tmp_path / "relay.log") as proc:
        wait_until(functools.partial(answers_ok, f"http://127.0.0.1:{port}/readyz"), 60, "ready")
        for n in range(3):
            with writer.begin() as conn:
                conn.execute(insert, {"m": f"row-{n}", "e": exchange, "p": b"row"})
            wait_until(functools.partial(sent, n + 1), 30, f"row {n} sent after the probe")
        assert proc.stop() == 0
    writer.dispose()
    assert "Traceback" not in (tmp_path / "relay.log").read_text()
    assert len(drain(rabbit.url, queue, expect=3)) == 3


@pytest.fixture(scope="module")
def old_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """A MariaDB that announces itself as 10.5, older than the outbox needs."""
    server = MariaDBServer(
        tmp_path_factory.mktemp("old-mariadb"),
        tuned_for_tests=True,
        more=["--version=10.5.9-MariaDB"],
    )
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("command", [["migrate"], ["status"], ["run"]])
def test_an_unsupported_server_version_is_one_line_and_exit_2(
    old_mariadb: MariaDBServer, command: list[str]
) -> None:
    env = relay_env(RELAY_DATABASE_URL=old_mariadb.url("mysql"))
    result = relay(*command, env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (
        "relay: error: MariaDB 10.5.9 cannot hold the outbox: it needs MariaDB 10.6 or later "
        "(FOR UPDATE SKIP LOCKED, JSON_TABLE)"
    ), lines


def test_a_relay_the_schema_retires_exits_with_one_line_naming_the_release(
    tmp_path: Path, rabbit: RabbitNode, database_url: str
) -> None:
    """What a migration that relays of this protocol cannot run beside does to them: the
    running relay gives its buckets up, drains and exits 1, its last line naming the release
    to run; started again, it exits at its first turn with the same line, claiming nothing."""
    exchange, queue = names("retired")
    declare_bound(rabbit.url, exchange, queue)
    env = relay_env(
        RELAY_DATABASE_URL=database_url,
        RELAY_AMQP_URL=rabbit.url,
        RELAY_POLL_INTERVAL="0.05",
        RELAY_METRICS_PORT="0",  # the default port is another test process's relay's too
    )
    insert = sa.text("INSERT INTO outbox (message_id, exchange, payload) VALUES (:m, :e, :p)")
    writer = create_engine(database_url)
    line = (
        f"relay: error: the outbox schema admits relays of protocol {PROTOCOL + 1} or later "
        f"(outbox-relay 9.0 or later); this relay speaks protocol {PROTOCOL}: run "
        "outbox-relay 9.0 or later"
    )
    try:
        with writer.begin() as conn:
            conn.execute(insert, {"m": "before", "e": exchange, "p": b"row"})
        with RelayProcess(env, tmp_path / "relay.log") as proc:
            wait_until(lambda: statuses(database_url).get("sent") == 1, 60, "the row sent")
            with writer.begin() as conn:
                admits = {"least_protocol": PROTOCOL + 1, "least_release": "outbox-relay 9.0"}
                conn.execute(sa.update(outbox_protocol).values(admits))
            assert proc.proc is not None
            assert proc.proc.wait(timeout=60) == 1  # at its next turn
        assert proc.log().splitlines()[-1] == line
        assert "unfenced" not in proc.log(), "its leaving turn said nothing stands in the way"
        assert owners(database_url) == {}, "a bucket kept by the retired relay"
        with writer.begin() as conn:
            conn.execute(insert, {"m": "after", "e": exchange, "p": b"row"})
        again = relay("run", env=env, timeout=60)
        assert again.returncode == 1 and again.stderr.splitlines()[-1] == line
        assert statuses(database_url) == {"sent": 1, "pending": 1}
    finally:
        writer.dispose()
    assert len(drain(rabbit.url, queue, expect=1)) == 1
