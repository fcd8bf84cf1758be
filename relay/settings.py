"""Settings: one frozen object, read once from ``RELAY_*`` variables, an env file and options.

Every setting is declared once below, with its type, default and help text; the CLI's
options and ``--help`` are generated from the same declarations, so the environment
variable, the option and the documentation cannot drift apart.

Precedence: command-line option > environment variable > ``--env-file`` > default. The env
file has the systemd ``EnvironmentFile`` format (``RELAY_X=value`` lines), so one file
serves systemd, Kubernetes ConfigMaps rendered as env files, and local runs.

Secrets (the two URLs) can come from files, as Docker and Kubernetes secrets and systemd
credentials provide them: ``RELAY_AMQP_URL_FILE`` holds the whole URL, and
``RELAY_AMQP_PASSWORD_FILE`` only the password, put into the URL from the other settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Self
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

from relay.constants import (
    INBOX_DEDUPE_WINDOW_S,
    INBOX_IMMEDIATE_RETRIES,
    INBOX_MAX_ATTEMPTS,
    INBOX_PREFETCH,
    INBOX_RETRY_DELAY_MAX_S,
    INBOX_RETRY_DELAY_S,
    LINGER_S,
    MAX_MESSAGE_SIZE,
    POLL_INTERVAL_S,
    PROBE_IDLE_BACKOFF,
    PROBE_INTERVAL_S,
)
from relay.db.dialects import url_problem
from relay.errors import ConfigError
from relay.lease import margin_for
from relay.records import KEEP_IDS, KEEP_MESSAGES
from relay.redact import redact_url

ENV_PREFIX = "RELAY_"


def _number(convert: Callable[[str], Any], text: str, ok: Callable[[Any], bool], need: str) -> Any:
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"must be {need}")
    return value


def _positive_int(text: str) -> int:
    return int(_number(int, text, lambda v: v > 0, "a positive whole number"))


def _non_negative_int(text: str) -> int:
    return int(_number(int, text, lambda v: v >= 0, "a whole number, 0 or more"))


def _positive_float(text: str) -> float:
    return float(
        _number(float, text, lambda v: 0 < v < float("inf"), "a positive number of seconds")
    )


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmg])(i?)b?|b)?\s*", re.IGNORECASE)


def _size(text: str) -> int | None:
    """A number of bytes, with an optional unit (``64MiB``, ``500kB``); None if it is not."""
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    number, prefix, binary = match.groups()
    power = "kmg".index(prefix.lower()) + 1 if prefix else 0
    return int(float(number) * (1024 if binary else 1000) ** power)


_UNITS_HELP = "bytes, or a number with k, M, G, KiB, MiB or GiB"


def _byte_budget(text: str) -> int:
    """A size of at least 1 MiB."""
    need = f"a size of at least 1MiB ({_UNITS_HELP})"
    return int(_number(_size, text, lambda v: v >= 1024**2, need))


def _byte_size(text: str) -> int:
    """A size of at least one byte."""
    return int(_number(_size, text, lambda v: v >= 1, f"a positive size ({_UNITS_HELP})"))


def _seconds_or_zero(text: str) -> float:
    return float(
        _number(float, text, lambda v: 0 <= v < float("inf"), "0 or a positive number of seconds")
    )


def _port(text: str) -> int:
    need = "a port number from 0 to 65535 (0 turns the server off)"
    return int(_number(int, text, lambda v: 0 <= v <= 65535, need))


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.lower()

    return parse


def _flag(text: str) -> bool:
    value = text.lower()
    if value not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise ValueError("must be true or false")
    return value in ("true", "1", "yes", "on")


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def _url(*schemes: str) -> Callable[[str], str]:
    """A URL with one of ``schemes``. Database URLs are checked whole here (a bad port or
    host would otherwise surface as a traceback from the driver); AMQP URLs are checked by
    pika when the relay starts (``relay.broker.connection.connection_parameters``)."""

    def parse(text: str) -> str:
        scheme = text.split(":", 1)[0].split("+", 1)[0].lower()
        if "://" not in text or scheme not in schemes:
            raise ValueError(
                f"must be a URL starting with {' or '.join(s + '://' for s in schemes)}"
            )
        if scheme.startswith("amqp"):
            return text
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:  # "Port could not be cast...", "Invalid IPv6 URL"
            raise ValueError(f"is not a valid URL: {exc}") from None
        if (problem := url_problem(scheme, parts.path, parse_qs(parts.query))) is not None:
            raise ValueError(problem)
        return text

    return parse


def _amqp_urls(text: str) -> str:
    """One AMQP URL, or several separated by commas (one per node of a cluster), all with
    the same scheme: TLS settings apply to every node alike."""
    urls = [u.strip() for u in text.split(",")]
    if not all(urls):
        raise ValueError("must be AMQP URLs separated by commas, with none empty")
    for url in urls:
        _url("amqp", "amqps")(url)
    if len({u.split(":", 1)[0].lower() for u in urls}) > 1:
        raise ValueError("must use one scheme for every node: all amqp:// or all amqps://")
    return ",".join(urls)


def _setting(
    default: Any,
    parse: Callable[[str], Any],
    help: str,
    secret: bool = False,
    *,
    shown: str | None = None,
    see: str = "",
) -> Any:
    """A setting: its default, its parser, and its help (``relay run --help`` and the docs).
    ``shown``: the default as written in the help, when not its ``str``; ``see``: the docs
    page (and anchor) that says more, linked from the configuration page only."""
    metadata = {"parse": parse, "help": help, "secret": secret, "shown": shown, "see": see}
    return field(default=default, metadata=metadata)


class SettingDoc(NamedTuple):
    """A setting as ``--help`` and the configuration page show it."""

    name: str
    env: str
    default: str  # as shown; empty for none
    help: str
    see: str  # a docs page, with its anchor, or empty"""


@dataclass(frozen=True)
class TlsOptions:
    """How to check the broker (and present ourselves) over amqps://."""

    ca_file: Path | None
    cert_file: Path | None
    key_file: Path | None
    server_name: str | None


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class _FromEnvironment:
    """Loading from the environment, an env file and options, for a settings dataclass."""

    @classmethod
    def load(
        cls,
        environ: Mapping[str, str],
        overrides: Mapping[str, str] | None = None,
        env_file: Path | None = None,
    ) -> Self:
        """Build settings from an env file, the environment and option overrides (as text).
        Every ``RELAY_*`` variable must be a setting of the relay's or of the inbox's."""
        raw: dict[str, str] = {}
        if env_file is not None:
            raw.update(_read_env_file(env_file))
        raw.update({k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)})
        _reject_unknown(raw)
        for name, text in (overrides or {}).items():
            raw[env_name(name)] = text
        _read_secret_files(raw)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = env_name(f.name)
            if key in raw:
                kwargs[f.name] = _parse(f, raw[key])
        return cls(**kwargs)


@dataclass(frozen=True)
class Settings(_FromEnvironment):
    database_url: str = _setting(
        "sqlite:///outbox.db",
        _url("sqlite", "postgresql", "mysql", "mariadb"),
        "SQLAlchemy URL of the outbox database (postgresql://..., mysql://... or mariadb://... "
        "for MariaDB 10.6+ and MySQL 8.0.13+, or sqlite:///path). "
        "Refused at start: a URL whose host or port cannot be parsed, and in-memory SQLite "
        "(sqlite://, :memory:), where the relay and its writers would each see an outbox of "
        "their own.",
        secret=True,
    )
    amqp_url: str = _setting(
        "amqp://guest:guest@localhost:5672/%2F",
        _amqp_urls,
        "AMQP URL of the RabbitMQ broker; query options such as heartbeat= are honoured. For "
        "a cluster, one URL per node separated by commas: the relay uses one node at a time "
        "and moves on to the next when it loses it (a comma in a password is written %2C).",
        secret=True,
    )
    amqp_ca_file: Path | None = _setting(
        None,
        _optional_path,
        "CA certificates (PEM) that the broker's certificate must chain to, for amqps:// "
        "(default: the system's CAs).",
    )
    amqp_cert_file: Path | None = _setting(
        None, _optional_path, "Client certificate (PEM) for amqps://, if the broker asks for one."
    )
    amqp_key_file: Path | None = _setting(
        None, _optional_path, "Private key (PEM) of the client certificate."
    )
    amqp_server_name: str = _setting(
        "", str, "Name the broker's certificate must carry (default: the host in the URL)."
    )
    batch_size: int = _setting(500, _positive_int, "Most rows claimed in one database call.")
    window: int = _setting(
        1000, _positive_int, "Most published messages awaiting a confirm at once (memory bound)."
    )
    max_inflight_bytes: int = _setting(
        32 * 1024**2,
        _byte_budget,
        "Most payload bytes held at once: rows claimed, published and awaiting a confirm, "
        "until settled (64MiB, 500kB, ... accepted; at least 1MiB). A row larger than this "
        "goes out alone.",
        shown="32MiB",
        see="how-it-works.md#big-messages",
    )
    max_message_size: int = _setting(
        MAX_MESSAGE_SIZE,
        _byte_size,
        "Largest message the relay reads and publishes: payload and headers, in bytes (16MiB, "
        "500kB, ... accepted). A larger row is parked unread: its size is asked of the "
        "database, and its payload never fetched.",
        shown="16MiB",
        see="how-it-works.md#big-messages",
    )
    ordering: bool = _setting(
        False,
        _flag,
        "Publish rows that share an ordering key one at a time, in id order (rows without a "
        "key are not held back).",
    )
    cloudevents: bool = _setting(
        False,
        _flag,
        "Publish every message as a CloudEvent in binary mode: ce-id (the message id), "
        "ce-source, ce-type, ce-specversion and ce-time headers, the data's content type as "
        "the message's content type.",
        see="inbox.md#cloudevents-on-the-wire",
    )
    cloudevents_source: str = _setting(
        "/outbox-relay",
        str,
        "The ce-source of a CloudEvent whose row has no ce-source header (a URI-reference "
        "naming the producer). A row's ce-type header is its type, else its routing key.",
    )
    confirm_timeout: float = _setting(
        30.0,
        _positive_float,
        "Seconds without any answer from the broker after which unconfirmed rows are retried "
        "(a row waits at most twice this while later ones are confirmed).",
    )
    lease: float = _setting(
        120.0,
        _positive_float,
        "Seconds a relay's buckets of the outbox stay its own without a renewal (it renews "
        "them every few seconds); a dead relay's rows are another relay's after it. A relay "
        "claims and publishes only while more of its lease is left than a publish may take "
        "(RELAY_CONFIRM_TIMEOUT and a few seconds more): one that froze, was suspended or "
        "cannot renew stops before another may take over. Must be more than twice that.",
        see="how-it-works.md#a-relay-that-froze",
    )
    backoff_initial: float = _setting(
        1.0, _positive_float, "First retry delay in seconds after a nack, return or timeout."
    )
    backoff_max: float = _setting(
        300.0, _positive_float, "Longest retry delay in seconds for a row."
    )
    reconnect_max: float = _setting(
        30.0,
        _positive_float,
        "Longest wait in seconds between reconnects to the broker or database.",
    )
    max_attempts: int = _setting(
        10, _positive_int, "Failed attempts after which a row is parked with its last error."
    )
    poll_interval: float = _setting(
        POLL_INTERVAL_S,
        _positive_float,
        "Seconds between looks for due rows when the outbox is idle: how soon rows due again "
        "after a back-off go out, and a new row the probe missed (one that committed after "
        "a later row).",
    )
    probe_interval: float = _setting(
        PROBE_INTERVAL_S,
        _seconds_or_zero,
        "Seconds between looks at the outbox's newest id: how soon a new row goes out. Each "
        "look is one cheap query on a connection of its own; while nothing changes the looks "
        f"slow down to one every {PROBE_IDLE_BACKOFF} intervals. 0 turns the probe off, and "
        "new rows then wait for the poll.",
        see="how-it-works.md#finding-new-rows",
    )
    linger: float = _setting(
        LINGER_S,
        _seconds_or_zero,
        "Seconds a relay waits to gather rows into one claim, and outcomes into one settle, "
        "once it has caught up: a steady stream is then claimed and settled a few times a "
        "second whatever its rate, for at most this much more commit-to-ack time. A backlog "
        "is claimed and settled without waiting. 0 claims every new row at once.",
        see="how-it-works.md#a-live-stream",
    )
    drain_timeout: float = _setting(
        20.0,
        _positive_float,
        "Seconds to wait for outstanding confirms on SIGTERM/SIGINT before exiting.",
    )
    stats_interval: float = _setting(
        5.0, _positive_float, "Seconds between refreshes of the backlog gauges."
    )
    keep_sent: str = _setting(
        KEEP_IDS,
        _choice(KEEP_IDS, KEEP_MESSAGES),
        f"What stays of an acked row: '{KEEP_IDS}' moves its message id, id and times to the "
        f"sent log and deletes the row (cheapest); '{KEEP_MESSAGES}' keeps the whole row, "
        "marked sent, so that `relay replay --sent` can publish it again.",
        see="operations.md#how-the-outbox-is-cleaned",
    )
    retention: float = _setting(
        7 * 24 * 3600.0,
        _seconds_or_zero,
        "Seconds sent messages are kept (as the sent log's ids, or whole), and so the dedupe "
        "horizon: a message id written again within it adds nothing. The relay deletes older "
        "ones in chunks (0 keeps them forever).",
    )
    purge_interval: float = _setting(
        600.0, _positive_float, "Seconds between the relay's purges of old sent messages."
    )
    metrics_host: str = _setting("0.0.0.0", str, "Address for /metrics, /healthz and /readyz.")
    metrics_port: int = _setting(
        9840, _port, "Port for /metrics, /healthz and /readyz (0 turns the server off)."
    )
    topology_file: Path | None = _setting(
        None, _optional_path, "TOML file of exchanges, queues and bindings declared on connect."
    )
    name: str = _setting(
        "",
        str,
        "Name of this relay, unique among the relays of one outbox: the owner of its buckets, "
        "in logs and in the broker's connection list "
        "(default: hostname-pid).",
    )
    log_level: str = _setting("info", _choice("debug", "info", "warning", "error"), "Log level.")
    log_format: str = _setting(
        "text",
        _choice("text", "json"),
        "Log line format: text, or json (one object per line); every line has a stable "
        "action field.",
    )

    def __post_init__(self) -> None:
        margin = margin_for(self.confirm_timeout)
        if self.lease <= 2 * margin:
            raise ConfigError(
                f"{env_name('lease')}={self.lease:g} must be more than {2 * margin:g}: twice "
                f"what a publish may take with {env_name('confirm_timeout')}="
                f"{self.confirm_timeout:g} (the timeout, the watcher's look, the connection's "
                "close): a row's lease must outlive its confirm wait, or another relay could "
                "publish it meanwhile"
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


@dataclass(frozen=True)
class InboxSettings(_FromEnvironment):
    """An inbox consumer's own settings (``relay.inbox``); its database, broker and TLS are
    the relay's settings of the same names (``RELAY_DATABASE_URL``, ``RELAY_AMQP_URL``, ...)."""

    inbox_queue: str = _setting(
        "", str, "Queue the inbox consumer consumes (it must exist: declare it in the topology)."
    )
    inbox_consumer: str = _setting(
        "",
        str,
        "Name of the consumer, part of every key it keeps: consumers that share a database "
        "each process every message once under their own name (default: the queue's name).",
    )
    inbox_max_attempts: int = _setting(
        INBOX_MAX_ATTEMPTS,
        _positive_int,
        "Failed attempts at a message (its handler raised, or its consumer died while "
        "handling it) after which it is rejected without requeue, to the queue's dead-letter "
        "exchange.",
    )
    inbox_immediate_retries: int = _setting(
        INBOX_IMMEDIATE_RETRIES,
        _non_negative_int,
        "Failed attempts at a message retried at once (requeued) before the delayed ones.",
        see="inbox.md#retries",
    )
    inbox_retry_delay: float = _setting(
        INBOX_RETRY_DELAY_S,
        _positive_float,
        "Seconds before the first delayed retry of a failed message, doubling for each "
        "retry after it: the message waits in a retry queue of the broker's, not in the "
        "consumer.",
        see="inbox.md#retries",
    )
    inbox_retry_delay_max: float = _setting(
        INBOX_RETRY_DELAY_MAX_S,
        _positive_float,
        "Longest delay in seconds before a retry of a failed message.",
        see="inbox.md#retries",
    )
    inbox_prefetch: int = _setting(
        INBOX_PREFETCH,
        _positive_int,
        "Deliveries the broker sends ahead of the one being handled (basic.qos).",
    )
    inbox_dedupe_window: float = _setting(
        INBOX_DEDUPE_WINDOW_S,
        _seconds_or_zero,
        "Seconds a processed message's id is kept: a copy that comes within it is acked "
        "unprocessed, one that comes later is processed again. It must outlast every way a "
        "message can come again: the relay's RELAY_RETENTION (replays), and the broker's "
        "longest queueing (0 keeps ids forever).",
        shown="1209600 (14 days)",
        see="inbox.md#the-dedupe-window",
    )
    inbox_purge_interval: float = _setting(
        600.0, _positive_float, "Seconds between the consumer's purges of expired ids."
    )

    def __post_init__(self) -> None:
        if not self.inbox_queue:
            raise ConfigError(f"{env_name('inbox_queue')} must name the queue to consume")
        if not self.inbox_consumer:
            object.__setattr__(self, "inbox_consumer", self.inbox_queue)
        if self.inbox_retry_delay_max < self.inbox_retry_delay:
            raise ConfigError(
                f"{env_name('inbox_retry_delay_max')}={self.inbox_retry_delay_max:g} must be at "
                f"least {env_name('inbox_retry_delay')}={self.inbox_retry_delay:g}"
            )


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def known_env_names() -> list[str]:
    declared = [*dataclasses.fields(Settings), *dataclasses.fields(InboxSettings)]
    names = [env_name(f.name) for f in declared] + [ENV_FILE_VAR]
    return names + [n for f in _secret_fields() for n in _secret_file_vars(f.name)]


def _secret_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Settings) if f.metadata["secret"]]


def _secret_file_vars(field_name: str) -> tuple[str, str]:
    """(the file of the whole value, the file of only the URL's password)"""
    stem = field_name.removesuffix("_url")
    return env_name(field_name) + "_FILE", env_name(stem) + "_PASSWORD_FILE"


def _read_secret_files(raw: dict[str, str]) -> None:
    for f in _secret_fields():
        key = env_name(f.name)
        value_file, password_file = _secret_file_vars(f.name)
        if value_file in raw:
            if key in raw:
                raise ConfigError(f"set {key} or {value_file}, not both")
            raw[key] = _read_secret(value_file, raw.pop(value_file))
        if password_file in raw:
            password = _read_secret(password_file, raw.pop(password_file))
            raw[key] = _with_password(key, raw.get(key, str(f.default)), password)


def _read_secret(var: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"{var}={path}: cannot read: {reason}") from None


def _with_password(key: str, url: str, password: str) -> str:
    pieces = url.split(",")
    if len(pieces) > 1 and all("://" in piece for piece in pieces):  # a cluster: every node
        return ",".join(_with_password(key, piece.strip(), password) for piece in pieces)
    parts = urlsplit(url)
    if "://" not in url or not parts.username or parts.hostname is None:
        raise ConfigError(f"{key} must name a user and a host for a password file to apply")
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{quote(password, safe='')}@{host}"))


ENV_FILE_VAR = "RELAY_ENV_FILE"


@dataclass(frozen=True)
class TracingSettings:
    """Whether the relay traces, and how its spans leave: read from OpenTelemetry's standard
    variables (in the environment, never the relay's env file, so that every OpenTelemetry
    component in a pod reads the same). Everything else (endpoint, headers, sampler, service
    name, resource) the OpenTelemetry SDK reads from ``OTEL_*`` itself.

    Unlike the SDK's default (``otlp``), tracing is off unless ``OTEL_TRACES_EXPORTER`` asks
    for an exporter: a relay installed without a collector must not try to reach one.
    """

    exporter: str = "none"  # none, otlp, console
    protocol: str = "http/protobuf"  # for otlp: http/protobuf or grpc

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"

    @classmethod
    def load(cls, environ: Mapping[str, str]) -> TracingSettings:
        disabled = environ.get("OTEL_SDK_DISABLED", "").strip()
        try:
            if disabled and _flag(disabled):
                return cls()
        except ValueError as exc:
            raise ConfigError(f"OTEL_SDK_DISABLED={disabled!r}: {exc}") from None
        exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "none"
        if exporter not in _TRACE_EXPORTERS:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={exporter!r}: must be one of {', '.join(_TRACE_EXPORTERS)}"
            )
        for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            if protocol := environ.get(var, "").strip().lower():
                if protocol not in _OTLP_PROTOCOLS:
                    raise ConfigError(
                        f"{var}={protocol!r}: must be one of {', '.join(_OTLP_PROTOCOLS)}"
                    )
                return cls(exporter, protocol)
        return cls(exporter)


_TRACE_EXPORTERS = ("none", "otlp", "console")
# OpenTelemetry's Python exporters do not implement http/json.
_OTLP_PROTOCOLS = ("http/protobuf", "grpc")


def _parse(f: dataclasses.Field[Any], text: str) -> Any:
    try:
        return f.metadata["parse"](text.strip())
    except ValueError as exc:
        shown = "(hidden)" if f.metadata["secret"] else repr(text)
        raise ConfigError(f"{env_name(f.name)}={shown}: {exc}") from None


def _reject_unknown(raw: Mapping[str, str]) -> None:
    known = known_env_names()
    for name in raw:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{name}: unknown setting{hint}")


def _read_env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{ENV_FILE_VAR}={path}: cannot read: {exc.strerror}") from None
    out: dict[str, str] = {}
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{path}:{number}: expected NAME=value")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def describe(settings: type[Settings] | type[InboxSettings] = Settings) -> list[SettingDoc]:
    """Every setting of the relay's (or of ``settings``), for --help and the docs."""
    rows = []
    for f in dataclasses.fields(settings):
        default = f.default
        shown = f.metadata["shown"] or ("" if default in (None, "") else str(default))
        text = f.metadata["help"]
        if f.metadata["secret"]:
            whole, password = _secret_file_vars(f.name)
            text += f" Or from files: the URL [{whole}], or its password [{password}]."
        rows.append(SettingDoc(f.name, env_name(f.name), shown, text, f.metadata["see"]))
    return rows
