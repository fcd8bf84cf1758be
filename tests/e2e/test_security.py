"""Secrets and least privilege, with `relay` as users run it (subprocesses, real servers).

- Passwords read from files (RELAY_*_PASSWORD_FILE) are used (RabbitMQ checks its user's
  password) and never appear in logs (at debug level), --help, error messages or /metrics.
- The relay works with a RabbitMQ user that may only write to its exchange, and a database
  role with the relay's grants only (``relay.db.roles``); `relay enqueue` with the writer's
  (INSERT on the outbox). What they may not do, they cannot.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
import sqlalchemy as sa

from devtools.broker import declare_bound, drain, names
from devtools.outbox import owners, statuses
from devtools.relayproc import relay, relay_env, run_relay_until
from devtools.scrape import http_get
from devtools.servers import PostgresServer, RabbitNode, ServerError, free_port
from relay.db.roles import RELAY, WRITER, grants


@pytest.fixture
def amqp_user(rabbit: RabbitNode) -> Iterator[tuple[str, str]]:
    """A RabbitMQ user with a random password; the test sets its permissions."""
    user, password = f"relay-{uuid.uuid4().hex[:6]}", f"amqp-{uuid.uuid4().hex}"
    rabbit.ctl("add_user", user, password)
    yield user, password
    rabbit.ctl("delete_user", user)


def db_role(postgres: PostgresServer, url: str, *roles: str) -> tuple[str, str]:
    """A new login with the grants of ``roles`` (``relay.db.roles``, as the docs list them)."""
    name, password = f"r_{uuid.uuid4().hex[:8]}", f"db-{uuid.uuid4().hex}"
    database = sa.make_url(url).database or ""
    postgres.psql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    for role in roles:
        postgres.psql("; ".join(grants("postgresql", role, name)), database=database)
    return name, password


def role_url(postgres: PostgresServer, url: str, role: str) -> str:
    return f"postgresql://{role}@127.0.0.1:{postgres.port}/{sa.make_url(url).database}"


def test_passwords_from_files_never_show(
    tmp_path: Path,
    rabbit: RabbitNode,
    postgres: PostgresServer,
    postgresql_url: str,
    amqp_user: tuple[str, str],
) -> None:
    user, amqp_password = amqp_user
    rabbit.ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
    role, db_password = db_role(postgres, postgresql_url, RELAY, WRITER)
    (tmp_path / "amqp").write_text(amqp_password + "\n")
    (tmp_path / "db").write_text(db_password + "\n")
    exchange, queue = names("secret")
    declare_bound(rabbit.url, exchange, queue)
    port = free_port()
    env = relay_env(
        RELAY_DATABASE_URL=role_url(postgres, postgresql_url, role),
        RELAY_DATABASE_PASSWORD_FILE=str(tmp_path / "db"),
        RELAY_AMQP_URL=f"amqp://{user}@127.0.0.1:{rabbit.port}/%2F",
        RELAY_AMQP_PASSWORD_FILE=str(tmp_path / "amqp"),
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_METRICS_PORT=str(port),
        RELAY_LOG_LEVEL="debug",
        RELAY_LOG_FORMAT="json",
        RELAY_POLL_INTERVAL="0.05",
    )
    shown: list[str] = []
    for args in (["run", "--help"], ["status", "--help"]):
        shown.append(relay(*args, env=env).stdout)
    enqueued = relay("enqueue", "--exchange", exchange, "--routing-key", "k", "hello", env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    shown.append(enqueued.stderr)

    def sent_and_scraped() -> bool:
        status, text = http_get(f"http://127.0.0.1:{port}/metrics")
        shown.append(text)
        return status == 200 and statuses(postgresql_url).get("sent") == 1

    assert run_relay_until(env, tmp_path / "relay.log", sent_and_scraped, "the row sent") == 0
    shown.append((tmp_path / "relay.log").read_text())
    assert json.loads(shown[-1].splitlines()[0])["action"] == "start"  # the JSON log is real
    assert len(drain(rabbit.url, queue, expect=1)) == 1  # the AMQP password from the file worked

    # Errors: a refused password, an unreachable database, a malformed URL.
    (tmp_path / "wrong").write_text("not-the-password-" + amqp_password)
    refused = {**env, "RELAY_AMQP_PASSWORD_FILE": str(tmp_path / "wrong")}
    log = tmp_path / "refused.log"
    assert (
        run_relay_until(refused, log, lambda: "ACCESS_REFUSED" in log.read_text(), "a refusal") == 0
    )
    shown.append(log.read_text())
    gone = {**env, "RELAY_DATABASE_URL": f"postgresql://{role}@127.0.0.1:{free_port()}/x"}
    failed = relay("status", env=gone)
    assert failed.returncode == 1 and "***" in failed.stderr
    shown.append(failed.stderr)
    bad_url = {**env, "RELAY_AMQP_URL_FILE": str(tmp_path / "db")}
    del bad_url["RELAY_AMQP_URL"], bad_url["RELAY_AMQP_PASSWORD_FILE"]
    bad = relay("run", env=bad_url)
    assert bad.returncode == 2 and "RELAY_AMQP_URL=(hidden)" in bad.stderr
    shown.append(bad.stderr)

    everything = "\n".join(shown)
    assert amqp_password not in everything and db_password not in everything


def test_relay_runs_with_least_privilege(
    tmp_path: Path,
    rabbit: RabbitNode,
    postgres: PostgresServer,
    postgresql_url: str,
    amqp_user: tuple[str, str],
) -> None:
    exchange, queue = names("least")
    forbidden, _ = names("forbidden")
    declare_bound(rabbit.url, exchange, queue)
    declare_bound(rabbit.url, forbidden, names("forbidden")[1])
    user, amqp_password = amqp_user
    # Write to its one exchange; configure and read nothing (no topology file).
    rabbit.ctl("set_permissions", "-p", "/", user, "^$", f"^{exchange}$", "^$")
    database = sa.make_url(postgresql_url).database or ""
    runner, _ = db_role(postgres, postgresql_url, RELAY)
    writer, _ = db_role(postgres, postgresql_url, WRITER)

    writer_env = relay_env(RELAY_DATABASE_URL=role_url(postgres, postgresql_url, writer))
    lines = "".join(
        json.dumps({"exchange": x, "routing_key": "k", "payload": f"{x}-{i}"}) + "\n"
        for x in (exchange, forbidden)
        for i in range(20)
    )
    enqueued = relay("enqueue", "--file", "-", env=writer_env, input=lines)
    assert enqueued.returncode == 0, enqueued.stderr

    env = relay_env(
        RELAY_DATABASE_URL=role_url(postgres, postgresql_url, runner),
        RELAY_AMQP_URL=f"amqp://{user}:{amqp_password}@127.0.0.1:{rabbit.port}/%2F",
        RELAY_METRICS_PORT="0",
        RELAY_POLL_INTERVAL="0.05",
        RELAY_BACKOFF_INITIAL="0.05",
        RELAY_BACKOFF_MAX="0.1",
        RELAY_RECONNECT_MAX="0.5",
        RELAY_MAX_ATTEMPTS="2",
        RELAY_LOG_FORMAT="json",
    )
    assert (
        run_relay_until(
            env,
            tmp_path / "relay.log",
            lambda: statuses(postgresql_url) == {"sent": 20, "parked": 20},
            "20 rows sent and 20 parked",
        )
        == 0
    )
    assert owners(postgresql_url) == {}, "buckets kept after the stop"
    # Each channel the forbidden rows close loses the confirms of good rows published on
    # it: those are published again (at least once, never lost).
    bodies = {d.body for d in drain(rabbit.url, queue, expect=20)}
    assert bodies == {f"{exchange}-{i}".encode() for i in range(20)}
    engine = sa.create_engine(postgresql_url)
    with engine.connect() as conn:
        reasons = set(
            conn.scalars(sa.text("SELECT last_error FROM outbox WHERE status = 'parked'"))
        )
    engine.dispose()
    assert len(reasons) == 1 and "403" in reasons.pop()
    assert "Traceback" not in (tmp_path / "relay.log").read_text()

    # What the roles may not do, they cannot.
    for role, sql in [
        (runner, "INSERT INTO outbox (payload) VALUES ('x')"),
        (writer, "DELETE FROM outbox"),
        (writer, "SELECT id FROM outbox"),
        (writer, "SELECT * FROM outbox_sent_log"),
        (runner, "ALTER TABLE outbox ADD COLUMN x int"),
    ]:
        with pytest.raises(ServerError, match=r"permission denied|must be owner"):
            postgres.psql(f"SET ROLE {role}; {sql}", database=database)
    with (
        pika.BlockingConnection(pika.URLParameters(env["RELAY_AMQP_URL"])) as conn,
        pytest.raises(pika.exceptions.ChannelClosedByBroker, match="ACCESS_REFUSED"),
    ):
        conn.channel().exchange_declare(f"{exchange}.new", "topic")
