"""AMQPS: the relay publishes over TLS to a private RabbitMQ node with a TLS listener, with
certificates generated here (openssl); it checks the broker's certificate and name and
presents a client certificate. A wrong CA or name is a clear error and loses nothing."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.broker import drain, names, simple_topology
from devtools.servers import RabbitNode, free_port
from relay.errors import ConfigError
from relay.records import NewMessage
from relay.settings import Settings
from tests.support.inprocess import Running, enqueue, logged, rows_by_status, settings, wait_for

# Connects that fail before a broker failing the checks is found to have got nothing.
FAILED_CONNECTS = 3


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        key,
        "-out",
        cert,
    )
    return key, cert


def make_cert(directory: Path, name: str, ca: tuple[Path, Path], san: str) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", key, "-out", csr
    )
    ext = directory / f"{name}.ext"
    ext.write_text(f"subjectAltName = {san}\n")
    openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca[1],
        "-CAkey",
        ca[0],
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        ext,
        "-out",
        cert,
    )
    return key, cert


@dataclass(frozen=True)
class TlsBroker:
    node: RabbitNode
    tls_port: int
    ca: Path
    other_ca: Path
    client_cert: Path
    client_key: Path

    def url(self, host: str = "127.0.0.1") -> str:
        return f"amqps://guest:guest@{host}:{self.tls_port}/%2F"


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    certs = tmp_path_factory.mktemp("certs")
    ca = make_ca(certs, "relay-test-ca")
    other_ca = make_ca(certs, "someone-else-ca")
    server = make_cert(certs, "broker", ca, "IP:127.0.0.1, DNS:broker.test")
    client = make_cert(certs, "relay-client", ca, "DNS:relay-client")
    tls_port = free_port()
    config = (
        f"listeners.ssl.default = 127.0.0.1:{tls_port}\n"
        f"ssl_options.cacertfile = {ca[1]}\nssl_options.certfile = {server[1]}\n"
        f"ssl_options.keyfile = {server[0]}\nssl_options.verify = verify_peer\n"
        "ssl_options.fail_if_no_peer_cert = true\n"
    )
    node = RabbitNode(tmp_path_factory.mktemp("rabbit-tls"), name="relay-tls", config=config)
    node.start()
    yield TlsBroker(node, tls_port, ca[1], other_ca[1], client[1], client[0])
    node.stop()


def test_relay_publishes_over_tls_with_a_client_certificate(
    tls_broker: TlsBroker, sqlite_url: str
) -> None:
    exchange, queue = names("tls")
    s = settings(
        sqlite_url,
        tls_broker.url(),
        amqp_ca_file=tls_broker.ca,
        amqp_cert_file=tls_broker.client_cert,
        amqp_key_file=tls_broker.client_key,
    )

    async def scenario() -> None:
        async with Running(s, simple_topology(exchange, queue)) as parts:
            enqueue(parts, [NewMessage(f"m{i}".encode(), exchange, "k") for i in range(50)])
            await wait_for(lambda: rows_by_status(parts) == {"sent": 50}, 60, "50 rows sent")

    asyncio.run(scenario())
    # The test consumes over the plain listener of the same node.
    got = drain(tls_broker.node.url, queue, expect=50)
    assert sorted(d.body for d in got) == sorted(f"m{i}".encode() for i in range(50))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"amqp_ca_file": "other_ca"}, "CERTIFICATE_VERIFY_FAILED"),
        ({"amqp_server_name": "wrong.test"}, "Hostname mismatch"),
        ({"amqp_cert_file": None, "amqp_key_file": None}, "CERTIFICATE_REQUIRED"),
    ],
)
def test_a_broker_that_fails_the_checks_gets_nothing_and_the_log_says_why(
    tls_broker: TlsBroker,
    sqlite_url: str,
    change: dict[str, str | None],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    exchange, queue = names("tlsbad")
    values: dict[str, object] = {
        "amqp_ca_file": tls_broker.ca,
        "amqp_cert_file": tls_broker.client_cert,
        "amqp_key_file": tls_broker.client_key,
    }
    for key, value in change.items():
        values[key] = getattr(tls_broker, value) if value == "other_ca" else value
    s = settings(sqlite_url, tls_broker.url(), **{k: v for k, v in values.items() if v is not None})

    async def scenario() -> None:
        async with Running(s, simple_topology(exchange, queue)) as parts:
            enqueue(parts, [NewMessage(b"kept", exchange, "k") for _ in range(5)])
            # Connects failed, again after their back-off: the relay had its chances to send.
            await wait_for(
                lambda: len(logged(caplog, "broker_retry")) >= FAILED_CONNECTS,
                30,
                f"{FAILED_CONNECTS} failed connects",
            )
            assert rows_by_status(parts) == {"pending": 5}
            assert not parts.relay.ready()

    with caplog.at_level("WARNING"):
        asyncio.run(scenario())
    retries = [r.getMessage() for r in logged(caplog, "broker_retry")]
    # TLS 1.3 sends a missing certificate's alert after the client's handshake is done, and
    # the close can overtake it (an EOF): the reason is in the log once the alert is read.
    assert any(reason in m for m in retries), retries
    assert all("guest:guest" not in m for m in retries)


def test_unusable_tls_files_and_tls_settings_without_amqps_are_config_errors(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    from relay.broker.connection import connection_parameters

    with pytest.raises(ConfigError, match="set both RELAY_AMQP_CERT_FILE and RELAY_AMQP_KEY_FILE"):
        Settings.load({}, {"amqp_url": tls_broker.url(), "amqp_cert_file": "/x.pem"})
    with pytest.raises(ConfigError, match="RELAY_AMQP_CA_FILE is set but RELAY_AMQP_URL is not"):
        Settings.load({}, {"amqp_ca_file": str(tls_broker.ca)})
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate")
    for overrides, message in [
        ({"amqp_ca_file": str(tmp_path / "missing.pem")}, "RELAY_AMQP_CA_FILE=.*cannot use"),
        ({"amqp_ca_file": str(garbage)}, "RELAY_AMQP_CA_FILE=.*cannot use"),
        (
            {"amqp_cert_file": str(garbage), "amqp_key_file": str(garbage)},
            "RELAY_AMQP_CERT_FILE=.*cannot use",
        ),
    ]:
        s = Settings.load({}, {"amqp_url": tls_broker.url(), **overrides})
        with pytest.raises(ConfigError, match=message):
            connection_parameters(s.amqp_url, s.name, s.amqp_tls)
