"""The `relay` command as users run it: a subprocess, real servers, signals, HTTP scrapes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from relay.localservers import PostgresServer, RabbitNode, free_port, wait_until
from relay.schema import outbox
from relay.settings import known_env_names
from tests.integration.broker import declare_bound, drain, names

RELAY = [sys.executable, "-m", "relay"]


def relay(
    *args: str, env: dict[str, str], input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RELAY, *args], env=env, input=input, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def base_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(values)
    return env


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample in a Prometheus text exposition."""
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    raise AssertionError(f"{name} not exported")


def statuses(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        q = sa.select(outbox.c.status, sa.func.count()).group_by(outbox.c.status)
        out = {s: n for s, n in conn.execute(q)}
        leased = conn.execute(
            sa.select(sa.func.count()).where(
                outbox.c.status == "pending", outbox.c.lease_owner.is_not(None)
            )
        ).scalar()
    engine.dispose()
    out["leased"] = int(leased or 0)
    return out


def run_relay_until(env: dict[str, str], log: Path, done: Callable[[], bool], what: str) -> None:
    """`relay run` until ``done``, then SIGTERM: it must exit 0."""
    with log.open("w") as out:
        proc = subprocess.Popen([*RELAY, "run"], env=env, stderr=out)
        try:
            wait_until(done, 60, what)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_help_lists_every_setting_with_its_variable() -> None:
    result = relay("run", "--help", env=base_env())
    assert result.returncode == 0
    missing = [name for name in known_env_names() if f"[{name}]" not in result.stdout]
    assert missing == []
    for command in ("migrate", "enqueue"):
        text = relay(command, "--help", env=base_env()).stdout
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
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = relay(*args, env=base_env(**env))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"relay: error: {message}"), lines
    assert "hunter2" not in result.stderr


def test_unknown_option_exits_2() -> None:
    result = relay("run", "--no-such-option", env=base_env())
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_enqueue_rejects_a_bad_line_and_inserts_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    env = base_env(RELAY_DATABASE_URL=url)
    assert relay("migrate", env=env).returncode == 0
    lines = (
        '{"exchange": "x", "payload": "ok"}\n{"exchange": "x", "payload": "a", "headers": [1]}\n'
    )
    result = relay("enqueue", "--file", "-", env=env, input=lines)
    assert result.returncode == 2
    assert "relay: error: <stdin>:2: headers must be a JSON object" in result.stderr
    assert statuses(url) == {"leased": 0}
    ok = relay("enqueue", "--exchange", "x", "--header", "a=b", "hello", env=env)
    assert ok.returncode == 0 and statuses(url) == {"pending": 1, "leased": 0}


def test_migrate_on_an_unreachable_database_fails_clearly() -> None:
    port = free_port()
    url = f"postgresql://relay:topsecret@127.0.0.1:{port}/outbox"
    result = relay("migrate", env=base_env(RELAY_DATABASE_URL=url))
    assert result.returncode == 1
    assert "relay: error: migrate on postgresql://relay:***@127.0.0.1" in result.stderr
    assert "topsecret" not in result.stderr and "Traceback" not in result.stderr


def test_relay_run_relays_serves_metrics_and_drains_on_sigterm(
    tmp_path: Path, rabbit: RabbitNode
) -> None:
    exchange, queue = names("e2e")
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    topology = tmp_path / "topology.toml"
    topology.write_text(
        f'[[exchange]]\nname = "{exchange}"\ntype = "topic"\n\n[[queue]]\nname = "{queue}"\n\n'
        f'[[binding]]\nexchange = "{exchange}"\nqueue = "{queue}"\nrouting_key = "#"\n'
    )
    port = free_port()
    env = base_env(
        RELAY_DATABASE_URL=url, RELAY_AMQP_URL=rabbit.url, RELAY_TOPOLOGY_FILE=str(topology),
        RELAY_METRICS_PORT=str(port), RELAY_METRICS_HOST="127.0.0.1", RELAY_POLL_INTERVAL="0.05",
        RELAY_STATS_INTERVAL="0.2", RELAY_LOG_FORMAT="json",
    )  # fmt: skip
    assert relay("migrate", env=env).returncode == 0

    def enqueue(start: int, count: int) -> None:
        lines = "".join(
            json.dumps({"exchange": exchange, "routing_key": "k", "payload": {"n": i},
                        "message_id": f"id-{i}"}) + "\n"
            for i in range(start, start + count)
        )  # fmt: skip
        result = relay("enqueue", "--file", "-", env=env, input=lines)
        assert result.returncode == 0, result.stderr

    enqueue(0, 500)
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "relay.log").open("w") as log:
        proc = subprocess.Popen([*RELAY, "run"], env=env, stderr=log)
        try:
            wait_until(lambda: http_get(base + "/readyz")[0] == 200, 60, "/readyz")
            assert http_get(base + "/healthz")[0] == 200
            wait_until(lambda: 'relay_outcomes_total{outcome="acked"} 500.0' in http_get(base + "/metrics")[1],
                       60, "500 acks on /metrics")  # fmt: skip
            text = http_get(base + "/metrics")[1]
            assert metric(text, "relay_published_total") == 500
            assert metric(text, "relay_broker_connected") == 1
            assert metric(text, "relay_confirm_latency_seconds_count") == 500
            enqueue(500, 5000)
            wait_until(lambda: metric(http_get(base + "/metrics")[1], "relay_in_flight") > 0, 30,
                       "publishing under way")  # fmt: skip
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    logged = (tmp_path / "relay.log").read_text()
    assert "Traceback" not in logged
    actions = [json.loads(line)["action"] for line in logged.splitlines()]
    assert "drained" in actions
    after_stop = statuses(url)
    assert after_stop["leased"] == 0, "rows left under this relay's lease"
    assert after_stop.get("sent", 0) + after_stop.get("pending", 0) == 5500
    # A restarted relay sends what the first one did not.
    run_relay_until(env, tmp_path / "relay2.log", lambda: statuses(url).get("sent") == 5500,
                    "every row sent by the second relay")  # fmt: skip
    delivered = {d.message_id for d in drain(rabbit.url, queue, expect=5500, timeout=60)}
    assert delivered == {f"id-{i}" for i in range(5500)}


def test_relay_run_purges_old_sent_rows_when_retention_is_set(
    tmp_path: Path, rabbit: RabbitNode
) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    env = base_env(RELAY_DATABASE_URL=url, RELAY_AMQP_URL=rabbit.url, RELAY_METRICS_PORT="0",
                   RELAY_RETENTION="86400", RELAY_PURGE_INTERVAL="0.2", RELAY_LOG_FORMAT="json")  # fmt: skip
    assert relay("migrate", env=env).returncode == 0
    now = datetime.now(UTC)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.insert(outbox), [
            {"message_id": f"old-{i}", "payload": b"p", "status": status, "sent_at": sent}
            for i, (status, sent) in enumerate(
                [("sent", now - timedelta(days=2))] * 3 + [("sent", now - timedelta(hours=1)),
                 ("parked", None)])
        ])  # fmt: skip
    engine.dispose()
    run_relay_until(env, tmp_path / "relay.log", lambda: statuses(url).get("sent") == 1,
                    "old sent rows purged")  # fmt: skip
    assert statuses(url) == {"sent": 1, "parked": 1, "leased": 0}
    logged = [json.loads(line) for line in (tmp_path / "relay.log").read_text().splitlines()]
    assert any(e["action"] == "purge" and e["message"] == "purged 3 sent rows" for e in logged)


def test_on_postgresql_a_committed_row_wakes_the_relay_without_polling(
    tmp_path: Path, rabbit: RabbitNode, postgres: PostgresServer, postgresql_url: str
) -> None:
    """The relay polls once an hour here: only the trigger's NOTIFY can make it look."""
    exchange, queue = names("notify")
    declare_bound(rabbit.url, exchange, queue)
    port = free_port()
    env = base_env(RELAY_DATABASE_URL=postgresql_url, RELAY_AMQP_URL=rabbit.url,
                   RELAY_POLL_INTERVAL="3600", RELAY_METRICS_HOST="127.0.0.1",
                   RELAY_METRICS_PORT=str(port), RELAY_LOG_FORMAT="json")  # fmt: skip
    database = sa.make_url(postgresql_url).database or ""
    with (tmp_path / "relay.log").open("w") as log:
        proc = subprocess.Popen([*RELAY, "run"], env=env, stderr=log)
        try:
            wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, "ready")
            for n in range(3):  # a plain INSERT, as any writer (or Spark's JDBC) does it
                postgres.psql(f"INSERT INTO outbox (exchange, payload) VALUES ('{exchange}', "
                              f"'row {n}')", database=database)  # fmt: skip
                wait_until(lambda n=n: statuses(postgresql_url).get("sent") == n + 1, 30,
                           f"row {n} sent after its NOTIFY")  # fmt: skip
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "Traceback" not in (tmp_path / "relay.log").read_text()
    assert len(drain(rabbit.url, queue, expect=3)) == 3
