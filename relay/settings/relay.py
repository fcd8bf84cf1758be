"""The relay's settings (``relay run``, and the admin commands' database and broker)."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.constants import (
    LINGER_S,
    MAX_MESSAGE_SIZE,
    POLL_INTERVAL_S,
    PROBE_IDLE_BACKOFF,
    PROBE_INTERVAL_S,
)
from relay.errors import ConfigError
from relay.lease import longest_confirm_timeout, margin_for
from relay.records import KEEP_IDS, KEEP_MESSAGES
from relay.redact import redact_url
from relay.settings.parse import (
    FromEnvironment,
    amqp_urls,
    byte_budget,
    byte_size,
    choice,
    env_name,
    flag,
    optional_path,
    port,
    positive_float,
    positive_int,
    scheme_url,
    seconds_or_zero,
    setting,
)


@dataclass(frozen=True)
class TlsOptions:
    """How to check the broker (and present ourselves) over amqps://."""

    ca_file: Path | None
    cert_file: Path | None
    key_file: Path | None
    server_name: str | None


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Settings(FromEnvironment):
    database_url: str = setting(
        "sqlite:///outbox.db",
        scheme_url("sqlite", "postgresql", "mysql", "mariadb"),
        "SQLAlchemy URL of the outbox database (postgresql://..., mysql://... or mariadb://... "
        "for MariaDB 10.6+ and MySQL 8.0.13+, or sqlite:///path). "
        "Refused at start: a URL whose host or port cannot be parsed, and in-memory SQLite "
        "(sqlite://, :memory:), where the relay and its writers would each see an outbox of "
        "their own.",
        secret=True,
    )
    amqp_url: str = setting(
        "amqp://guest:guest@localhost:5672/%2F",
        amqp_urls,
        "AMQP URL of the RabbitMQ broker; query options such as heartbeat= are honoured. For "
        "a cluster, one URL per node separated by commas: the relay uses one node at a time "
        "and moves on to the next when it loses it (a comma in a password is written %2C).",
        secret=True,
    )
    amqp_ca_file: Path | None = setting(
        None,
        optional_path,
        "CA certificates (PEM) that the broker's certificate must chain to, for amqps:// "
        "(default: the system's CAs).",
    )
    amqp_cert_file: Path | None = setting(
        None, optional_path, "Client certificate (PEM) for amqps://, if the broker asks for one."
    )
    amqp_key_file: Path | None = setting(
        None, optional_path, "Private key (PEM) of the client certificate."
    )
    amqp_server_name: str = setting(
        "", str, "Name the broker's certificate must carry (default: the host in the URL)."
    )
    batch_size: int = setting(500, positive_int, "Most rows claimed in one database call.")
    window: int = setting(
        1000, positive_int, "Most published messages awaiting a confirm at once (memory bound)."
    )
    max_inflight_bytes: int = setting(
        32 * 1024**2,
        byte_budget,
        "Most payload bytes held at once: rows claimed, published and awaiting a confirm, "
        "until settled (64MiB, 500kB, ... accepted; at least 1MiB). A row larger than this "
        "goes out alone.",
        shown="32MiB",
        see="how-it-works.md#big-messages",
    )
    max_message_size: int = setting(
        MAX_MESSAGE_SIZE,
        byte_size,
        "Largest message the relay reads and publishes: payload and headers, in bytes (16MiB, "
        "500kB, ... accepted). A larger row is parked unread: its size is asked of the "
        "database, and its payload never fetched.",
        shown="16MiB",
        see="how-it-works.md#big-messages",
    )
    ordering: bool = setting(
        False,
        flag,
        "Publish rows that share an ordering key one at a time, in id order (rows without a "
        "key are not held back).",
    )
    cloudevents: bool = setting(
        False,
        flag,
        "Publish every message as a CloudEvent in binary mode: ce-id (the message id), "
        "ce-source, ce-type, ce-specversion and ce-time headers, the data's content type as "
        "the message's content type.",
        see="inbox.md#cloudevents-on-the-wire",
    )
    cloudevents_source: str = setting(
        "/outbox-relay",
        str,
        "The ce-source of a CloudEvent whose row has no ce-source header (a URI-reference "
        "naming the producer). A row's ce-type header is its type, else its routing key.",
    )
    confirm_timeout: float = setting(
        30.0,
        positive_float,
        "Seconds without any answer from the broker after which unconfirmed rows are retried "
        "(a row waits at most twice this while later ones are confirmed).",
    )
    lease: float = setting(
        120.0,
        positive_float,
        "Seconds a relay's buckets of the outbox stay its own without a renewal (it renews "
        "them every few seconds); a dead relay's rows are another relay's after it. A relay "
        "claims and publishes only while more of its lease is left than a publish may take "
        "(RELAY_CONFIRM_TIMEOUT and a few seconds more): one that froze, was suspended or "
        "cannot renew stops before another may take over. Must be more than twice that.",
        see="how-it-works.md#a-relay-that-froze",
    )
    backoff_initial: float = setting(
        1.0, positive_float, "First retry delay in seconds after a nack, return or timeout."
    )
    backoff_max: float = setting(300.0, positive_float, "Longest retry delay in seconds for a row.")
    reconnect_max: float = setting(
        30.0,
        positive_float,
        "Longest wait in seconds between reconnects to the broker or database.",
    )
    max_attempts: int = setting(
        10, positive_int, "Failed attempts after which a row is parked with its last error."
    )
    poll_interval: float = setting(
        POLL_INTERVAL_S,
        positive_float,
        "Seconds between looks for due rows when the outbox is idle: how soon rows due again "
        "after a back-off go out, and a new row the probe missed (one that committed after "
        "a later row).",
    )
    probe_interval: float = setting(
        PROBE_INTERVAL_S,
        seconds_or_zero,
        "Seconds between looks at the outbox's newest id: how soon a new row goes out. Each "
        "look is one cheap query on a connection of its own; while nothing changes the looks "
        f"slow down to one every {PROBE_IDLE_BACKOFF} intervals. 0 turns the probe off, and "
        "new rows then wait for the poll.",
        see="how-it-works.md#finding-new-rows",
    )
    linger: float = setting(
        LINGER_S,
        seconds_or_zero,
        "Seconds a relay waits to gather rows into one claim, and outcomes into one settle, "
        "once it has caught up: a steady stream is then claimed and settled a few times a "
        "second whatever its rate, for at most this much more commit-to-ack time. A backlog "
        "is claimed and settled without waiting. 0 claims every new row at once.",
        see="how-it-works.md#a-live-stream",
    )
    drain_timeout: float = setting(
        20.0,
        positive_float,
        "Seconds to wait for outstanding confirms on SIGTERM/SIGINT before exiting.",
    )
    stats_interval: float = setting(
        5.0, positive_float, "Seconds between refreshes of the backlog gauges."
    )
    keep_sent: str = setting(
        KEEP_IDS,
        choice(KEEP_IDS, KEEP_MESSAGES),
        f"What stays of an acked row: '{KEEP_IDS}' moves its message id, id and times to the "
        f"sent log and deletes the row (cheapest); '{KEEP_MESSAGES}' keeps the whole row, "
        "marked sent, so that `relay replay --sent` can publish it again.",
        see="operations.md#how-the-outbox-is-cleaned",
    )
    retention: float = setting(
        7 * 24 * 3600.0,
        seconds_or_zero,
        "Seconds sent messages are kept (as the sent log's ids, or whole), and so the dedupe "
        "horizon: a message id written again within it adds nothing. The relay deletes older "
        "ones in chunks (0 keeps them forever).",
    )
    purge_interval: float = setting(
        600.0, positive_float, "Seconds between the relay's purges of old sent messages."
    )
    metrics_host: str = setting("0.0.0.0", str, "Address for /metrics, /healthz and /readyz.")
    metrics_port: int = setting(
        9840, port, "Port for /metrics, /healthz and /readyz (0 turns the server off)."
    )
    topology_file: Path | None = setting(
        None, optional_path, "TOML file of exchanges, queues and bindings declared on connect."
    )
    name: str = setting(
        "",
        str,
        "Name of this relay, unique among the relays of one outbox: the owner of its buckets, "
        "in logs and in the broker's connection list "
        "(default: hostname-pid).",
    )
    log_level: str = setting("info", choice("debug", "info", "warning", "error"), "Log level.")
    log_format: str = setting(
        "text",
        choice("text", "json"),
        "Log line format: text, or json (one object per line); every line has a stable "
        "action field.",
    )

    def __post_init__(self) -> None:
        margin = margin_for(self.confirm_timeout)
        if self.lease <= 2 * margin:
            # The release before asked only for a lease over twice the timeout: say what
            # to set (a whole lease, a timeout cut to hundredths, both on the safe side).
            shorter = math.floor(longest_confirm_timeout(self.lease) * 100) / 100
            raise ConfigError(
                f"{env_name('lease')}={self.lease:g} must be more than {2 * margin:g}: twice "
                f"what a publish may take with {env_name('confirm_timeout')}="
                f"{self.confirm_timeout:g} (the timeout, the watcher's look, the connection's "
                "close): a row's lease must outlive its confirm wait, or another relay could "
                f"publish it meanwhile; set {env_name('lease')} to "
                f"{math.floor(2 * margin) + 1} or more, or {env_name('confirm_timeout')} "
                f"below {shorter:g}"
            )
        if self.backoff_max < self.backoff_initial:
            raise ConfigError(
                f"{env_name('backoff_max')} must not be less than {env_name('backoff_initial')}"
            )
        if (self.amqp_cert_file is None) != (self.amqp_key_file is None):
            raise ConfigError(
                f"set both {env_name('amqp_cert_file')} and {env_name('amqp_key_file')}, or neither"
            )
        tls = ("amqp_ca_file", "amqp_cert_file", "amqp_key_file", "amqp_server_name")
        if not self.amqp_url.lower().startswith("amqps://"):
            for name in tls:
                if getattr(self, name):
                    raise ConfigError(
                        f"{env_name(name)} is set but {env_name('amqp_url')} is not an "
                        "amqps:// URL: TLS settings would be ignored"
                    )
        if self.cloudevents and not self.cloudevents_source:
            raise ConfigError(f"{env_name('cloudevents_source')} must not be empty")
        if not self.name:
            object.__setattr__(self, "name", default_name())

    @property
    def amqp_urls(self) -> tuple[str, ...]:
        """The broker's nodes, in the order the relay tries them."""
        return tuple(self.amqp_url.split(","))

    @property
    def amqp_tls(self) -> TlsOptions | None:
        if not self.amqp_url.lower().startswith("amqps://"):
            return None
        return TlsOptions(
            self.amqp_ca_file,
            self.amqp_cert_file,
            self.amqp_key_file,
            self.amqp_server_name or None,
        )

    def redacted(self) -> dict[str, Any]:
        """The settings with passwords removed from secret URLs, safe to log."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = redact_url(value) if f.metadata["secret"] else value
        return out
